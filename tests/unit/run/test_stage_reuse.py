"""Which stages a re-run reuses: a completed stage is reused while its config (and everything
upstream) is unchanged, and the rollout stage's inputs include the key of the agent the base-agent
name resolves to, so a rebuilt base agent re-runs every stage instead of mixing its results with
the old agent's episodes."""

from __future__ import annotations

import pytest

from trace_common.agents.resolve import base_agent_key
from trace_common.artifacts import open_store
from trace_common.errors import InvalidArgument
from tracectl.run.config import RunConfig
from tracectl.run.manifest import STAGES, Manifest
from tracectl.run.pipeline import Pipeline


class Recording(Pipeline):
    """Every stage method records its call and returns an empty result."""

    key: str | None = "a"

    def base_agent_identity(self):
        return {"base_agent_key": self.key}

    def __getattribute__(self, name):
        if name.startswith("stage_") and name.removeprefix("stage_") in STAGES:
            return lambda: (self.calls.append(name.removeprefix("stage_")), {})[1]
        return super().__getattribute__(name)


def _run(store, key, cfg, manifest=None) -> tuple[list[str], Manifest]:
    p = Recording(cfg, runner=None, store=store, manifest=manifest or Manifest(run_id=cfg.run_id))
    p.calls, p.key = [], key
    p.run()
    return p.calls, p.manifest


@pytest.mark.parametrize(("first_key", "second_key", "change", "rerun"), [
    ("a", "a", {}, []),                                         # nothing changed: every stage reused
    ("a", "b", {}, list(STAGES)),                               # a rebuilt base agent: everything re-runs
    ("a", None, {}, list(STAGES)),                              # now served over HTTP
    ("a", "a", {"gates": {"config": {"max_steps": 3}}}, ["gates", "evaluation", "report"]),
])
def test_a_rerun_reuses_exactly_the_stages_whose_inputs_are_unchanged(tmp_path, first_key, second_key, change,
                                                                      rerun):
    store = open_store(tmp_path.as_uri())
    cfg = RunConfig.model_validate({"run_id": "reuse", "target": {"env": "store"}})
    calls, manifest = _run(store, first_key, cfg)
    assert calls == list(STAGES)
    calls, _ = _run(store, second_key, RunConfig.model_validate({**cfg.model_dump(), **change}), manifest)
    assert calls == rerun


def test_base_agent_key_names_the_build_and_follows_a_model_directory(tmp_path):
    from trace_common.agents.shipped_files import read_record, shipped_dir

    record = read_record(shipped_dir("micro"))
    assert base_agent_key("micro") == record["key"]  # the shipped artifact is what `micro` resolves to today
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    first = base_agent_key(str(model))
    (model / "model.safetensors").write_bytes(b"x" * 8)
    assert first and base_agent_key(str(model)) not in (None, first)
    assert base_agent_key("no-such-agent") is None
    with pytest.raises(InvalidArgument, match="base_agent.name"):  # a clean error, not a traceback
        base_agent_key("~no-such-user-trace/model")
