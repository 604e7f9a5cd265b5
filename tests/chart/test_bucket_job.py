"""The bucket hook Job really creates the buckets: its rendered script and env, run against a
real S3 server (`rclone serve s3`), as the Job would run them in the analysis image.

Each test gets its own empty server (`fresh_s3`, not the session-wide `s3_server`) so "created"
versus "exists" is known.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from minio import Minio

from tests.chart.helm import CHART, FULLNAME, VENV_BIN, render, require_tool
from tests.support.ports import free_port

KEY, SECRET = "bucketjobkey", "bucketjobsecret-0123456789"


@pytest.fixture
def fresh_s3(tmp_path):
    port = free_port()
    (tmp_path / "s3").mkdir()
    proc = subprocess.Popen([str(require_tool(VENV_BIN / "rclone")), "serve", "s3", "--addr", f"127.0.0.1:{port}",
                             "--auth-key", f"{KEY},{SECRET}", str(tmp_path / "s3")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("rclone serve s3 did not start")
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def job_command_and_env(value_set: str, endpoint: str) -> tuple[list[str], dict[str, str]]:
    job = render(value_set).get("Job", f"{FULLNAME}-buckets")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    (c,) = job["spec"]["template"]["spec"]["containers"]
    env = {}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:  # the two credentials, by secretKeyRef
            env[e["name"]] = KEY if e["name"].endswith("ACCESS_KEY") else SECRET
    env["TRACE_BUCKETS_S3_ENDPOINT"] = endpoint
    env["TRACE_BUCKETS_S3_SECURE"] = "false"
    return c["command"], env


@pytest.mark.integration
@pytest.mark.parametrize(("value_set", "buckets"), [("defaults", {"trace-artifacts"}),
                                                    ("external-minio", {"team-a-trace", "team-a-eval"})])
def test_bucket_job_creates_buckets_idempotently(value_set, buckets, fresh_s3):
    command, env = job_command_and_env(value_set, fresh_s3)
    assert command[:2] == ["python", "-c"]
    assert command[2] == (CHART / "files" / "create-buckets.py").read_text()
    run_env = {**os.environ, **env}
    for attempt in ("created", "exists"):
        proc = subprocess.run([sys.executable, "-c", command[2]], env=run_env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert all(f"bucket {b}: {attempt}" in proc.stdout for b in buckets), proc.stdout
    client = Minio(fresh_s3, access_key=KEY, secret_key=SECRET, secure=False, region="us-east-1")
    assert {b.name for b in client.list_buckets()} == buckets


@pytest.mark.integration
def test_bucket_job_gives_up_on_an_unreachable_server():
    command, env = job_command_and_env("defaults", f"127.0.0.1:{free_port()}")
    env["TRACE_BUCKETS_WAIT_SECONDS"] = "1"
    proc = subprocess.run([sys.executable, "-c", command[2]], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert "S3 server unreachable" in proc.stderr


@pytest.mark.integration
def test_bucket_job_fails_fast_on_bad_credentials(fresh_s3):
    command, env = job_command_and_env("defaults", fresh_s3)
    env["TRACE_BUCKETS_S3_SECRET_KEY"] = "wrong-secret-0123456789"
    proc = subprocess.run([sys.executable, "-c", command[2]], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "bucket trace-artifacts:" in proc.stderr
