"""`tracectl serve` as a process: prints its addresses, answers the OpenAI API, stops on SIGTERM;
a composition that does not load is reported with exit status 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import FIXED_CALL, TOOLS, cached_world, prompt_messages

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a fresh Python + torch process each: 25-40 s here


@pytest.fixture(scope="module")
def world():
    return cached_world()


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


@pytest.mark.parametrize("args, needle", [
    (["--base", "/nonexistent/model"], "NOT_FOUND"),
    (["--composition", "file:///nonexistent/composition.json"], "does not exist"),
])
def test_serve_reports_a_composition_that_does_not_load(tmp_path, args, needle):
    out = subprocess.run([sys.executable, "-m", "tracectl", "serve", *args, "--once", "--root", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 1
    assert needle in out.stdout and "Traceback" not in out.stdout + out.stderr
