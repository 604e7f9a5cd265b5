"""The auth table, over real servers on loopback: gRPC on all five services and the inference
service's OpenAI-compatible HTTP API, embedded (`authed_stack`, one token) and standalone
(`python -m services.inference` with TRACE_INFERENCE_AUTH_TOKEN); tokens refused at start-up
(blank, whitespace, padded) by every service's entry point and by `tracectl up`; per-service
tokens from the environment under `tracectl up` (a subprocess: embedded.json, every service
called with no / wrong / its own token, `tracectl status` in the same environment); the client
side (`tracectl run`'s connection) picking the token from the same variables; and the one
warning an embedded stack without auth gives.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.stack import TOKEN
from tests.support.tls import self_signed, trusting
from trace_common.config import SERVICE_NAMES
from trace_common.grpc.client import Endpoint, messages, open_channel
from tracectl.commands.stack import AUTH_PROBES

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any TRACE_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_")}
    return {**env, "COLUMNS": "250", **extra}


def _probe(target: str, service: str, metadata: tuple = ()) -> tuple[str, str]:
    """(status name, details) of the service's side-effect-free authenticated call with raw `metadata`."""
    method, fields = AUTH_PROBES[service]
    request = getattr(messages(service), f"{method}Request")(**fields)
    full = {"rollout": "RolloutService", "analysis": "AnalysisService", "environment": "EnvironmentService",
            "trainer": "TrainerService", "inference": "InferenceService"}[service]
    with open_channel(Endpoint(target)) as ch:
        call = ch.unary_unary(f"/trace.v1.{full}/{method}", request_serializer=lambda m: m.SerializeToString())
        try:
            call(request, metadata=metadata, timeout=10)
            return "OK", ""
        except grpc.RpcError as err:
            return err.code().name, err.details() or ""


# (authorization metadata sent or None, expected status, fragment of the details)
GRPC_CASES = [
    (None, "UNAUTHENTICATED", "missing"),
    ("Bearer wrong-token", "UNAUTHENTICATED", "invalid bearer token"),
    ("Bearer    ", "UNAUTHENTICATED", "invalid bearer token"),
    ("Bearer", "UNAUTHENTICATED", "invalid bearer token"),
    (f"Basic {TOKEN}", "UNAUTHENTICATED", "invalid bearer token"),
    (TOKEN, "UNAUTHENTICATED", "invalid bearer token"),
    (f"Bearer {TOKEN}x", "UNAUTHENTICATED", "invalid bearer token"),
    (f"Bearer {TOKEN[:-1]}", "UNAUTHENTICATED", "invalid bearer token"),
    (f"Bearer {TOKEN}", "OK", ""),
    (f"bearer {TOKEN}", "OK", ""),
]


@pytest.mark.parametrize("service", SERVICE_NAMES)
@pytest.mark.parametrize(("header", "code", "fragment"), GRPC_CASES, ids=[repr(c[0]) for c in GRPC_CASES])
def test_grpc_auth_embedded(authed_stack, service, header, code, fragment):
    md = (("authorization", header),) if header is not None else ()
    got, details = _probe(authed_stack.targets[service], service, md)
    assert got == code, details
    assert fragment in details
    assert TOKEN not in details


# (method, path, authorization header or None, JSON body or raw text, expected HTTP status, what to check)
HTTP_CASES = [
    ("GET", "/v1/models", None, None, 401, "missing"),
    ("GET", "/v1/models", "Bearer wrong-token", None, 401, "invalid API key"),
    ("GET", "/v1/models", "Bearer    ", None, 401, "invalid API key"),
    ("GET", "/v1/models", f"Basic {TOKEN}", None, 401, "invalid API key"),
    ("GET", "/v1/models", TOKEN, None, 401, "invalid API key"),
    ("GET", "/v1/models", f"Bearer {TOKEN}x", None, 401, "invalid API key"),
    ("GET", "/v1/models", f"Bearer {TOKEN}", None, 200, "list"),
    ("POST", "/v1/chat/completions", None, {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]},
     401, "missing"),
    ("POST", "/v1/chat/completions", "Bearer wrong-token",
     {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]}, 401, "invalid API key"),
    ("POST", "/v1/chat/completions", None, "{not json", 401, "missing"),  # refused before the body is read
    ("POST", "/v1/chat/completions", f"Bearer {TOKEN}",
     {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found"),
    ("GET", "/v1/no-such-route", None, None, 401, "missing"),  # routes cannot be probed without a token
    ("GET", "/v1/no-such-route", f"Bearer {TOKEN}", None, 404, ""),
    ("GET", "/health", None, None, 200, "no compositions"),
    ("GET", "/health", "Bearer wrong-token", None, 200, "no compositions"),
    ("GET", "/health", f"Bearer {TOKEN}", None, 200, "compositions"),
]


@dataclass
class Reply:
    status_code: int
    headers: dict[str, str]
    text: str

    def json(self):
        return json.loads(self.text)


def _http(base: str, method: str, path: str, header: str | None, body) -> Reply:
    """One request with the Authorization value exactly as given (http.client: httpx refuses to
    send a header value with trailing spaces, which is one of the cases)."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        headers = {"Authorization": header} if header is not None else {}
        data = None
        if body is not None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, dict(resp.getheaders()), resp.read().decode())
    finally:
        conn.close()


def _check_http(resp: Reply, status: int, what: str) -> None:
    assert resp.status_code == status, resp.text[:300]
    body = resp.json() if resp.headers.get("Content-Type", "").startswith("application/json") else None
    if status == 401:
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_api_key"
        assert what in body["error"]["message"]
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert TOKEN not in resp.text
    elif what == "list":
        assert body["object"] == "list" and isinstance(body["data"], list)
    elif what == "no compositions":
        assert body == {"status": "ok"}
    elif what == "compositions":
        assert body["status"] == "ok" and isinstance(body["compositions"], list)
    elif what == "model_not_found":
        assert body["error"]["type"] == "model_not_found" and "ghost" in body["error"]["message"]


@pytest.mark.parametrize(("method", "path", "header", "body", "status", "what"), HTTP_CASES,
                         ids=[f"{c[0]}{c[1]}-{c[2]!r}" for c in HTTP_CASES])
def test_http_auth_embedded(authed_stack, method, path, header, body, status, what):
    _check_http(_http(authed_stack.http_url("inference"), method, path, header, body), status, what)


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("GET", "/v1/models", None, 200),
    ("POST", "/v1/chat/completions", {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]}, 404),
    ("GET", "/health", None, 200),
])
def test_http_without_auth_configured_needs_no_token(embedded_stack, method, path, body, status):
    resp = _http(embedded_stack.http_url("inference"), method, path, None, body)
    assert resp.status_code == status
    if path == "/health":
        assert "compositions" in resp.json()  # auth off: nothing to hide from a caller


METRICS_CASES = [(None, 401), ("Bearer wrong-token", 401), (TOKEN, 401), (f"Bearer {TOKEN}", 200)]


@pytest.mark.parametrize("service", SERVICE_NAMES)
@pytest.mark.parametrize(("header", "status"), METRICS_CASES, ids=[repr(c[0]) for c in METRICS_CASES])
def test_metrics_auth_embedded(authed_stack, service, header, status):
    """/metrics is a serving surface too: behind the service's token (the full rule's table:
    tests/integration/test_metrics_server.py)."""
    resp = httpx.get(authed_stack.metrics_urls[service], headers={"Authorization": header} if header else {},
                     timeout=10)
    assert resp.status_code == status, resp.text[:300]
    assert ("trace_build_info" in resp.text) is (status == 200)
    assert TOKEN not in resp.text


@pytest.mark.parametrize(("api_key", "ok"), [(TOKEN, True), ("wrong-token", False), ("EMPTY", False)])
def test_openai_sdk_sends_the_token_as_api_key(authed_stack, api_key, ok):
    client = openai.OpenAI(base_url=authed_stack.http_url("inference"), api_key=api_key, max_retries=0, timeout=30)
    try:
        if ok:
            assert isinstance(client.models.list().data, list)
        else:
            with pytest.raises(openai.AuthenticationError) as info:
                client.models.list()
            assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    finally:
        client.close()


# -- standalone: the service's own entry point --

def _start(service: str, env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str], list[str]]:
    """A `python -m services.<service>` process; (process, fields of its ready line, lines before it)."""
    proc = subprocess.Popen([sys.executable, "-m", f"services.{service}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    lines: list[str] = []
    deadline = time.time() + 180
    while True:
        line = proc.stdout.readline()
        if "ready:" in line:
            return proc, dict(p.split("=", 1) for p in line.split() if "=" in p), lines
        assert line or proc.poll() is None, f"{service} exited before ready:\n{''.join(lines)}"
        assert time.time() < deadline, f"{service} not ready after 180 s"
        lines.append(line)


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def standalone_inference(tmp_path_factory):
    root = tmp_path_factory.mktemp("standalone-inference")
    proc, fields, lines = _start("inference", _clean_env(TRACE_INFERENCE_AUTH_TOKEN=TOKEN,
                                                          TRACE_INFERENCE_ARTIFACT_ROOT=root.as_uri()))
    try:
        yield fields, lines
    finally:
        assert _stop(proc) == 0


@pytest.mark.slow
def test_standalone_says_auth_is_on(standalone_inference):
    fields, lines = standalone_inference
    assert fields["auth"] == "on" and fields["http"].startswith("http://127.0.0.1:")
    assert not any("WITHOUT AUTH" in ln for ln in lines)


@pytest.mark.slow
@pytest.mark.parametrize(("header", "code", "fragment"), GRPC_CASES, ids=[repr(c[0]) for c in GRPC_CASES])
def test_grpc_auth_standalone(standalone_inference, header, code, fragment):
    md = (("authorization", header),) if header is not None else ()
    got, details = _probe(standalone_inference[0]["grpc"], "inference", md)
    assert got == code and fragment in details, details
    with open_channel(Endpoint(standalone_inference[0]["grpc"])) as ch:  # probes need no token
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "header", "body", "status", "what"), HTTP_CASES,
                         ids=[f"{c[0]}{c[1]}-{c[2]!r}" for c in HTTP_CASES])
def test_http_auth_standalone(standalone_inference, method, path, header, body, status, what):
    _check_http(_http(standalone_inference[0]["http"], method, path, header, body), status, what)


@pytest.mark.slow
def test_with_tls_the_http_api_is_served_over_tls_only(tmp_path):
    """The token is a bearer secret: with the service's TLS settings on, the OpenAI-compatible API is
    HTTPS on the same certificate, and nothing answers in plain HTTP on its port."""
    cert, key = self_signed(tmp_path)
    proc, fields, _ = _start("inference", _clean_env(
        TRACE_INFERENCE_AUTH_TOKEN=TOKEN, TRACE_INFERENCE_ARTIFACT_ROOT=tmp_path.as_uri(),
        TRACE_INFERENCE_TLS_CERT_FILE=str(cert), TRACE_INFERENCE_TLS_KEY_FILE=str(key)))
    try:
        url = urlsplit(fields["http"])
        assert url.scheme == "https", fields
        context = trusting(cert)
        for header, status in [(f"Bearer {TOKEN}", 200), (None, 401)]:
            conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=30, context=context)
            conn.request("GET", "/v1/models", headers={"Authorization": header} if header else {})
            assert conn.getresponse().status == status
            conn.close()
        plain = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            plain.request("GET", "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
            plain.getresponse()
        plain.close()
        metrics = urlsplit(fields["metrics"])  # the scrape sends the token too: HTTPS on the same pair
        assert metrics.scheme == "https", fields
        for header, status in [(f"Bearer {TOKEN}", 200), (None, 401)]:
            conn = http.client.HTTPSConnection(metrics.hostname, metrics.port, timeout=30, context=context)
            conn.request("GET", metrics.path, headers={"Authorization": header} if header else {})
            assert conn.getresponse().status == status
            conn.close()
    finally:
        assert _stop(proc) == 0


@pytest.mark.slow
def test_with_tls_the_trainer_reaches_the_environment_service_trusting_its_ca(tmp_path, monkeypatch):
    """The trainer (and each worker, from the variable its executor sets) opens its channel to an
    environment service that serves TLS only: with the CA it reaches the service (an unknown environment
    is NOT_FOUND, an answer of the service's), without it the call never gets through (UNAVAILABLE)."""
    from services.trainer.jobspec import ENVIRONMENT_TLS_CA_ENV, env_factory
    from trace_common.errors import FailedPrecondition, NotFound, Unavailable

    cert, key = self_signed(tmp_path)
    proc, fields, _ = _start("environment", _clean_env(
        TRACE_ENVIRONMENT_AUTH_TOKEN=TOKEN, TRACE_ENVIRONMENT_ARTIFACT_ROOT=tmp_path.as_uri(),
        TRACE_ENVIRONMENT_TLS_CERT_FILE=str(cert), TRACE_ENVIRONMENT_TLS_KEY_FILE=str(key)))
    ref = {"name": "no-such-generated-env", "version": "", "params": {}}
    try:
        target = fields["grpc"]
        with pytest.raises(NotFound, match="neither built in nor in the environment service"):
            env_factory(ref, target, TOKEN, cert)                     # the service, validating a request
        monkeypatch.setenv(ENVIRONMENT_TLS_CA_ENV, str(cert))
        with pytest.raises(NotFound, match="neither built in nor in the environment service"):
            env_factory(ref, target, TOKEN)                           # a worker: the CA from its environment
        monkeypatch.delenv(ENVIRONMENT_TLS_CA_ENV)
        with pytest.raises(Unavailable, match="UNAVAILABLE"):
            env_factory(ref, target, TOKEN)                           # plaintext to a TLS server
        with pytest.raises(FailedPrecondition, match="TLS CA file .* does not exist"):
            env_factory(ref, target, TOKEN, tmp_path / "missing.crt")
    finally:
        assert _stop(proc) == 0


@pytest.mark.slow
def test_metrics_left_open_on_purpose_says_so_in_its_log(tmp_path):
    """TRACE_<SERVICE>_METRICS_AUTH=false: the operator's choice to leave /metrics open while the gRPC
    calls keep needing the token, and the log's warning names the setting."""
    proc, fields, lines = _start("analysis", _clean_env(TRACE_ANALYSIS_AUTH_TOKEN=TOKEN,
                                                         TRACE_ANALYSIS_METRICS_AUTH="false",
                                                         TRACE_ANALYSIS_ARTIFACT_ROOT=tmp_path.as_uri()))
    try:
        assert fields["auth"] == "on"
        (warning,) = [ln for ln in lines if "WITHOUT AUTH" in ln]
        assert "/metrics" in warning and "TRACE_ANALYSIS_METRICS_AUTH" in warning and fields["metrics"] in warning
        assert httpx.get(fields["metrics"], timeout=10).status_code == 200
        assert _probe(fields["grpc"], "analysis")[0] == "UNAUTHENTICATED"
    finally:
        assert _stop(proc) == 0


@pytest.mark.slow
def test_standalone_without_token_warns_in_its_log(tmp_path):
    proc, fields, lines = _start("analysis", _clean_env(TRACE_ANALYSIS_ARTIFACT_ROOT=tmp_path.as_uri()))
    try:
        assert fields["auth"] == "off"
        (warning,) = [ln for ln in lines if "WITHOUT AUTH" in ln]
        assert "WARNING" in warning and "TRACE_ANALYSIS_AUTH_TOKEN" in warning and fields["grpc"] in warning
        assert _probe(fields["grpc"], "analysis")[0] == "OK"
    finally:
        assert _stop(proc) == 0


# -- tokens refused at start-up --

# every entry point refuses an empty token; the whitespace variants on one (each service's settings
# refuse all of them: tests/unit/test_auth_token.py)
STARTUP_REFUSALS = [(s, "") for s in SERVICE_NAMES] + [
    ("rollout", "   "), ("rollout", "\t"), ("rollout", f" {TOKEN}"), ("rollout", f"{TOKEN}\n"),
    ("rollout", "two words-token")]


@pytest.mark.parametrize(("service", "value"), STARTUP_REFUSALS, ids=[f"{s}-{v!r}" for s, v in STARTUP_REFUSALS])
def test_service_refuses_a_blank_or_padded_token(tmp_path, service, value):
    var = f"TRACE_{service.upper()}_AUTH_TOKEN"
    out = subprocess.run([sys.executable, "-m", f"services.{service}"], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env=_clean_env(**{var: value, f"TRACE_{service.upper()}_ARTIFACT_ROOT":
                                                     tmp_path.as_uri()}))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "auth_token" in out.stderr and var in out.stderr
    assert "Traceback" not in out.stderr and "ready:" not in out.stdout


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--token", "   "], {}, "--token is set but blank"),
    (["--token", f"{TOKEN} "], {}, "--token has leading or trailing whitespace"),
    ([], {"TRACE_AUTH_TOKEN": ""}, "TRACE_AUTH_TOKEN is set but blank"),
    ([], {"TRACE_TRAINER_AUTH_TOKEN": "  "}, "TRACE_TRAINER_AUTH_TOKEN is set but blank"),
    ([], {"TRACE_INFERENCE_AUTH_TOKEN": f"\n{TOKEN}"}, "TRACE_INFERENCE_AUTH_TOKEN has leading or trailing"),
])
def test_tracectl_up_refuses_a_blank_or_padded_token(tmp_path, args, env, needle):
    out = subprocess.run([sys.executable, "-m", "tracectl", "up", "--once", "--root", str(tmp_path), *args],
                         capture_output=True, text=True, timeout=180, cwd=REPO, env=_clean_env(**env))
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "embedded.json").exists()


# -- per-service tokens under `tracectl up` --

T_ROLLOUT, T_ENV, T_INF, T_ALL = ("rollout-" + "r" * 20, "environment-" + "e" * 20, "inference-" + "i" * 20,
                                  "stack-" + "s" * 20)
UP_CASES = {
    # env of `tracectl up` -> per service: (expected token or None, where embedded.json says it comes from)
    "per-service": ({"TRACE_ROLLOUT_AUTH_TOKEN": T_ROLLOUT, "TRACE_ENVIRONMENT_AUTH_TOKEN": T_ENV,
                     "TRACE_INFERENCE_AUTH_TOKEN": T_INF},
                    {"rollout": (T_ROLLOUT, "TRACE_ROLLOUT_AUTH_TOKEN"), "analysis": (None, None),
                     "environment": (T_ENV, "TRACE_ENVIRONMENT_AUTH_TOKEN"), "trainer": (None, None),
                     "inference": (T_INF, "TRACE_INFERENCE_AUTH_TOKEN")}),
    "stack-and-one-service": ({"TRACE_AUTH_TOKEN": T_ALL, "TRACE_ROLLOUT_AUTH_TOKEN": T_ROLLOUT},
                              {"rollout": (T_ROLLOUT, "TRACE_ROLLOUT_AUTH_TOKEN"),
                               **{s: (T_ALL, "TRACE_AUTH_TOKEN") for s in SERVICE_NAMES if s != "rollout"}}),
}


def _start_up(root: Path, env: dict[str, str]) -> tuple[subprocess.Popen, dict, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tracectl", "up", "--root", str(root)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    out = []
    deadline = time.time() + 240
    while True:
        line = proc.stdout.readline()
        out.append(line)
        if "addresses written to" in line:
            return proc, json.loads((root / "embedded.json").read_text()), "".join(out)
        assert line or proc.poll() is None, "tracectl up exited early:\n" + "".join(out)
        assert time.time() < deadline, "tracectl up not ready after 240 s:\n" + "".join(out)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(UP_CASES))
def test_tracectl_up_applies_per_service_env_tokens(tmp_path, case):
    env_tokens, expected = UP_CASES[case]
    env = _clean_env(**env_tokens)
    root = tmp_path / "stack"
    proc, state, printed = _start_up(root, env)
    try:
        text = (root / "embedded.json").read_text()
        for token in env_tokens.values():
            assert token not in text and token not in printed  # where the token is, never the token
        assert state["auth"] == {s: {"enabled": tok is not None, "token_from": src} for s, (tok, src) in expected.items()}
        open_services = [s for s, (tok, _src) in expected.items() if tok is None]
        warnings = [ln for ln in printed.splitlines() if "run without auth" in ln]
        if open_services:
            (warning,) = warnings  # said once for the stack, naming the open services
            assert all(s in warning for s in open_services) and "loopback" in warning
        else:
            assert warnings == []
        for service, (token, _src) in expected.items():
            target = state["targets"][service]
            anonymous = _probe(target, service)[0]
            wrong = _probe(target, service, (("authorization", "Bearer wrong-token"),))[0]
            if token is None:
                assert (anonymous, wrong) == ("OK", "OK"), service
                continue
            assert (anonymous, wrong) == ("UNAUTHENTICATED", "UNAUTHENTICATED"), service
            assert _probe(target, service, (("authorization", f"Bearer {token}"),))[0] == "OK", service
            others = {t for t, _s in expected.values() if t not in (None, token)}
            for other in others:  # another service's token does not open this one
                assert _probe(target, service, (("authorization", f"Bearer {other}"),))[0] == "UNAUTHENTICATED"
        http, inference_token = state["http"]["inference"], expected["inference"][0]
        assert _http(http, "GET", "/v1/models", None, None).status_code == 401
        assert _http(http, "GET", "/v1/models", f"Bearer {inference_token}", None).status_code == 200

        # a client in the same environment reads each service's token from the same variable
        status = subprocess.run([sys.executable, "-m", "tracectl", "status", "--root", str(root)], capture_output=True,
                                text=True, timeout=120, cwd=REPO, env=env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("token accepted") == len(SERVICE_NAMES) - len(open_services)
        assert status.stdout.count("off (no token needed)") == len(open_services)
        bad = subprocess.run([sys.executable, "-m", "tracectl", "status", "--root", str(root)], capture_output=True,
                             text=True, timeout=120, cwd=REPO, env={**env, "TRACE_ROLLOUT_AUTH_TOKEN": "wrong-token"})
        assert bad.returncode == 1 and "token refused" in bad.stdout
        if "TRACE_ENVIRONMENT_AUTH_TOKEN" in env_tokens:  # a client without that variable is told to set it
            bare = {k: v for k, v in env.items() if k != "TRACE_ENVIRONMENT_AUTH_TOKEN"}
            missing = subprocess.run([sys.executable, "-m", "tracectl", "status", "--root", str(root)],
                                     capture_output=True, text=True, timeout=120, cwd=REPO, env=bare)
            assert "on, no token sent" in missing.stdout and "TRACE_ENVIRONMENT_AUTH_TOKEN" in missing.stdout
    finally:
        assert _stop(proc) == 0
    assert not (root / "embedded.json").exists()


# -- clients: `tracectl run`'s connection, and the embedded stack it starts --

@pytest.mark.parametrize(("env", "token", "code"), [
    ({"TRACE_TRAINER_AUTH_TOKEN": TOKEN}, None, "OK"),
    ({}, TOKEN, "OK"),
    ({}, None, "UNAUTHENTICATED"),
    ({"TRACE_TRAINER_AUTH_TOKEN": "wrong-token"}, TOKEN, "UNAUTHENTICATED"),  # the service's own variable wins
    ({"TRACE_ROLLOUT_AUTH_TOKEN": TOKEN}, None, "UNAUTHENTICATED"),  # another service's variable is not read
])
def test_run_connection_sends_the_service_token(authed_stack, monkeypatch, tmp_path, env, token, code):
    from tracectl.connect import Connection

    for key in list(os.environ):
        if key.endswith("_AUTH_TOKEN"):
            monkeypatch.delenv(key)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    T = messages("trainer")
    args = argparse.Namespace(target=[f"trainer={authed_stack.targets['trainer']}"], token=token, root=tmp_path)
    with Connection(args) as conn:
        try:
            conn.stub("trainer").ListTrainingJobs(T.ListTrainingJobsRequest(page_size=1), timeout=10)
            got = "OK"
        except grpc.RpcError as err:
            got = err.code().name
    assert got == code


@pytest.mark.slow
def test_run_embedded_stack_says_once_it_runs_without_auth_and_honours_env_tokens(monkeypatch, tmp_path, caplog):
    from tracectl.connect import Connection

    for key in list(os.environ):
        if key.startswith("TRACE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("TRACE_ANALYSIS_AUTH_TOKEN", TOKEN)
    caplog.set_level(logging.WARNING)
    args = argparse.Namespace(target=[], token=None, root=tmp_path / ".trace")
    A = messages("analysis")
    with Connection(args) as conn:
        assert conn.stub("analysis").ListAnalysisJobs(A.ListAnalysisJobsRequest(page_size=1), timeout=10) is not None
        stack = conn.embedded
        assert _probe(stack.targets["analysis"], "analysis")[0] == "UNAUTHENTICATED"
        assert _probe(stack.targets["rollout"], "rollout")[0] == "OK"
        state = json.loads((tmp_path / ".trace" / "embedded.json").read_text())
        assert state["auth"]["analysis"] == {"enabled": True, "token_from": "TRACE_ANALYSIS_AUTH_TOKEN"}
    said = [r.getMessage() for r in caplog.records if "without auth" in r.getMessage().lower()]
    assert len(said) == 1, said
    assert "rollout, environment, trainer, inference" in said[0] and "loopback" in said[0]
    assert "analysis" not in said[0]
