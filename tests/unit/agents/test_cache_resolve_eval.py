"""Base-agent cache (keyed by config and provenance hash, atomic, wall time recorded),
`resolve_base_agent`, the Wilson interval, and the evaluation summary on expert trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_common.agents.cache import cached_build, config_hash, default_cache_dir, read_meta
from trace_common.agents.data import WarmStartData, expert_trajectories
from trace_common.agents.evaluate import summarise, wilson_interval
from trace_common.agents.micro import MicroConfig
from trace_common.agents.resolve import resolve_base_agent
from trace_common.agents.sft import SFTConfig
from trace_common.agents.smollm2 import SmolLM2Config
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (0, 10, 0.0, 0.2775),
    (5, 10, 0.2366, 0.7634),
    (10, 10, 0.7225, 1.0),
    (36, 100, 0.2727, 0.4576),
    (0, 0, 0.0, 1.0),
])
def test_wilson_interval(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert (lo, hi) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5)])
def test_wilson_interval_rejects_impossible_counts(k, n):
    with pytest.raises(InvalidArgument):
        wilson_interval(k, n)


@pytest.mark.parametrize(("a", "b", "same"), [
    (MicroConfig(), MicroConfig(), True),
    (MicroConfig(), MicroConfig(seed=1), False),
    (MicroConfig(), MicroConfig(sft=SFTConfig(steps=301, batch_size=8, learning_rate=3e-3)), False),
    (MicroConfig(), MicroConfig(data=WarmStartData(skills={"tool_call_precision": 0.5})), False),
], ids=["equal", "seed", "steps", "skills"])
def test_config_hash(a, b, same):
    assert (config_hash("micro", a) == config_hash("micro", b)) is same


PROV = {"config_hash": "c", "data_digest": "d" * 64, "code": {"agents/sft.py": "1" * 64}}


@pytest.mark.parametrize(("other", "same"), [
    (PROV, True),
    ({**PROV, "data_digest": "e" * 64}, False),
    ({**PROV, "code": {"agents/sft.py": "2" * 64}}, False),
    ({**PROV, "code": {**PROV["code"], "agents/micro.py": "3" * 64}}, False),
    (None, False),
], ids=["equal", "data", "code changed", "code added", "no provenance"])
def test_config_hash_covers_provenance(other, same):
    """The cache key changes with the training data and the build code, not only the config."""
    assert (config_hash("micro", MicroConfig(), PROV) == config_hash("micro", MicroConfig(), other)) is same


def test_cached_build_builds_once_and_records_wall_time(tmp_path):
    calls = []

    def build(out: Path, _progress):
        calls.append(out)
        (out / "config.json").write_text("{}")
        return {"answer": 42}

    first = cached_build(tmp_path, "micro", MicroConfig(), build)
    second = cached_build(tmp_path, "micro", MicroConfig(), build)
    assert first == second and len(calls) == 1
    assert first.name == f"micro-{config_hash('micro', MicroConfig())}"
    meta = read_meta(first)
    assert meta["metrics"] == {"answer": 42} and meta["build_seconds"] >= 0
    assert meta["config"] == MicroConfig().model_dump(mode="json")
    assert json.loads((first / "trace_agent.json").read_text()) == meta
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".building")]


def test_failed_build_leaves_nothing_behind(tmp_path):
    def build(out: Path, _progress):
        (out / "partial").write_text("x")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        cached_build(tmp_path, "micro", MicroConfig(), build)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == []  # no state file either


def test_resolve_passes_a_model_dir_through(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_base_agent(tmp_path, tmp_path / "cache") == tmp_path.resolve()
    monkeypatch.setenv("TRACE_AGENT_CACHE", str(tmp_path / "config.json"))   # unusable, and not needed here
    assert resolve_base_agent(tmp_path) == tmp_path.resolve()
    with pytest.raises(FailedPrecondition, match="TRACE_AGENT_CACHE="):     # needed for a built-in agent
        resolve_base_agent("micro")


@pytest.mark.parametrize(("name", "config", "error"), [
    ("no-such-agent", None, NotFound),
    ("micro", SmolLM2Config(), InvalidArgument),
], ids=["unknown", "wrong config type"])
def test_resolve_errors(tmp_path, name, config, error):
    with pytest.raises(error):
        resolve_base_agent(name, tmp_path, config=config)


def test_resolve_rejects_a_config_for_a_model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidArgument):
        resolve_base_agent(tmp_path, config=MicroConfig())


@pytest.mark.parametrize(("skills", "expect_all_pass"), [
    ({}, True),  # every capability present
    ({"precondition_verification": 0.0}, False),
], ids=["perfect expert", "precondition gap"])
def test_summary_per_task_type(skills, expect_all_pass):
    trajs = expert_trajectories(WarmStartData(episodes=40, first_seed=1000, skills=skills, task_types="probes"))
    for t in trajs:
        t.info["parse_errors"] = []
    stats = {"tool_call_turns": 1, "malformed_turns": 0, "completion_tokens": 10, "generate_seconds": 1.0}
    report = summarise("expert", "-", trajs, stats, 1.0, None)
    assert sum(pr.total for pr in report.per_task_type.values()) == 40
    assert report.well_formed_call_fraction == 1.0
    precondition = report.per_task_type["precondition_check"]
    if expect_all_pass:
        assert report.overall.passed == 40
    else:
        assert precondition.passed < precondition.total
        assert report.per_task_type["record_selection"].passed == report.per_task_type["record_selection"].total
        assert report.diagnostics.get("precondition_verification/write_precondition_false", 0) > 0
    assert "precondition_check" in report.format()


@pytest.mark.parametrize(("temperature", "header"), [(0.0, "greedy"), (1.0, "sampled at T=1"),
                                                      (0.7, "sampled at T=0.7")])
def test_report_names_the_decoding(temperature, header):
    trajs = expert_trajectories(WarmStartData(episodes=4, first_seed=1000))
    stats = {"tool_call_turns": 1, "malformed_turns": 0, "completion_tokens": 10, "generate_seconds": 1.0}
    report = summarise("expert", "-", trajs, stats, 1.0, None, temperature)
    assert report.format().splitlines()[0].endswith(f"4 test episodes, {header}")
    assert report.to_dict()["temperature"] == temperature


@pytest.mark.parametrize("setting", ["unset", "a directory", "missing", "a file", "a link to a file"])
def test_the_default_cache_is_trace_agent_cache_when_that_can_be_a_directory(tmp_path, monkeypatch, setting):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "afile")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    value = {"unset": None, "a directory": tmp_path, "missing": tmp_path / "new" / "cache",
             "a file": tmp_path / "afile", "a link to a file": tmp_path / "link"}[setting]
    if value is None:
        monkeypatch.delenv("TRACE_AGENT_CACHE", raising=False)
    else:
        monkeypatch.setenv("TRACE_AGENT_CACHE", str(value))
    if setting in ("a file", "a link to a file"):   # a job says so, instead of failing on FileExistsError
        with pytest.raises(FailedPrecondition, match=f"TRACE_AGENT_CACHE={value} is not a directory"):
            default_cache_dir()
    else:
        assert default_cache_dir() == (value or tmp_path / "home" / ".cache" / "trace" / "agents")
