"""Calibration episodes as an adapter's first GRPO batches (issue 31, item 1), end to end on real
parts: a tiny warm-started model calibrates `PickEnv` through the environment service's own
calibration (`calibrate` with a `ModelCalibrationFactory`), the registry stores the accepted
level's calibration-batches artifact, and a real GRPO run takes it as `initial_batches_uri`.

Checked: the first iterations train on exactly those episodes (the same completion token ids,
groups of num_generations, informative ones only), play nothing, and never draw a calibration seed
afterwards; every environment reset is an episode counted once (calibration episodes where they
were played, the trainer's rollouts_total for what it played, resampled groups included); resume
stays exact; episodes played with other sampling settings, on another environment version or by
another policy are refused before anything trains."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import load

from services.environment.calibration import calibrate
from services.environment.calibration_policy import CalibrationSampling, ModelCalibration
from services.environment.registry import EnvironmentRegistry
from services.environment.service import calibration_batches
from services.environment.settings import EnvironmentSettings
from services.environment.validation import Check, ValidationReport
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.lora import adapter_state_bytes
from services.trainer.grpo.session import make_trainer
from tests.unit.trainer.grpo.helpers import PickEnv, tiny_tokenizer, warm_model
from trace_common.artifacts import open_store
from trace_common.errors import ArtifactCorrupted, FailedPrecondition
from trace_common.model_refs import ModelRoots
from trace_common.specs import PolicyRefModel

PREFIX = "runs/r/adapters/pick"
SAMPLING = CalibrationSampling(temperature=1.0, max_tokens=4)


class Counted:
    """A PickEnv that counts its resets (= episodes played) in a shared list."""

    def __init__(self, counter: list[int], **kw):
        self.env = PickEnv(**kw)
        self.counter = counter

    def reset(self, seed):
        self.counter.append(seed)
        return self.env.reset(seed)

    def close(self):
        pass

    def __getattr__(self, name):
        return getattr(self.env, name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The warm-started tiny model as a model directory: the base agent both services load."""
    directory = tmp_path_factory.mktemp("initial-batches") / "pick-base"
    warm_model("pick").save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return str(directory)


def play_calibration(counter: list[int], model: str, *, groups: int, group_size: int, good: str, stop: str = "none",
                     band=(0.0, 1.0)):
    """Calibrate PickEnv with the base model as the environment service does (its model calibration,
    in-process backend, waves of 4 groups of 4); returns the CalibrationResult and the factory."""
    calibration = ModelCalibration(SAMPLING, allowed=ModelRoots.of(EnvironmentSettings()))
    seeds = list(range(100, 100 + 7 * groups, 7))
    try:
        maker = calibration(PolicyRefModel(backend="POLICY_BACKEND_IN_PROCESS", model=model))
        asyncio.run(maker.prepare())
        factory = maker()
        result = asyncio.run(calibrate(lambda: Counted(counter, good=good), factory, seeds, group_size, band,
                                       0.0, stop=stop, concurrency=16))
        asyncio.run(maker.release())
    finally:
        asyncio.run(calibration.close())
    return result, factory


def calibrated(store, counter: list[int], model: str, *, groups: int, group_size: int, good: str = "abcdefg",
               attempts: list[dict] | None = None) -> tuple[str, list]:
    """`play_calibration`, then register the accepted level with its calibration batches (and the
    earlier `attempts` records); returns (their URI, the calibration's trajectories)."""
    result, factory = play_calibration(counter, model, groups=groups, group_size=group_size, good=good)
    report = ValidationReport(status="ACCEPTED", reasons=[], attempts=[*(attempts or []), {"reasons": []}], checks=[Check(
        name="calibration", passed=True, details={**result.to_dict(), "split": "train", "max_turns": 1})],
        calibration_policy_info=factory.describe(), config={"seed": 0})
    report._calibration = result
    record = EnvironmentRegistry(store).register(
        run_id="r", capability="pick", mode="GENERATION_MODE_LIBRARY", source="# pick\n",
        report=report.model_dump(mode="json"), target={}, tool_schemas=[], calibration=calibration_batches(report))
    written = json.loads(store.get_bytes(record.validation["key"]))
    assert written["calibration_batches"] == record.calibration_batches   # the report names the artifact
    return record.calibration_batches["uri"], result.trajectories


def train(store, cfg: GRPOConfig, counter: list[int], policy_model: str, *, good: str = "abcdefg", stop_after=None,
          resume=False, environment=("pick", "1"), prefix=PREFIX):
    seen: dict[int, list] = {}
    rows: list[dict] = []
    trainer = make_trainer(cfg, warm_model("pick"), tiny_tokenizer(), lambda: Counted(counter, good=good),
                           store=store, prefix=prefix, capability="pick", model_label=policy_model,
                           environment=environment,
                           on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None,
                           should_stop=lambda: stop_after is not None and len(rows) >= stop_after)
    update = trainer._update

    def observed(episodes):       # what each iteration trains on, as the loss receives it
        seen[trainer.state.iteration] = list(episodes)    # 0-based: counted up after the update
        return update(episodes)
    trainer._update = observed
    result = trainer.train(resume=resume, write_adapter=False)
    return trainer, result, rows, seen


def config(uri: str, **kw) -> GRPOConfig:
    base = dict(max_steps=3, groups_per_batch=2, num_generations=4, max_completion_length=4, temperature=1.0,
                learning_rate=5e-3, seed=5, lora_r=4, deterministic=True, early_stop_uninformative_iterations=0,
                initial_batches_uri=uri)
    return GRPOConfig(**{**base, **kw})


def completions(traj) -> list[tuple[int, ...]]:
    return [tuple(r.completion_token_ids) for r in traj.turns]


@pytest.mark.parametrize("groups, group_size, kw, initial_iterations", [
    (4, 4, {}, 2),                                                   # 4 groups of 4: two batches of 2 groups
    (2, 8, {"groups_per_batch": 3, "max_steps": 2}, 2),             # each seed's 8 samples -> 2 groups of 4
    (4, 4, {"max_resample_rounds": 2}, 2),                           # dropped groups replaced by played seeds
])
def test_calibration_episodes_are_the_first_batches_and_counted_once(tmp_path, model_dir, groups, group_size, kw,
                                                                     initial_iterations):
    store = open_store(tmp_path.as_uri())
    counter: list[int] = []
    uri, calibration = calibrated(store, counter, model_dir, groups=groups, group_size=group_size)
    assert len(counter) == groups * group_size
    cfg = config(uri, **kw)
    trainer, result, rows, seen = train(store, cfg, counter, model_dir)
    G, B = cfg.num_generations, cfg.groups_per_batch
    by_group = [calibration[i:i + G] for i in range(0, len(calibration), G)]     # play order = batch order
    for it in range(initial_iterations):
        batch = by_group[it * B:(it + 1) * B]
        informative = [g for g in batch if len({t.reward for t in g}) > 1]
        trained = [e for e in seen.get(it, []) if e.off_policy]
        # the kept calibration groups, token for token, and nothing else from calibration
        assert sorted(tuple(tuple(t.completion_ids) for t in e.turns) for e in trained) == \
            sorted(tuple(completions(t)) for g in informative for t in g)
        assert rows[it]["initial_batch_episodes"] == len(batch) * G
    calibration_seeds = {t.seed for t in calibration}
    trainer_resets = counter[groups * group_size:]
    assert not calibration_seeds & {s for s in trainer_resets}               # never replayed
    # every episode played is counted once: calibration's where it was played, the trainer's in rollouts_total
    final = rows[-1]
    assert final["rollouts_total"] == len(trainer_resets) == sum(r["episodes"] for r in rows)
    assert final["initial_batch_episodes_total"] == min(len(calibration), cfg.max_steps * B * G)
    assert result.iterations == cfg.max_steps and trainer.state.seed_cursor * G == len(trainer_resets)
    if not kw.get("max_resample_rounds"):
        assert all(r["episodes"] == 0 for r in rows[:initial_iterations])


def test_resume_through_the_initial_batches_is_exact(tmp_path, model_dir):
    store = open_store(tmp_path.as_uri())
    uri, _ = calibrated(store, [], model_dir, groups=4, group_size=4)
    cfg = config(uri, max_steps=4, save_steps=1)
    straight, res_a, rows_a, _ = train(store, cfg, [], model_dir, prefix=f"{PREFIX}-a")
    _, res_b1, rows_b1, _ = train(store, cfg, [], model_dir, stop_after=1, prefix=f"{PREFIX}-b")   # stopped in the initial batches
    resumed, res_b2, rows_b2, _ = train(store, cfg, [], model_dir, resume=True, prefix=f"{PREFIX}-b")
    assert res_b1.iterations == 1 and res_b2.iterations == res_a.iterations == 4
    a, b = load(adapter_state_bytes(straight.model)), load(adapter_state_bytes(resumed.model))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("reward_mean", "episodes", "initial_batch_episodes", "rollouts_total", "initial_batch_episodes_total")
    assert [{k: r[k] for k in keys} for r in rows_a] == [{k: r[k] for k in keys} for r in rows_b1 + rows_b2]


@pytest.mark.parametrize("change, fragment", [
    ({"temperature": 0.7}, "temperature"),
    ({"top_p": 0.9}, "top_p"),
    ({"top_k": 5}, "top_k"),
    ({"max_completion_length": 8}, "completion cap"),
    ({"max_turns": 2}, "turn budget"),
    ({"train_split": "test"}, "seeds of split"),
    ({"num_generations": 3}, "groups of num_generations=3"),
    ({"environment": ("pick", "2")}, "pick v1, this job trains on pick v2"),
    ({"environment": ("pick", "")}, "must name its environment's version"),
    ({"policy_model": "another-base"}, "the policy"),
])
def test_episodes_played_otherwise_are_refused(tmp_path, model_dir, change, fragment):
    store = open_store(tmp_path.as_uri())
    uri, _ = calibrated(store, [], model_dir, groups=2, group_size=4)
    job = {k: change.pop(k) for k in ("environment", "policy_model") if k in change}
    with pytest.raises(FailedPrecondition, match=fragment):
        train(store, config(uri, **change), [], job.pop("policy_model", model_dir), **job)


def test_replaced_episodes_are_refused(tmp_path, model_dir):
    store = open_store(tmp_path.as_uri())
    uri, _ = calibrated(store, [], model_dir, groups=2, group_size=4)
    key = "runs/r/environments/pick/v1/calibration.jsonl"
    store.put_bytes(key, store.get_bytes(key) + b"\n")   # still valid JSONL, but not the bytes the manifest recorded
    with pytest.raises(ArtifactCorrupted, match="differs from"):
        train(store, config(uri), [], model_dir)


@pytest.mark.parametrize("tamper, fragment", [
    ("episodes elsewhere", "not calibration.jsonl beside it"),     # a manifest naming another run's episodes
    ("oversized manifest", "more than a calibration-batches manifest holds"),   # e.g. a model's weights
])
def test_a_manifest_that_is_not_one_is_refused_before_its_bytes_are_read(tmp_path, model_dir, tamper, fragment):
    import json

    from trace_common.env.calibration_batches import MAX_MANIFEST_BYTES

    store = open_store(tmp_path.as_uri())
    uri, _ = calibrated(store, [], model_dir, groups=2, group_size=4)
    key = "runs/r/environments/pick/v1/calibration_batches.json"
    if tamper == "episodes elsewhere":
        body = json.loads(store.get_bytes(key))
        data = store.get_bytes(body["trajectories"]["key"])
        other = store.put_bytes("runs/other/rollouts/t.jsonl", data)
        body["trajectories"] = {"uri": other.uri, "key": other.key, "sha256": other.sha256, "size": other.size}
        store.put_bytes(key, json.dumps(body).encode())
    else:
        store.put_bytes(key, b" " * (MAX_MANIFEST_BYTES + 1))
    with pytest.raises(ArtifactCorrupted, match=fragment):
        train(store, config(uri), [], model_dir)


def test_traces_budget_counts_every_episode_played_once(tmp_path, model_dir):
    """A tiny run's calibration and adapter, as trace_budget counts them: a hopeless level abandoned by
    the stop rule (its played episodes only), the accepted level (its episodes once, although the
    adapter trains on them), the adapter's own episodes (resampled groups included)."""
    from tests.unit.run.fakes import rollout_stage_records, trajectory
    from tracectl.evaluation.budget import trace_budget
    from tracectl.run.manifest import Manifest

    store = open_store(tmp_path.as_uri())
    counter: list[int] = []
    hopeless, _ = play_calibration(counter, model_dir, groups=8, group_size=4, good="", stop="predictive",
                                   band=(0.2, 0.6))
    assert hopeless.stopped_early and hopeless.played_groups == 4 and len(counter) == 16   # its first wave only
    uri, calibration = calibrated(store, counter, model_dir, groups=4, group_size=4,
                                  attempts=[{"reasons": [hopeless.stop_reason], "calibration_episodes": len(counter)}])
    _, _, rows, _ = train(store, config(uri, max_resample_rounds=1), counter, model_dir)
    m = Manifest(run_id="r")
    rollout_stage_records(store, m, [trajectory(s, False) for s in range(5)])
    m.stages["environments"].result = {"environments": [{"capability": "pick", "name": "pick",
                                                         "status": "VALIDATION_STATUS_ACCEPTED",
                                                         "validation_report": {"uri": store.uri_for(
                                                             "runs/r/environments/pick/v1/validation.json")}}]}
    m.stages["adapters"].outputs = {"pick": "file:///a"}
    m.stages["adapters"].result = {"metrics": {"pick": rows[-1]}}
    m.stages["gates"].result = {"metrics": {"rollouts_total": 0.0, "warm_start_rollouts": 0.0,
                                            "prompt_tokens_total": 0.0, "completion_tokens_total": 0.0}}
    from services.trainer.configs import validate_training_config
    from tracectl.evaluation.budget import GatesCounts, GrpoCounts

    grpo, gates = (validate_training_config(kind, {}, "config").model_dump()   # the trainer's defaults, parsed
                   for kind in ("TRAINING_KIND_ADAPTER", "TRAINING_KIND_GATES"))
    b = trace_budget(store, m.stages, lambda: GrpoCounts.model_validate(grpo), lambda: GatesCounts.model_validate(gates))
    c = b.components
    assert c["calibration"].episodes + c["adapters"].episodes == len(counter)      # every reset, once
    assert b.total_episodes == 5 + len(counter)
    assert c["adapters"].trained_calibration_episodes == len(calibration) == 16


@pytest.mark.parametrize("split, exclude", [
    (range(0, 7), [3, 5]),
    (range(100, 200), list(range(100, 200, 3))),
    ([11, 4, 9, 30, 2], [4, 30]),
    (range(0, 10), [50]),               # a seed outside the split excludes nothing
])
def test_the_schedule_skips_the_calibration_seeds_and_is_otherwise_unchanged(split, exclude):
    from services.trainer.grpo.seeds import SeedSchedule

    plain, skipping = SeedSchedule(split, 7), SeedSchedule(split, 7, exclude=exclude)
    n, m = len(split), len(split) - len(set(exclude) & set(split))
    for epoch in range(3):   # each epoch: the plain permutation with the excluded seeds left out
        assert [skipping.at(epoch * m + i) for i in range(m)] == \
            [s for s in (plain.at(epoch * n + i) for i in range(n)) if s not in exclude]
