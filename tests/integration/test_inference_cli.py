"""`tracectl serve` and `tracectl route-trace` as clients of the inference service.

As a process, `serve` prints its addresses, answers the OpenAI API and stops on SIGTERM; a
composition that does not load is reported with exit status 1. In this process (`tracectl.cli.main`),
`serve --once` starts the service here and loads through LoadComposition with the routing asked
for, `serve --target` loads onto a running service (the embedded stacks of tests/support/stack.py),
and `route-trace` calls Generate with a routing trace, here or on a running service. Failures are
one line with the service's status code and exit status 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.stack import TOKEN
from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import FIXED_CALL, TOOLS, cached_world, prompt_messages
from trace_common.grpc.client import messages
from tracectl.cli import main

pytestmark = pytest.mark.integration
SLOW = pytest.mark.slow  # a fresh Python + torch process each: 25-40 s here
INF = messages("inference")


@pytest.fixture(scope="module")
def world():
    return cached_world()


@pytest.fixture(scope="module")
def composition(world, tmp_path_factory):
    return write_tiny_composition(world, tmp_path_factory.mktemp("cli-store"))


def _composition_args(world, gates_uri: str) -> list[str]:
    return ["--base", str(world.model_dir), "--adapter", f"refunds={world.adapter_dirs['refunds']}",
            "--adapter", f"addresses={world.adapter_dirs['addresses']}", "--gates", gates_uri]


def _unload(stack, name: str) -> None:
    """Leave the session's stack as it was (it serves at most max_compositions at once)."""
    names = [c.spec.name for c in stack.stub("inference").ListCompositions(INF.ListCompositionsRequest()).compositions]
    if name in names:
        stack.stub("inference").UnloadComposition(INF.UnloadCompositionRequest(name=name))


@SLOW
def test_serve_process_answers_openai_and_stops(world, tmp_path):
    import httpx

    art = write_tiny_composition(world, tmp_path / "store")
    proc = subprocess.Popen([sys.executable, "-m", "tracectl", "serve", "--composition", art.manifest_uri,
                             "--name", "demo", "--root", str(tmp_path / "root")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "400"})
    try:
        line = ""
        deadline = time.time() + 120
        while "grpc=" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "tracectl serve exited early"
            assert time.time() < deadline
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        assert fields["model"] == "demo" and ":" in fields["grpc"]
        resp = httpx.post(fields["http"] + "/chat/completions", timeout=120, json={
            "model": "demo", "messages": [m.to_dict() for m in prompt_messages("refunds", 2)],
            "tools": TOOLS["refunds"], "temperature": 0, "max_tokens": 40}).json()
        call = resp["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == FIXED_CALL["name"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("host, token_args, env, code, needle", [
    ("0.0.0.0", [], {}, 2, "without auth: set --token"),                          # refused, nothing started
    ("::", [], {}, 2, "without auth: set --token"),
    ("0.0.0.0", ["--token", TOKEN], {}, 0, "model=demo auth=bearer-token"),        # the token it will require
    ("0.0.0.0", [], {"TRACE_AUTH_TOKEN": TOKEN}, 0, "model=demo auth=bearer-token"),
    ("127.0.0.1", [], {}, 0, "model=demo auth=none"),                              # this machine only: as before
    ("127.0.0.1", [], {"TRACE_AUTH_TOKEN": ""}, 2, "TRACE_AUTH_TOKEN is set but blank"),   # never auth off
])
def test_serve_beyond_loopback_needs_a_token(composition, tmp_path, capsys, monkeypatch, host, token_args, env, code,
                                             needle):
    monkeypatch.setenv("COLUMNS", "400")
    for var in ("TRACE_INFERENCE_AUTH_TOKEN", "TRACE_AUTH_TOKEN", "TRACE_INFERENCE_TARGET"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    args = ["serve", "--composition", composition.manifest_uri, "--name", "demo", "--host", host, *token_args,
            "--once", "--root", str(tmp_path / "root")]
    got = main(args)
    captured = capsys.readouterr()
    out = captured.out + captured.err   # a refused flag is one line on stderr (tracectl.cli), the rest on stdout
    assert got == code and needle in out, out
    assert (code == 2) is ("loading composition" not in out)                      # a refusal starts nothing


@SLOW
def test_serve_with_a_token_requires_it_on_both_apis(world, tmp_path):
    import grpc
    import httpx

    art = write_tiny_composition(world, tmp_path / "store")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_")}
    proc = subprocess.Popen([sys.executable, "-m", "tracectl", "serve", "--composition", art.manifest_uri,
                             "--name", "demo", "--token", TOKEN, "--root", str(tmp_path / "root")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**env, "COLUMNS": "400"})
    try:
        line, deadline = "", time.time() + 120
        while "grpc=" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "tracectl serve exited early"
            assert time.time() < deadline
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        for headers, status in [({}, 401), ({"Authorization": f"Bearer {TOKEN}"}, 200)]:
            assert httpx.get(fields["http"] + "/models", headers=headers, timeout=30).status_code == status
        stub = messages("inference")
        from trace_common.grpc.client import Endpoint, open_channel
        from trace_common.grpc.client import stub as make_stub

        with pytest.raises(grpc.RpcError) as err:
            make_stub("inference", open_channel(Endpoint(fields["grpc"]))).ListCompositions(
                stub.ListCompositionsRequest(), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        listed = make_stub("inference", open_channel(Endpoint(fields["grpc"], TOKEN))).ListCompositions(
            stub.ListCompositionsRequest(), timeout=30)
        assert [c.spec.name for c in listed.compositions] == ["demo"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@SLOW
@pytest.mark.parametrize("args, needle", [
    (["--base", "/nonexistent/model"], "NOT_FOUND"),
    (["--composition", "file:///nonexistent/composition.json"], "does not exist"),
])
def test_serve_reports_a_composition_that_does_not_load(tmp_path, args, needle):
    out = subprocess.run([sys.executable, "-m", "tracectl", "serve", *args, "--once", "--root", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 1
    assert needle in out.stdout and "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize("routing, expect", [
    ("token", ["routing token", "2 layers, hidden 64, 390 gate parameters"]),
    ("per_request", ["routing per_request", "390 gate parameters"]),
    ("merged", ["routing merged", "0 gate parameters"]),
])
def test_serve_once_loads_through_the_service_with_its_routing(composition, tmp_path, capsys, monkeypatch,
                                                               routing, expect):
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.delenv("TRACE_INFERENCE_TARGET", raising=False)
    code = main(["serve", "--composition", composition.manifest_uri, "--name", "demo", "--routing", routing,
                 "--once", "--root", str(tmp_path / "root")])
    out = capsys.readouterr().out
    assert code == 0, out
    for needle in [*expect, "experts: base, refunds, addresses", "model=demo", "http=http://", "grpc=127.0.0.1:"]:
        assert needle in out, (needle, out)


@pytest.mark.parametrize("stack_name, token, code, needle", [
    ("embedded_stack", None, 0, "routing per_request"),
    ("authed_stack", TOKEN, 0, "routing per_request"),
    ("authed_stack", None, 1, "UNAUTHENTICATED"),
])
def test_serve_target_loads_onto_a_running_service(request, composition, capsys, monkeypatch, stack_name, token,
                                                   code, needle):
    monkeypatch.setenv("COLUMNS", "400")
    for var in ("TRACE_INFERENCE_AUTH_TOKEN", "TRACE_AUTH_TOKEN", "TRACE_INFERENCE_TARGET"):
        monkeypatch.delenv(var, raising=False)
    stack = request.getfixturevalue(stack_name)
    args = ["serve", "--composition", composition.manifest_uri, "--name", "cli-remote", "--routing", "per_request",
            "--target", f"inference={stack.targets['inference']}", *(["--token", token] if token else [])]
    try:
        assert main(args) == code
        out = capsys.readouterr().out
        assert needle in out, out
        assert "Traceback" not in out
        listed = {c.spec.name: c for c in stack.stub("inference").ListCompositions(
            INF.ListCompositionsRequest()).compositions}
        if code == 0:  # the service serves it, with the routing asked for, after serve returned
            assert f"grpc={stack.targets['inference']} model=cli-remote" in out
            assert INF.CompositionRouting.Name(listed["cli-remote"].spec.routing) == "COMPOSITION_ROUTING_PER_REQUEST"
        else:
            assert "cli-remote" not in listed
            assert len([line for line in out.splitlines() if needle in line]) == 1
    finally:
        _unload(stack, "cli-remote")


def _conversation_files(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS["refunds"]))
    conversation = tmp_path / "conversation.json"
    conversation.write_text(json.dumps([m.to_dict() for m in prompt_messages("refunds", 1)]))
    return ["--messages-file", str(conversation), "--tools-file", str(tools), "--max-tokens", "40"]


def test_route_trace_in_process(world, composition, tmp_path, capsys, monkeypatch):
    """No --target: the service is started here and loaded through LoadComposition."""
    monkeypatch.delenv("TRACE_INFERENCE_TARGET", raising=False)
    args = ["route-trace", *_composition_args(world, composition.gates_uri), *_conversation_files(tmp_path),
            "--root", str(tmp_path / "root")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "addresses" in out and "share of generated tokens per expert" in out
    assert "finish_reason=tool_calls" in out and "refund_order" in out


def test_route_trace_asks_a_running_service(embedded_stack, world, composition, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRACE_INFERENCE_TARGET", raising=False)
    stub = embedded_stack.stub("inference")
    spec = INF.CompositionSpec(name="cli-trace", base_model=str(world.model_dir), gates_uri=composition.gates_uri,
                               adapters=[INF.AdapterRef(name=n, uri=str(world.adapter_dirs[n]))
                                         for n in ("refunds", "addresses")])
    stub.LoadComposition(INF.LoadCompositionRequest(spec=spec))
    try:
        assert main(["route-trace", "--target", embedded_stack.targets["inference"], "--model", "cli-trace",
                     *_conversation_files(tmp_path), "--per-layer"]) == 0
        out = capsys.readouterr().out
        assert "0:base" in out and "2:addresses" in out and "layer  1:" in out
        assert "finish_reason=tool_calls" in out
    finally:
        _unload(embedded_stack, "cli-trace")


@pytest.mark.parametrize("case, needle, code", [
    ("bad_base", "NOT_FOUND", 1),  # route-trace: the in-process service refuses the load
    ("bad_name", "INVALID_ARGUMENT: spec.name", 2),  # serve: validated by the service, not by tracectl
    ("unknown_model", "--model: no composition 'ghost'", 2),  # route-trace: a --model the service lacks
])
def test_cli_failures_are_one_line(embedded_stack, world, composition, tmp_path, capsys, monkeypatch,
                                           case, needle, code):
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.delenv("TRACE_INFERENCE_TARGET", raising=False)
    common = [*_conversation_files(tmp_path), "--root", str(tmp_path / "root")]
    if case == "bad_base":
        args = ["route-trace", "--base", "/nonexistent/model", *common]
    elif case == "bad_name":
        args = ["serve", "--name", "bad name!", *_composition_args(world, composition.gates_uri), "--once",
                "--root", str(tmp_path / "root")]
    else:
        args = ["route-trace", "--target", embedded_stack.targets["inference"], "--model", "ghost", *common]
    assert main(args) == code
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if needle in line]) == 1, out
    assert "Traceback" not in out
