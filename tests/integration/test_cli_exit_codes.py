"""tracectl's exit statuses where a real server or socket is involved (tracectl/exits.py).

- An address that cannot be listened on -- a `--host` that does not resolve or is not this
  machine's, a busy `--port` / `--http-port` / `--metrics-port` -- is exit 2 with one line naming the
  flag (it used to be a RuntimeError / OSError traceback, exit 1).
- `tracectl status --target SERVICE=HOST:PORT` (or TRACE_<SERVICE>_TARGET) judges only the services
  so addressed: a healthy one is exit 0 (it was always 1, the four others counting as "not configured").
- A stack of another live process owns `<root>/embedded.json`: a one-command stack on that root
  (`up --once`, `run`, ...) neither overwrites nor removes it, and a second `tracectl up` is refused
  (exit 2, naming the pid). The second `up --once` used to delete the running `up`'s file, so
  `tracectl status --root` then found no stack.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from trace_common.grpc.client import SERVICES
from tracectl.cli import main
from tracectl.embedded import EmbeddedStack

pytestmark = pytest.mark.integration

TARGET_VARS = [f"TRACE_{name.upper()}_TARGET" for name in SERVICES]


def _one_line(capsys, code: int, needle: str) -> str:
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "Traceback" not in out + err
    lines = [line for line in (out + err).splitlines() if needle in line]
    assert len(lines) == 1, out + err
    return lines[0]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    for var in (*TARGET_VARS, "TRACE_INFERENCE_AUTH_TOKEN", "TRACE_AUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("host, fragment", [
    ("nosuch.invalid", "the name does not resolve"),
    ("10.255.255.1", "not an address of this machine"),
])
@pytest.mark.parametrize("command", ["up", "serve"])
def test_a_host_that_cannot_be_listened_on_is_one_line(tmp_path, capsys, clean_env, command, host, fragment):
    argv = {"up": ["up", "--once"],   # serve: a token, or it refuses any host beyond loopback without one
            "serve": ["serve", "--base", "micro", "--once", "--token", "test-token-0123456789"]}[command]
    line = _one_line(capsys, main([*argv, "--host", host, "--root", str(tmp_path / "root")]), f"--host {host}")
    assert fragment in line and "127.0.0.1" in line, line


@pytest.fixture
def busy_port():
    """A loopback port something else listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.parametrize("flag, what", [("--port", "gRPC"), ("--http-port", "OpenAI-compatible HTTP"),
                                        ("--metrics-port", "Prometheus /metrics")])
def test_serve_on_a_busy_port_is_one_line(tmp_path, capsys, clean_env, busy_port, flag, what):
    code = main(["serve", "--base", "micro", flag, str(busy_port), "--once", "--root", str(tmp_path / "root")])
    line = _one_line(capsys, code, f"{flag} {busy_port}")
    assert f"{what} on 127.0.0.1:{busy_port}: the port is in use" in line and "0 for any free one" in line, line


def test_a_start_refused_for_a_busy_port_leaves_no_listener_behind(tmp_path, capsys, clean_env, busy_port):
    """The gRPC port chosen beside a busy /metrics port is not left listening until the process exits
    (grpc cannot release a port bound by a server it never started)."""
    from tests.support.ports import free_port, in_use

    grpc_port = free_port()
    code = main(["serve", "--base", "micro", "--port", str(grpc_port), "--metrics-port", str(busy_port), "--once",
                 "--root", str(tmp_path / "root")])
    _one_line(capsys, code, f"--metrics-port {busy_port}")
    assert not in_use(grpc_port)


@pytest.fixture
def rollout_health():
    """A gRPC server whose health service says trace.v1.RolloutService is SERVING (nothing else)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set(SERVICES["rollout"][3], health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_status_judges_only_the_services_it_was_given(tmp_path, capsys, clean_env, rollout_health):
    assert main(["status", "--target", f"rollout={rollout_health}", "--root", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "SERVING" in out and "not configured" not in out, out
    assert all(name not in out for name in ("analysis", "environment", "trainer", "inference")), out


def test_status_reads_the_target_variables(tmp_path, capsys, monkeypatch, clean_env, rollout_health):
    monkeypatch.setenv("TRACE_ROLLOUT_TARGET", rollout_health)
    assert main(["status", "--root", str(tmp_path / "none")]) == 0      # no embedded.json needed
    assert "SERVING" in capsys.readouterr().out
    monkeypatch.setenv("TRACE_TRAINER_TARGET", "127.0.0.1:1")           # a named service that is down fails it
    assert main(["status", "--root", str(tmp_path / "none")]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().out


def test_status_refuses_a_malformed_target_with_exit_2(capsys, clean_env):
    assert main(["status", "--target", "rolout=127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--target" in err and "Did you mean rollout=127.0.0.1:1" in err, err


@pytest.fixture
def other_process():
    """A live process that is not this one (the pid another stack's embedded.json would name)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _state(root: Path, pid: int, **extra) -> dict:
    state = {"pid": pid, "artifact_root": root.as_uri(), "targets": {"rollout": "127.0.0.1:1"}, "metrics": {},
             "http": {}, "auth": {}, **extra}
    root.mkdir(parents=True, exist_ok=True)
    (root / "embedded.json").write_text(json.dumps(state))
    return state


def test_a_one_command_stack_leaves_another_live_stacks_embedded_json_alone(tmp_path, other_process, caplog):
    root = tmp_path / "st"
    theirs = _state(root, other_process)

    async def run() -> None:
        stack = EmbeddedStack(root=root)
        await stack.start()
        try:
            assert json.loads((root / "embedded.json").read_text()) == theirs     # not overwritten
            assert len(stack.servers) == 5                                         # it still runs, on its own ports
        finally:
            await stack.stop(grace=0.5)

    with caplog.at_level("WARNING", logger="tracectl.embedded"):
        asyncio.run(run())
    assert json.loads((root / "embedded.json").read_text()) == theirs             # not removed at stop
    assert any(f"another stack (pid {other_process})" in r.getMessage() for r in caplog.records)


def test_a_stale_embedded_json_is_replaced_and_removed_as_before(tmp_path):
    root = tmp_path / "st"
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()                                      # its pid names no process now
    _state(root, proc.pid)

    async def run() -> None:
        stack = EmbeddedStack(root=root)
        await stack.start()
        try:
            assert json.loads((root / "embedded.json").read_text())["pid"] == os.getpid()
        finally:
            await stack.stop(grace=0.5)

    asyncio.run(run())
    assert not (root / "embedded.json").exists()


@pytest.mark.parametrize("recorded, exclusive, taken", [
    ({"exclusive": False}, True, True),           # `up` beside a one-command stack (a make demo): takes the file
    ({"process": "another-boot:1"}, False, True),  # the pid now names another process: the file is stale
    ({"process": "another-boot:1"}, True, True),
    ({}, False, False),                            # a live stack of a file written before the fields
])
def test_whose_embedded_json_it_is(tmp_path, other_process, recorded, exclusive, taken):
    root = tmp_path / "st"
    theirs = _state(root, other_process, **recorded)

    async def run() -> dict:
        stack = EmbeddedStack(root=root, exclusive=exclusive)
        await stack.start()
        try:
            return json.loads((root / "embedded.json").read_text())
        finally:
            await stack.stop(grace=0.5)

    during = asyncio.run(run())
    if taken:
        assert during["pid"] == os.getpid() and during["exclusive"] is exclusive and during["process"]
        assert not (root / "embedded.json").exists()           # removed at its stop
    else:
        assert during == theirs


@pytest.mark.parametrize("addresses, refused", [
    (["127.0.0.1"], False),
    (["10.255.255.1", "127.0.0.1"], False),   # one of them binds: the servers listen there
    (["10.255.255.1"], True),
    (["10.255.255.1", "10.255.255.2"], True),
])
def test_a_host_is_refused_only_when_none_of_its_addresses_binds(monkeypatch, addresses, refused):
    import socket

    from tracectl.embedded import _host_problem

    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 0)) for address in addresses])
    problem = _host_problem("several.example")
    assert (problem is not None) is refused, problem
    if refused:
        assert "not an address of this machine" in problem


def test_a_second_up_on_a_root_with_a_live_stack_is_refused(tmp_path, other_process):
    root = tmp_path / "st"
    theirs = _state(root, other_process)
    # a subprocess: the old code started a second stack and waited for Ctrl-C (the timeout ends it)
    up = subprocess.run([sys.executable, "-m", "tracectl", "up", "--root", str(root)], capture_output=True,
                        text=True, timeout=60)
    assert up.returncode == 2, up.stdout + up.stderr
    assert "Traceback" not in up.stderr and up.stderr.count("\n") == 1, up.stderr
    assert f"--root {root}: `tracectl up` (pid {other_process}) is already running" in up.stderr
    assert f"kill {other_process}" in up.stderr
    assert json.loads((root / "embedded.json").read_text()) == theirs


def test_up_once_beside_a_running_up_keeps_it_visible_to_status(tmp_path):
    """The reviewer's steps: `tracectl up` running, `tracectl up --once` on its root, `tracectl status`."""
    exe = [sys.executable, "-m", "tracectl"]
    root = tmp_path / "st3"
    env = {**os.environ, "COLUMNS": "400"}
    for var in TARGET_VARS:
        env.pop(var, None)
    up = subprocess.Popen([*exe, "up", "--root", str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (root / "embedded.json").exists():
            assert up.poll() is None and time.monotonic() < deadline, up.communicate()
            time.sleep(0.3)
        theirs = json.loads((root / "embedded.json").read_text())
        assert theirs["pid"] == up.pid
        once = subprocess.run([*exe, "up", "--once", "--root", str(root)], capture_output=True, text=True,
                              timeout=120, env=env)
        assert once.returncode == 0, once.stdout + once.stderr
        st = subprocess.run([*exe, "status", "--root", str(root)], capture_output=True, text=True, timeout=60,
                            env=env)
        assert st.returncode == 0 and st.stdout.count("SERVING") == 5, st.stdout + st.stderr   # was: no stack found
        assert json.loads((root / "embedded.json").read_text()) == theirs
        assert f"another stack (pid {up.pid})" in once.stderr
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    assert not (root / "embedded.json").exists()     # removed by the stack that wrote it
