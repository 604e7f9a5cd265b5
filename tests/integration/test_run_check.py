"""`tracectl run --check` of a cluster config from a machine with no cluster (tracectl/run/preflight.py):
the offline checks pass through services embedded in the process, every network check whose
address does not resolve or answer is listed as skipped (exit 0), a broken section is still exit 2
naming the field, and whatever of a deployment is reachable is checked for real: services'
health and their own config checks, an HTTP endpoint, a listener that is not a TRACE service."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest
import yaml

from tests.support.ports import closed_port
from tracectl.cli import main

REPO = Path(__file__).resolve().parents[2]
CLUSTER = yaml.safe_load((REPO / "examples" / "tau2-retail-vllm.yaml").read_text())
SERVICES = ("analysis", "environment", "inference", "rollout", "trainer")


def _write(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _changed(cfg: dict, dotted: str, value) -> dict:
    out = json.loads(json.dumps(cfg))
    *path, last = dotted.split(".")
    node = out
    for key in path:
        node = node[key]
    node[last] = value
    return out


def _outcomes(out: str) -> dict[str, str]:
    """'what (address)' -> outcome, from --check's network lines."""
    rows = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0] in ("ok", "skipped", "failed"):
            rows[parts[1].split(" (")[0]] = parts[0]
    return rows


def test_a_cluster_config_checks_offline_and_skips_the_cluster(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--config", str(_write(tmp_path, CLUSTER)), "--check"]) == 0
    out = capsys.readouterr().out
    assert "valid run config (checked offline: every section, endpoint profiles, target.env, training.grpo" in out
    assert "gates.config" in out
    rows = _outcomes(out)
    assert rows == {"store": "skipped", **{f"service {s}": "skipped" for s in SERVICES},
                    "LLM endpoint target.user_simulator": "skipped", "target.uri": "skipped"}
    assert "does not resolve from here" in out and "8 network check(s) skipped" in out
    assert not (tmp_path / ".trace").exists()


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("training.grpo.learning_rate", -1.0, "training.grpo.learning_rate"),     # the trainer's own models
    ("gates.config.max_stepz", 3, "gates.config.max_stepz"),                   # a typo, with the closest name
    ("evaluation.arms", ["base", "trace_routng"], "evaluation.arms"),          # the run config's schema
    ("target.env", "tau2-retial", "target.env"),                               # the embedded rollout's list
])
def test_a_broken_section_of_a_cluster_config_is_still_exit_2(tmp_path, monkeypatch, capsys, field, value,
                                                              fragment):
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--config", str(_write(tmp_path, _changed(CLUSTER, field, value))), "--check"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert fragment in err and "Traceback" not in out + err


class _Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b'{"data": [{"id": "m"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


#: CLUSTER's adapter training without its vLLM rollouts (the suite's stack has no vLLM server).
IN_PROCESS = {k: v for k, v in CLUSTER["training"]["grpo"].items() if k not in ("rollout_backend", "vllm")}


def _deployment(embedded_stack, url: str, grpo: dict, executor: str = "kubernetes") -> dict:
    """CLUSTER pointed at the suite's stack as the deployment, `url` the user simulator it calls."""
    return {**CLUSTER, "services": dict(embedded_stack.targets),
            "store": {"root": "s3://trace-artifacts", "s3_endpoint": f"127.0.0.1:{closed_port()}"},
            "target": {"env": "store", "user_simulator": {"base_url": url, "model": "m"}},
            "base_agent": {"name": "micro"}, "analysis": {"mode": "diagnostics"}, "environments": {"mode": "library"},
            "training": {**CLUSTER["training"], "grpo": grpo, "executor": executor},
            "evaluation": {"split": "test", "limit": 4, "arms": ["base", "trace_routing"]},
            "max_completion_length": {"tokens": 64, "reason": "a cap for this test only"}}


def test_what_of_a_deployment_is_reachable_is_checked(tmp_path, monkeypatch, capsys, embedded_stack):
    """The five services reachable (the suite's stack): healthy, and their own checks pass; an HTTP
    endpoint answers; a store port with nothing behind it is skipped, not failed."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    monkeypatch.chdir(tmp_path)
    try:
        code = main(["run", "--config", str(_write(tmp_path, _deployment(embedded_stack, url, IN_PROCESS))),
                     "--check"])
    finally:
        server.shutdown()
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    rows = _outcomes(out)
    assert rows == {"store": "skipped", **{f"service {s}": "ok" for s in SERVICES},
                    "LLM endpoint target.user_simulator": "ok", "deployed services' own checks": "ok"}, out
    assert "HTTP 200 from /models" in out and "Connection refused" in out


def test_a_deployed_trainer_checks_vllm_rollouts_against_its_own_settings(tmp_path, monkeypatch, capsys,
                                                                           embedded_stack):
    """A reached trainer without CLUSTER's endpoint profile refuses its vLLM rollouts, as it would
    refuse the jobs (the offline pass, whose embedded stand-in parses the fields only, lets them
    through: the first test). The local executor here: the suite's trainer has no Job image."""
    monkeypatch.chdir(tmp_path)
    cfg = _deployment(embedded_stack, f"http://127.0.0.1:{closed_port()}/v1", CLUSTER["training"]["grpo"], "local")
    code = main(["run", "--config", str(_write(tmp_path, cfg)), "--check"])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert "PERMISSION_DENIED: training.grpo.vllm.profile: 'vllm' is not an endpoint profile" in err
    assert "Traceback" not in out + err


def test_a_listener_that_is_not_the_service_fails_the_check(tmp_path, monkeypatch, capsys):
    """Reachable but not a TRACE service (a plain TCP listener): failed, exit 1."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        cfg = {**CLUSTER, "services": {"trainer": address}, "store": {"root": "file://./store"},
               "target": {"env": "store"}, "base_agent": {"name": "micro"}, "analysis": {"mode": "diagnostics"},
               "environments": {"mode": "library"}, "evaluation": {"split": "test", "limit": 4, "arms": ["base"]},
               "max_completion_length": {"tokens": 64, "reason": "a cap for this test only"}}
        monkeypatch.chdir(tmp_path)
        code = main(["run", "--config", str(_write(tmp_path, cfg)), "--check"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert _outcomes(out)["service trainer"] == "failed" and "reachable but" in out
