"""Units of a stage (the evaluation's arms): a unit a killed or failed attempt finished is reused by
the re-run, and only then -- `--from`, another config or a re-run upstream stage runs it again."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_common.artifacts import open_store
from tracectl.run.config import load_config
from tracectl.run.manifest import STAGES, Manifest
from tracectl.run.pipeline import Pipeline

QUICK = Path(__file__).resolve().parents[3] / "examples" / "quick.yaml"


class Boom(RuntimeError):
    pass


class Recorder(Pipeline):
    """A pipeline whose stages only count: evaluation runs units "arm a" and "arm b" and can be made to
    fail between them (a kill in the middle of the stage)."""

    calls: list[str]
    fail_after_a: bool = False

    def _stage(self, name: str):
        self.calls.append(name)
        return {"result": {"ran": name}}

    def stage_evaluation(self):
        a = self.unit("evaluation", "arm a", lambda: (self.calls.append("arm a"), {"job": "ja"})[1])
        if self.fail_after_a:
            raise Boom("killed between the arms")
        b = self.unit("evaluation", "arm b", lambda: (self.calls.append("arm b"), {"job": "jb"})[1])
        return {"jobs": [a["job"], b["job"]], "result": {"arms": {"a": a, "b": b}}}


for _s in STAGES:
    if _s != "evaluation":
        setattr(Recorder, f"stage_{_s}", lambda self, _s=_s: self._stage(_s))


def pipeline(tmp_path, manifest: Manifest | None = None, **overrides) -> Recorder:
    cfg = load_config(QUICK, overrides or None)
    store = open_store(tmp_path.as_uri())
    m = manifest or Manifest.load(store, cfg.run_id) or Manifest(run_id=cfg.run_id)
    p = Recorder(cfg=cfg, runner=None, store=store, manifest=m)
    p.calls = []
    return p


@pytest.mark.parametrize("rerun, overrides, expected_calls", [
    ({}, {}, ["arm b", "report"]),                                         # the finished arm is kept
    ({"from_stage": "evaluation"}, {}, ["arm a", "arm b", "report"]),        # --from: everything again
    ({}, {"evaluation": {"limit": 12}}, ["arm a", "arm b", "report"]),      # another config
    ({"from_stage": "gates"}, {}, ["gates", "arm a", "arm b", "report"]),   # new inputs upstream
])
def test_finished_units_survive_a_kill_only_for_the_same_work(tmp_path, rerun, overrides, expected_calls):
    first = pipeline(tmp_path)
    first.fail_after_a = True
    with pytest.raises(Boom):
        first.run()
    assert first.calls == ["rollout", "analysis", "environments", "adapters", "gates", "arm a"]
    stored = Manifest.load(first.store, first.cfg.run_id)
    assert stored.stages["evaluation"].status == "failed" and stored.stages["evaluation"].partial == {
        "arm a": {"job": "ja"}}

    again = pipeline(tmp_path, **overrides)
    m = again.run(**rerun)
    assert again.calls == expected_calls
    ev = Manifest.load(again.store, again.cfg.run_id).stages["evaluation"]
    assert ev.status == "completed" and ev.jobs == ["ja", "jb"] and ev.result["arms"]["a"] == {"job": "ja"}
    assert ev.partial == {} and m.stages["evaluation"].partial == {}   # the stage's result holds everything now
