"""A real Prometheus server scrapes the running services' /metrics endpoints."""

import grpc
import pytest

from trace_common.config import SERVICE_NAMES
from trace_common.grpc.client import messages

pytestmark = pytest.mark.integration


def test_prometheus_scrapes_every_service(embedded_stack, prometheus_factory):
    prom = prometheus_factory(embedded_stack.metrics_urls)
    up = prom.wait_for("up", lambda r: len(r) == 5 and all(s["value"][1] == "1" for s in r))
    assert {s["metric"]["job"] for s in up} == set(SERVICE_NAMES)
    info = prom.wait_for("trace_build_info", lambda r: len(r) == 5)
    assert {s["metric"]["service"] for s in info} == set(SERVICE_NAMES)

    T = messages("trainer")
    for _ in range(3):
        with pytest.raises(grpc.RpcError):
            embedded_stack.stub("trainer").GetTrainingJob(T.GetTrainingJobRequest(job_id="prom-probe"))
    res = prom.wait_for('trace_trainer_rpc_requests_total{method="GetTrainingJob",code="NOT_FOUND"}',
                        lambda r: r and float(r[0]["value"][1]) >= 3)
    assert res[0]["metric"]["job"] == "trainer"
    hist = prom.wait_for('trace_trainer_rpc_duration_seconds_count{method="GetTrainingJob"}',
                         lambda r: r and float(r[0]["value"][1]) >= 3)
    assert hist


def test_prometheus_scrapes_token_protected_metrics_with_the_token_only(authed_stack, prometheus_factory):
    """With a token, /metrics answers only a scrape that sends it (as the chart's ServiceMonitors do):
    Prometheus with the token's credentials sees every service up and its series, one without sees
    every target down (401) and no series."""
    from tests.support.stack import TOKEN

    with_token = prometheus_factory(authed_stack.metrics_urls, token=TOKEN)
    without = prometheus_factory(authed_stack.metrics_urls)
    up = with_token.wait_for("up", lambda r: len(r) == 5 and all(s["value"][1] == "1" for s in r))
    assert {s["metric"]["job"] for s in up} == set(SERVICE_NAMES)
    assert len(with_token.wait_for("trace_build_info", lambda r: len(r) == 5)) == 5
    down = without.wait_for("up", lambda r: len(r) == 5 and all(s["value"][1] == "0" for s in r))
    assert {s["metric"]["job"] for s in down} == set(SERVICE_NAMES)
    assert without.query("trace_build_info") == []
