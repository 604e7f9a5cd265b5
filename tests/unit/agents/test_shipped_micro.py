"""The shipped `micro` artifact (trace_common/agents/shipped/micro) matches the current code.

Re-derived from scratch, never from a cache: the files' sha256s, today's default config, the
training data's digest (the store expert's 2,000 conversations, played again), the build code's
digests, the tokenized examples, and the build's first 20 losses replayed (`shipped.check`).
When the domain or the build code changes, this fails naming what changed and the one command that
rebuilds the artifact (`.venv/bin/tracectl agents ship micro`, ~1 h 45 min on 2 cores). Slow: ~30 s.
"""

from __future__ import annotations

import time

import pytest

from trace_common.agents import read_meta, resolve_base_agent, shipped

pytestmark = pytest.mark.slow


def test_shipped_micro_is_reproduced_by_the_current_code():
    summary = shipped.check("micro", steps=20)
    assert summary["steps"] == 20 and summary["losses"] == pytest.approx(summary["recorded"], abs=1e-4)


def test_a_fresh_cache_installs_the_shipped_micro_in_seconds(tmp_path):
    record = shipped.read_record(shipped.shipped_dir("micro"))
    assert record is not None, f"no shipped micro artifact; make it with: {shipped.REBUILD_COMMAND['micro']}"
    started = time.perf_counter()
    model_dir = resolve_base_agent("micro", tmp_path)
    seconds = time.perf_counter() - started
    meta = read_meta(model_dir)
    assert meta["source"] == "shipped", (f"the shipped micro artifact was not used: it does not match the current "
                                         f"code; rebuild it with: {shipped.REBUILD_COMMAND['micro']}")
    assert meta["hash"] == record["key"] and seconds < 120  # data digest (~12 s quiet) + verified copy
    metrics = record["metrics"]
    assert metrics["held_out_token_accuracy"] >= 0.95  # imitates the expert (0.984 in the 2026-12-01 build)
    probe = metrics["pass_rate_probe"]
    assert probe["episodes"] >= 20 and probe["well_formed_call_fraction"] > 0.9  # it plays the domain
    guidance = metrics["guidance_probe"]  # dev tasks, greedy: 27/100 guided vs 2/100 unguided (2026-12-03 build)
    assert guidance["split"] == "dev" and guidance["guided_T0"]["episodes"] == guidance["unguided_T0"]["episodes"]
    assert guidance["guided_T0"]["pass_rate"] >= guidance["unguided_T0"]["pass_rate"] + 0.15  # follows guidance
