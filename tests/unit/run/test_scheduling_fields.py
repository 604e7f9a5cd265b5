"""The scheduling fields (config.py SCHEDULING_FIELDS: how many episodes, adapters or arms run at once,
where training runs) are not part of the stage hashes; a run recorded when they still were (the legacy
hash) resumes as it was. Stages are stand-ins that record their calls (the reuse rule itself:
test_stage_reuse.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tracectl.run.config import RunConfig
from tracectl.run.manifest import STAGES, Manifest, config_hash
from tracectl.run.pipeline import Pipeline


class CountingPipeline(Pipeline):
    def __init__(self, cfg: RunConfig, manifest: Manifest, calls: list[str]):
        super().__init__(cfg, runner=None, store=None, manifest=manifest)  # type: ignore[arg-type]
        self.calls = calls

    def base_agent_identity(self) -> dict[str, Any]:
        return {"base_agent_key": "fixed"}

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("stage_") and name.removeprefix("stage_") in STAGES:
            calls = object.__getattribute__(self, "calls")
            return lambda: calls.append(name.removeprefix("stage_")) or {}
        return object.__getattribute__(self, name)


@pytest.fixture
def saved(monkeypatch):
    monkeypatch.setattr(Manifest, "save", lambda self, store: None)


def run(cfg: dict, manifest: Manifest) -> list[str]:
    calls: list[str] = []
    CountingPipeline(RunConfig(run_id="r", **cfg), manifest, calls).run()
    return calls


CHANGES = [
    # (what changed between the two runs, the stages the second run runs again)
    ({}, []),
    ({"rollout": {"concurrency": 3}}, []),
    ({"training": {"parallel": 5, "executor": "kubernetes"}}, []),
    ({"evaluation": {"parallel": 1}}, []),
    ({"rollout": {"samples": 3}}, list(STAGES)),
    ({"training": {"grpo": {"learning_rate": 1e-5}}}, ["adapters", "gates", "evaluation", "report"]),
    ({"evaluation": {"limit": 7}}, ["evaluation", "report"]),
]


@pytest.mark.parametrize("change, rerun", CHANGES, ids=[str(c[0]) or "nothing" for c in CHANGES])
def test_only_a_changed_computation_re_runs_its_stage_and_those_after(saved, change, rerun):
    manifest = Manifest(run_id="r")
    assert run({}, manifest) == list(STAGES)
    assert run(change, manifest) == rerun


def test_a_run_recorded_under_the_legacy_hash_resumes_and_is_rehashed(saved):
    """A manifest written before the scheduling fields left the hashes holds the legacy hashes."""
    cfg = RunConfig(run_id="r")
    manifest = Manifest(run_id="r")
    run({}, manifest)
    current = {stage: manifest.stages[stage].config_hash for stage in STAGES}
    upstream: list[Any] = []
    for stage in STAGES:   # rewrite every record as the earlier code hashed it
        upstream += [cfg.section(stage, legacy=True)] + ([{"base_agent_key": "fixed"}] if stage == "rollout" else [])
        manifest.stages[stage].config_hash = config_hash(*upstream)
    assert all(manifest.stages[stage].config_hash != current[stage] for stage in STAGES)
    assert run({}, manifest) == []                        # nothing re-run
    assert {stage: manifest.stages[stage].config_hash for stage in STAGES} == current   # recorded anew
    assert run({"evaluation": {"parallel": 1}}, manifest) == []   # and now scheduling changes are free too
    # a legacy record whose configuration did change is still re-run
    manifest.stages["evaluation"].config_hash = "0" * 16
    assert run({}, manifest) == ["evaluation", "report"]
