"""Client service config: a deadline on every method, retries only on idempotent ones."""

import json

import pytest

from trace_common.grpc.client import SERVICES, channel_options, service_config

NEVER_RETRIED = {"Generate", "GenerateStream", "ResetEpisode", "StepEpisode", "CloseEpisode", "LoadComposition",
                 "UnloadComposition"}


def _configs():
    out = {}
    for cfg in service_config()["methodConfig"]:
        for name in cfg["name"]:
            out[(name["service"], name["method"])] = cfg
    return out


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_method_has_a_deadline_and_safe_retries(service):
    pb2, _g, _stub, full = SERVICES[service]
    desc = pb2.DESCRIPTOR.services_by_name[full.rsplit(".", 1)[1]]
    cfgs = _configs()
    assert len(desc.methods) >= 4
    for m in desc.methods:
        cfg = cfgs[(full, m.name)]
        assert float(cfg["timeout"].rstrip("s")) > 0
        if m.name in NEVER_RETRIED:
            assert "retryPolicy" not in cfg, m.name
        if m.name.startswith(("Get", "List", "Watch")):
            assert cfg["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"], m.name


def test_channel_options_carry_service_config():
    opts = dict(channel_options())
    assert opts["grpc.enable_retries"] == 1
    assert json.loads(opts["grpc.service_config"]) == service_config()
