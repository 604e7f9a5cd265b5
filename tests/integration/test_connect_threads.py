"""`tracectl.connect.Connection` from several threads at once, as `tracectl run` uses it when a
resumed run starts at the adapters stage (parallel training jobs are the first to ask for a stub).

Regression: each thread started its own embedded stack and they raced on the state file
(`FileNotFoundError: .trace/embedded.tmp -> .trace/embedded.json`), which failed the run."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import tracectl.connect as connect
from trace_common.proto.trace.v1 import rollout_service_pb2 as rollout_pb2

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("threads", [2, 4])
def test_threads_share_one_embedded_stack(tmp_path, monkeypatch, threads):
    started = []
    real = connect.BackgroundStack

    def slow_start(*a, **kw):  # widen the window in which a second thread could start another
        started.append(threading.get_ident())
        time.sleep(0.3)
        return real(*a, **kw)

    monkeypatch.setattr(connect, "BackgroundStack", slow_start)
    barrier = threading.Barrier(threads)
    args = argparse.Namespace(target=[], token=None, root=tmp_path / ".trace")
    with connect.Connection(args) as conn:
        def ask(_):
            barrier.wait()
            st = conn.stub("rollout")
            return len(st.ListRolloutJobs(rollout_pb2.ListRolloutJobsRequest(page_size=1)).jobs)

        with ThreadPoolExecutor(threads) as pool:
            assert list(pool.map(ask, range(threads))) == [0] * threads
        assert len(started) == 1, f"{len(started)} embedded stacks started by {threads} threads"
        state = json.loads((tmp_path / ".trace" / "embedded.json").read_text())
        assert state["pid"] == os.getpid()
        assert not list((tmp_path / ".trace").glob("*.tmp"))
