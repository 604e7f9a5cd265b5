"""The sequential stop rule of calibration (calibration_stop.py), calibration in waves (calibration.py),
the job's own calibration sampling (calibration_policy.sampling_params) and the calibration-batches
artifact an accepted level leaves in the registry (registry.py, trace_common/env/calibration_batches.py).

Calibration here plays a real one-turn environment with a factory whose replies carry a fixed reward
per (seed, sample), so every group's rewards -- and so the rule's decisions -- are known in advance."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest

from services.environment.calibration import calibrate
from services.environment.calibration_policy import CalibrationSampling, sampling_params
from services.environment.calibration_stop import decide
from services.environment.registry import EnvironmentRegistry
from services.environment.service import calibration_batches
from services.environment.validation import Check, ValidationReport
from tests.unit.env.toy_env import SeededEnv
from trace_common.artifacts import open_store
from trace_common.env import Message, MessageAction, Observation, PolicyInfo, StepResult
from trace_common.env.calibration_batches import read_calibration_batches
from trace_common.errors import InvalidArgument
from trace_common.specs import SamplingModel

BAND = (0.2, 0.6)


@pytest.mark.parametrize("means, informative, total, rule, expected", [
    # exact: the band is out of reach even if every unplayed group averaged 1 (or 0)
    ([0.0] * 7, 7, 8, "exact", ("too hard", "exact")),            # upper = 1/8 < 0.2
    ([0.0] * 6, 6, 8, "exact", None),                             # upper = 2/8: still reachable
    ([1.0] * 5, 0, 8, "exact", ("too uniform", "exact")),         # 3 informative at most: < 50 %
    ([1.0] * 5, 5, 8, "exact", ("too easy", "exact")),            # lower = 5/8 > 0.6
    # predictive: a one-sided 95 % prediction bound of the final mean, from min_groups on
    ([0.05, 0.0, 0.1, 0.05], 4, 8, "predictive", ("too hard", "predictive")),
    ([0.05, 0.0, 0.1, 0.05], 4, 8, "exact", None),                # the exact bound alone waits
    ([0.15, 0.1, 0.3, 0.2], 4, 8, "predictive", None),            # could still land in the band
    ([0.05, 0.0, 0.1], 3, 8, "predictive", None),                 # fewer than min_groups played
    ([0.9, 0.95, 0.85, 0.9], 4, 8, "predictive", ("too easy", "predictive")),
    ([0.0] * 7, 7, 8, "none", None),                              # never stops
    ([0.0] * 8, 8, 8, "exact", None),                             # nothing left to play
])
def test_the_rule_settles_only_what_the_unplayed_groups_cannot_change(means, informative, total, rule, expected):
    got = decide(means, informative, total, BAND, 0.5, rule=rule, min_groups=4)
    assert (None if got is None else (got.verdict, got.rule)) == expected


class OneTurn(SeededEnv):
    """One assistant message; its reward is the number the message says (the factory decides it)."""

    name: ClassVar[str] = "one-turn"
    version: ClassVar[str] = "1.0.0"
    default_max_turns: ClassVar[int] = 1

    def splits(self):
        return {"train": range(0, 1000)}

    def tool_schemas(self):
        return []

    def reset(self, seed: int) -> Observation:
        self._begin(seed)
        self.said = 0.0
        return Observation(messages=[Message.system("Say a number."), Message.user("Go.")], task_id=str(seed),
                           seed=seed)

    def step(self, action: Any) -> StepResult:
        assert isinstance(action, MessageAction)
        self.said, self._done = float(action.content), True
        return StepResult(observation=[Message.user("Thanks.")], done=True)

    def reward(self) -> float:
        return self.said

    def close(self) -> None:
        pass


class Table:
    """A calibration factory whose episode (seed, sample) replies with reward[g][k] (g: the seed's group)."""

    def __init__(self, rewards: list[list[float]], seeds: list[int]):
        self.rewards, self.group = rewards, {s: g for g, s in enumerate(seeds)}
        self.info = PolicyInfo(model="table")
        self.played: list[tuple[int, int]] = []

    def for_episode(self, env, seed, k, sampling_seed):
        async def policy(messages, tools):
            self.played.append((seed, k))
            return Message.assistant(str(self.rewards[self.group[seed]][k]))
        return policy


def _calibrate(rewards, rule, concurrency):
    seeds = list(range(10, 10 + len(rewards)))
    factory = Table(rewards, seeds)
    result = asyncio.run(calibrate(OneTurn, factory, seeds, len(rewards[0]), BAND, 0.5, stop=rule,
                                   concurrency=concurrency, min_groups=4))
    return result, factory


HOPELESS = [[0.0, 0.0, 0.1, 0.0]] * 4 + [[0.0, 0.0, 0.0, 0.0]] * 4     # mean ~0.01: clearly too hard
BORDERLINE = [[0.0, 0.5, 0.25, 0.5]] * 8                                 # mean 0.31: accepted
UNIFORM = [[0.4] * 4] * 8                                                # in band, never informative


@pytest.mark.parametrize("rewards, rule, concurrency, played, passed, reason", [
    (HOPELESS, "predictive", 16, 4, False, "predictive upper bound"),    # abandoned after its first wave
    (HOPELESS, "exact", 16, 8, False, ""),                               # arithmetic alone never settles it
    (HOPELESS, "none", 16, 8, False, ""),
    (HOPELESS, "predictive", 32, 8, False, ""),                          # one wave holds every group
    (BORDERLINE, "predictive", 8, 8, True, ""),                          # an accepted level plays them all
    (UNIFORM, "exact", 8, 6, False, "could be informative"),            # waves of 2: 0 of 6 informative
])
def test_calibration_plays_whole_waves_and_counts_only_what_it_played(rewards, rule, concurrency, played, passed,
                                                                      reason):
    result, factory = _calibrate(rewards, rule, concurrency)
    size = len(rewards[0])
    assert result.played_groups == played and len(result.rewards) == played
    assert len(factory.played) == played * size == len(result.trajectories)       # episodes played = counted
    assert sorted(factory.played) == sorted((10 + g, k) for g in range(played) for k in range(size))
    assert result.passed is passed and result.stopped_early is (played < len(rewards))
    assert reason in result.stop_reason and bool(result.stop_reason) is result.stopped_early
    assert result.to_dict()["played_groups"] == played and "trajectories" not in result.to_dict()


@pytest.mark.parametrize("rewards", [HOPELESS, BORDERLINE, UNIFORM, [[0.1, 0.3, 0.2, 0.9]] * 8,
                                     [[0.0] * 4] * 3 + [[1.0, 0.0, 1.0, 1.0]] * 5])
def test_the_exact_rule_never_changes_a_verdict(rewards):
    full, _ = _calibrate(rewards, "none", 8)
    early, _ = _calibrate(rewards, "exact", 8)
    assert early.passed == full.passed and early.played_groups <= full.played_groups


@pytest.mark.parametrize("job, expected", [
    (None, {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256}),          # the settings
    (SamplingModel(max_tokens=96), {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 96}),
    (SamplingModel(temperature=0.7, top_p=0.9, top_k=20, max_tokens=150, seed=3),
     {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 150}),
    (SamplingModel(temperature=0.0), {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256}),  # 0: unset
])
def test_a_jobs_calibration_sampling_replaces_the_settings(job, expected):
    params = sampling_params(CalibrationSampling(), job)
    assert {k: getattr(params, k) for k in expected} == expected and params.seed is None


def test_an_impossible_calibration_sampler_is_refused():
    with pytest.raises(InvalidArgument, match="spec.calibration_sampling"):
        sampling_params(CalibrationSampling(), SamplingModel(max_tokens=40_000))


SAMPLED = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 8}


@pytest.mark.parametrize("status, sampling, stored", [
    ("ACCEPTED", SAMPLED, True),
    ("REJECTED", SAMPLED, False),     # only an accepted level's episodes can train an adapter
    ("ACCEPTED", {}, False),          # a policy that reports no sampling (the scripted stand-in)
])
def test_the_registry_keeps_an_accepted_levels_calibration_episodes(tmp_path, status, sampling, stored):
    result, _ = _calibrate(BORDERLINE, "none", 8)
    result.sampling = dict(sampling)
    report = ValidationReport(status=status, reasons=[], checks=[Check(
        name="calibration", passed=status == "ACCEPTED",
        details={**result.to_dict(), "split": "train", "max_turns": 1})],
        calibration_policy_info={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "table"}, config={"seed": 0})
    report._calibration = result
    store = open_store(tmp_path.as_uri())
    record = EnvironmentRegistry(store).register(
        run_id="r", capability="one_turn", mode="GENERATION_MODE_LIBRARY", source="# one turn\n",
        report=report.model_dump(mode="json"), target={}, tool_schemas=[], calibration=calibration_batches(report))
    written = json.loads(store.get_bytes(record.validation["key"]))
    assert bool(record.calibration_batches) is stored and written["calibration_batches"] == record.calibration_batches
    reloaded = EnvironmentRegistry(store)
    reloaded.load()
    assert reloaded.get("one_turn", "1").calibration_batches == record.calibration_batches   # in the manifest
    if not stored:
        return
    manifest, trajectories = read_calibration_batches(store, record.calibration_batches["key"])
    assert [t.model_dump() for t in trajectories] == [t.model_dump() for t in result.trajectories]
    assert (manifest.environment, manifest.version, manifest.code_sha256) == ("one_turn", "1", record.code["sha256"])
    assert manifest.seeds == result.seeds and manifest.group_size == 4 and manifest.episodes == 32
    assert manifest.sampling.model_dump() == SAMPLED and manifest.split == "train" and manifest.max_turns == 1
    assert manifest.token_ids is False and record.calibration_batches["token_ids"] is False   # text replies only
