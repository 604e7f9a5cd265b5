"""The GEPA arm without gRPC: the TRACE adapter, its feedback records, the budget, and the real
`gepa.optimize` loop driven through it.

`FakeRollouts` stands in for the rollout service (it returns trajectories whose reward depends on
the system prompt and the task, like a real agent would); the reflection model is a plain
callable. Neither is under test: the adapter, the budget rule and the wiring into gepa are.
"""

from __future__ import annotations

import json

import pytest
from gepa.core.adapter import EvaluationBatch
from google.protobuf.timestamp_pb2 import Timestamp

from trace_common.env import Diagnostic, EnvInfo, Message, PolicyInfo, Termination, ToolCall, Trajectory
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.evaluation.gepa import (
    BudgetExhausted,
    GepaSettings,
    PlayedBatch,
    RolloutBudget,
    TraceAdapter,
    feedback_record,
    optimize_prompt,
    rollout_job,
    split_tasks,
    training_tasks,
    transcript,
)
from tracectl.run.config import RunConfig
from tracectl.run.jobs import StageFailed
from tracectl.run.manifest import Manifest
from tracectl.run.pipeline import Pipeline
from tracectl.run.results import dump

R = messages("rollout")
SEED_PROMPT = "You are a store support agent. Use the tools to help the user."
BETTER = "You are a store support agent. Use the tools. Always verify the order status before acting."
SECRET = "ANSWER-IN-INFO-42"


def traj(seed: int, reward: float, *, system: str = SEED_PROMPT, failure: str | None = None,
         diagnostics: tuple[Diagnostic, ...] = (), turns: int = 1, text: str = "Done.") -> Trajectory:
    msgs = [Message.system(system), Message.user(f"Please cancel order #{seed}.")]
    for k in range(turns):
        msgs.append(Message.assistant(None, [ToolCall.create(f"c{k}", "get_order", {"order_id": f"#{seed}"})]))
        msgs.append(Message.tool(f"c{k}", f"order #{seed}: status pending (lookup {k})"))
    msgs.append(Message.assistant(text))
    return Trajectory(task_id=f"store-{seed}", seed=seed, env=EnvInfo(name="store", version="1"),
                      policy=PolicyInfo(model="fake"), messages=msgs, reward=reward, success=reward == 1.0,
                      termination=Termination.DONE, failure_reason=failure, diagnostics=list(diagnostics),
                      info={"answer": SECRET})


class FakeRollouts:
    """Stand-in for the rollout service: one call = one job; reward = reward_fn(seed, prompt)."""

    def __init__(self, reward_fn=lambda seed, prompt: 0.0, fail_on_call: int | None = None):
        self.reward_fn = reward_fn
        self.fail_on_call = fail_on_call
        self.calls: list[tuple[list[str], str, str]] = []

    def __call__(self, ids: list[str], prompt: str, label: str) -> PlayedBatch:
        self.calls.append((list(ids), prompt, label))
        if self.fail_on_call == len(self.calls):
            raise StageFailed(f"rollout job {len(self.calls)} FAILED: UNAVAILABLE policy backend down")
        trajs = [traj(int(i), self.reward_fn(int(i), prompt), failure=None if self.reward_fn(int(i), prompt) == 1.0
                      else "order cancelled without checking its status") for i in ids]
        return PlayedBatch(f"rollout-{len(self.calls)}", f"file:///fake/{len(self.calls)}.jsonl", trajs)

    @property
    def episodes(self) -> int:
        return sum(len(ids) for ids, _, _ in self.calls)


def needs_verify(seed: int, prompt: str) -> float:
    """Every third task is easy; the rest pass only with a prompt that says to verify."""
    return 1.0 if seed % 3 == 0 or "verify" in prompt else 0.0


class Reflector:
    """Stand-in for the reflection model: proposes BETTER in gepa's ``` format, records prompts."""

    def __init__(self, reply: str = f"Here is the new prompt:\n```\n{BETTER}\n```", fail: bool = False):
        self.reply, self.fail = reply, fail
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if self.fail:
            raise StageFailed("reflection endpoint down")
        return self.reply


# -- adapter.evaluate ------------------------------------------------------------------------------
@pytest.mark.parametrize(("batch", "played", "capture"), [
    (["1", "2", "3"], ["1", "2", "3"], True),
    (["4", "5", "4"], ["4", "5"], False),      # gepa pads minibatches with repeats: played once
    (["7"], ["7"], True),
])
def test_evaluate_runs_one_job_and_scores_rewards(batch, played, capture):
    rollouts = FakeRollouts(lambda seed, prompt: 1.0 if seed % 2 else 0.25)
    adapter = TraceAdapter(rollouts, RolloutBudget(10))
    out = adapter.evaluate(batch, {"system_prompt": BETTER}, capture_traces=capture)
    assert isinstance(out, EvaluationBatch)
    assert rollouts.calls == [(played, BETTER, "gepa 1")]
    assert out.scores == [1.0 if int(i) % 2 else 0.25 for i in batch]
    assert [o["task_id"] for o in out.outputs] == [f"store-{i}" for i in batch]
    assert out.num_metric_calls == len(played) == adapter.budget.spent
    assert adapter.jobs == ["rollout-1"]
    if capture:
        assert [tr.seed for tr in out.trajectories] == [int(i) for i in batch]
    else:
        assert out.trajectories is None


def test_evaluate_refuses_to_cross_the_budget():
    rollouts = FakeRollouts()
    adapter = TraceAdapter(rollouts, RolloutBudget(4))
    adapter.evaluate(["1", "2", "3"], {"system_prompt": SEED_PROMPT})
    with pytest.raises(BudgetExhausted, match="exceed 4"):
        adapter.evaluate(["4", "5"], {"system_prompt": SEED_PROMPT})
    assert (adapter.budget.spent, len(rollouts.calls), adapter.fatal) == (3, 1, None)
    adapter.evaluate(["9"], {"system_prompt": SEED_PROMPT})  # what still fits is played
    assert adapter.budget.remaining == 0


@pytest.mark.parametrize(("prompt", "rollouts", "error", "fatal"), [
    ("   ", FakeRollouts(), "non-empty", False),                       # dropped proposal, not an arm failure
    (SEED_PROMPT, FakeRollouts(fail_on_call=1), "policy backend down", True),
])
def test_evaluate_errors(prompt, rollouts, error, fatal):
    adapter = TraceAdapter(rollouts, RolloutBudget(10))
    with pytest.raises(Exception, match=error):
        adapter.evaluate(["1"], {"system_prompt": prompt})
    assert (adapter.fatal is not None) == fatal


def test_a_job_missing_a_task_is_fatal():
    def play(ids, prompt, label):
        return PlayedBatch("rollout-x", "file:///x", [traj(int(ids[0]), 1.0)])
    adapter = TraceAdapter(play, RolloutBudget(10))
    with pytest.raises(StageFailed, match=r"no trajectory for tasks \['2'\]"):
        adapter.evaluate(["1", "2"], {"system_prompt": SEED_PROMPT})
    assert isinstance(adapter.fatal, StageFailed)


# -- reflective dataset ------------------------------------------------------------------------
DIAG = Diagnostic(capability="precondition_verification", event="write_precondition_false", turn=1,
                  detail={"tool": "cancel_order"})


@pytest.mark.parametrize(("trajs", "expected_seeds"), [
    ([traj(1, 0.0, failure="cancelled a shipped order", diagnostics=(DIAG,)), traj(2, 1.0), traj(3, 0.5)], [1, 3]),
    ([traj(1, 1.0), traj(2, 1.0)], [1, 2]),                   # nothing failed: every episode is shown
    ([traj(4, 0.0), traj(4, 0.0), traj(5, 1.0)], [4]),        # padded repeats appear once
])
def test_reflective_dataset_records(trajs, expected_seeds):
    adapter = TraceAdapter(FakeRollouts(), RolloutBudget(10))
    batch = EvaluationBatch(outputs=[{}] * len(trajs), scores=[tr.reward for tr in trajs], trajectories=trajs)
    data = adapter.make_reflective_dataset({"system_prompt": SEED_PROMPT}, batch, ["system_prompt"])
    assert list(data) == ["system_prompt"]
    records = data["system_prompt"]
    assert [r["Inputs"]["task_id"] for r in records] == [f"store-{s}" for s in expected_seeds]
    for r, seed in zip(records, expected_seeds, strict=True):
        assert set(r) == {"Inputs", "Generated Outputs", "Feedback"}
        assert r["Inputs"]["user_request"] == f"Please cancel order #{seed}."
        assert f'agent calls get_order({{"order_id": "#{seed}"}})' in r["Generated Outputs"]
        assert "Reward " in r["Feedback"] and "termination 'done'" in r["Feedback"]
    blob = json.dumps(data)
    assert SECRET not in blob and SEED_PROMPT not in blob  # task metadata and the prompt itself stay out
    json.loads(blob)  # JSON-serialisable, as gepa requires


def test_feedback_carries_failure_reason_and_diagnostics():
    rec = feedback_record(traj(1, 0.0, failure="cancelled a shipped order", diagnostics=(DIAG,)), 3000)
    fb = rec["Feedback"]
    assert "Reward 0.00 of 1.00" in fb and "Failure reason: cancelled a shipped order." in fb
    assert "capability 'precondition_verification', event 'write_precondition_false'" in fb
    assert '{"tool": "cancel_order"}' in fb


@pytest.mark.parametrize(("turns", "max_chars", "elided"), [(2, 3000, False), (60, 600, True), (60, 5000, True)])
def test_transcript_is_bounded_and_keeps_both_ends(turns, max_chars, elided):
    tr = traj(1, 0.0, turns=turns, text="Final answer with ```fences```.")
    text = transcript(tr, max_chars)
    assert len(text) <= max_chars + 40
    assert ("turns omitted" in text) == elided
    assert text.startswith("agent calls get_order") and text.endswith("agent: Final answer with '''fences'''.")
    assert "```" not in text  # the reflection prompt's delimiters cannot be closed from inside a record


# -- tasks, budget -------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "val_size", "budget", "minibatch", "n_val"), [
    (24, 16, 1000, 3, 12),   # capped at half the tasks
    (64, 16, 1000, 3, 16),   # the configured size
    (64, 16, 40, 3, 10),     # capped at a quarter of the budget
    (2, 16, 100, 3, 1),
])
def test_split_tasks(n, val_size, budget, minibatch, n_val):
    seeds = [str(s) for s in range(100, 100 + n)] * 2  # the base rollouts play each task twice
    train, val = split_tasks(seeds, val_size, budget, minibatch, rng_seed=7)
    assert len(val) == n_val and len(train) == n - n_val
    assert sorted(train + val, key=int) == [str(s) for s in range(100, 100 + n)]
    assert (train, val) == split_tasks(seeds, val_size, budget, minibatch, rng_seed=7)
    assert (train, val) != split_tasks(seeds, val_size, budget, minibatch, rng_seed=8) or n == 2


@pytest.mark.parametrize(("seeds", "budget", "fragment"), [
    (["5", "5"], 100, "at least 2 distinct"),
    ([str(s) for s in range(20)], 6, "cannot pay for one proposal"),
])
def test_split_tasks_rejects(seeds, budget, fragment):
    with pytest.raises(StageFailed, match=fragment):
        split_tasks(seeds, 16, budget, 3, 0)


@pytest.mark.parametrize(("trajs", "seeds", "prompt", "error"), [
    ([traj(3, 1.0), traj(1, 0.0), traj(3, 0.0)], ["3", "1"], SEED_PROMPT, None),
    ([traj(3, 1.0), traj(1, 0.0, system="another prompt")], None, None, "differs between tasks"),
])
def test_training_tasks(trajs, seeds, prompt, error):
    if error:
        with pytest.raises(StageFailed, match=error):
            training_tasks(trajs)
    else:
        assert training_tasks(trajs) == (seeds, prompt)


# -- the gepa loop ------------------------------------------------------------------------------
TASKS = [str(s) for s in range(24)]


@pytest.mark.parametrize("budget", [20, 45, 90])
def test_optimize_finds_the_better_prompt_within_budget(budget):
    train, val = split_tasks(TASKS, 16, budget, 3, rng_seed=0)
    rollouts, reflector = FakeRollouts(needs_verify), Reflector()
    out = optimize_prompt(rollouts, SEED_PROMPT, train, val, budget, reflector, GepaSettings(), seed=0)
    assert out.best_prompt == BETTER and out.candidates[out.best_index]["val_score"] == 1.0
    assert out.candidates[0]["system_prompt"] == SEED_PROMPT and out.candidates[0]["val_score"] < 1.0
    # budget: never crossed, all of it accounted for, and not left unused while an iteration still fit
    assert out.spent == rollouts.episodes <= budget
    assert budget - out.spent < 2 * 3 + len(val)
    assert out.jobs == [f"rollout-{k}" for k in range(1, len(rollouts.calls) + 1)]
    assert rollouts.calls[0] == (val, SEED_PROMPT, "gepa 1")  # the seed prompt's validation pass comes first
    # the reflection model saw the current prompt, the failures' feedback, and the untrusted-data note
    assert reflector.prompts and SEED_PROMPT in reflector.prompts[0]
    assert "Failure reason: order cancelled without checking its status." in reflector.prompts[0]
    assert "never follow instructions" in reflector.prompts[0]


def test_optimize_is_deterministic_for_a_seed():
    train, val = split_tasks(TASKS, 16, 60, 3, rng_seed=3)
    runs = []
    for _ in range(2):
        rollouts = FakeRollouts(lambda seed, prompt: 1.0 if (seed + len(prompt)) % 4 == 0 else 0.0)
        reflector = Reflector()
        out = optimize_prompt(rollouts, SEED_PROMPT, train, val, 60, reflector, GepaSettings(), seed=3)
        runs.append((rollouts.calls, out.candidates, out.best_prompt, out.spent))
    assert runs[0] == runs[1]


@pytest.mark.parametrize(("reflector", "acceptance", "n_candidates"), [
    (Reflector(fail=True), "strict_improvement", 1),                  # every reflection fails: seed kept
    (Reflector(reply="```\n\n```"), "strict_improvement", 1),          # empty proposal: dropped, not played
    (Reflector(reply=f"```\n{SEED_PROMPT} Be polite.\n```"), "improvement_or_equal", None),
])
def test_optimize_survives_bad_proposals_and_stays_in_budget(reflector, acceptance, n_candidates):
    train, val = split_tasks(TASKS, 16, 40, 3, rng_seed=0)
    rollouts = FakeRollouts(needs_verify)
    out = optimize_prompt(rollouts, SEED_PROMPT, train, val, 40, reflector,
                          GepaSettings(acceptance=acceptance), seed=0)
    assert out.spent == rollouts.episodes <= 40 and out.iterations >= 1
    assert all(prompt.strip() for _, prompt, _ in rollouts.calls)
    if n_candidates is not None:
        assert len(out.candidates) == n_candidates and out.best_prompt == SEED_PROMPT
    else:  # an equal-scoring proposal is accepted and validated, but does not beat the seed
        assert len(out.candidates) >= 2 and out.best_index == 0


@pytest.mark.parametrize("fail_on_call", [1, 3])  # the seed's validation pass, or inside an iteration
def test_optimize_reraises_rollout_failures(fail_on_call):
    train, val = split_tasks(TASKS, 16, 60, 3, rng_seed=0)
    rollouts = FakeRollouts(needs_verify, fail_on_call=fail_on_call)
    with pytest.raises(StageFailed, match="policy backend down"):
        optimize_prompt(rollouts, SEED_PROMPT, train, val, 60, Reflector(), GepaSettings(), seed=0)
    assert len(rollouts.calls) == fail_on_call  # nothing is played after the failure


def test_optimize_needs_a_system_prompt():
    with pytest.raises(StageFailed, match="no system prompt"):
        optimize_prompt(FakeRollouts(), "", ["1"], ["2"], 20, Reflector(), GepaSettings())


@pytest.mark.parametrize(("field", "value"), [("minibatch_size", 0), ("acceptance", "always"),
                                              ("candidate_selection", "random"), ("transcript_chars", 10)])
def test_settings_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        GepaSettings(**{field: value})


def test_optimize_stops_when_iterations_play_nothing(monkeypatch):
    """An error before any evaluation (gepa logs it and starts the next iteration) ends the search."""
    real = TraceAdapter.evaluate
    seen = []

    def evaluate(self, batch, candidate, capture_traces=False):
        seen.append(list(batch))
        if len(seen) > 1:
            raise ValueError("adapter broke before playing")
        return real(self, batch, candidate, capture_traces)

    monkeypatch.setattr(TraceAdapter, "evaluate", evaluate)
    train, val = split_tasks(TASKS, 16, 90, 3, rng_seed=0)
    rollouts = FakeRollouts(needs_verify)
    out = optimize_prompt(rollouts, SEED_PROMPT, train, val, 90, Reflector(), GepaSettings(), seed=0)
    assert out.spent == len(val) and len(rollouts.calls) == 1 and out.best_prompt == SEED_PROMPT
    assert len(seen) == 1 + 5 and out.iterations == 5


# -- the rollout spec GEPA sends --------------------------------------------------------------------
class RecordingRunner:
    """Stand-in for JobRunner: records the spec and answers like a succeeded rollout job."""

    def __init__(self):
        self.calls = []

    def run(self, service, spec, run_id, description, **kw):
        self.calls.append((service, spec, run_id, description, kw))
        job = t.Job(job_id=f"rollout-{len(self.calls)}", outputs=[t.ArtifactRef(uri="file:///r/t.jsonl",
                                                                              kind="trajectories")],
                    start_time=Timestamp(seconds=10), end_time=Timestamp(seconds=12, nanos=500_000_000))
        return R.GetRolloutJobResponse(job=job, summary=R.RolloutSummary(
            episodes=2, successes=1, pass_rate=0.5, pass_rate_ci_low=0.1, pass_rate_ci_high=0.9, reward_mean=0.6))


@pytest.mark.parametrize(("tasks", "prompt", "temperature", "seed"), [
    ({"task_ids": ["11", "12"]}, BETTER, 0.0, 0),
    ({"split": "test", "limit": 5}, SEED_PROMPT, 0.7, 3),
])
def test_rollout_job_sends_the_candidate_prompt(tasks, prompt, temperature, seed):
    cfg = RunConfig(run_id="unit", seed=100, rollout={"concurrency": 5})
    m = Manifest(run_id="unit")
    m.stages["rollout"].result = {"max_completion_length": {"tokens": 96}}   # the run's one cap
    p = Pipeline(cfg, RecordingRunner(), None, m)
    res = rollout_job(p, **tasks, system_prompt=prompt, temperature=temperature, label="gepa 1", seed=seed)
    service, spec, run_id, description, kw = p.runner.calls[0]
    assert (service, run_id, description) == ("rollout", "unit", "gepa 1")
    assert spec.system_prompt == prompt and spec.samples_per_task == 1 and spec.concurrency == 5
    assert list(spec.tasks.task_ids) == tasks.get("task_ids", []) and spec.tasks.split == tasks.get("split", "")
    assert spec.sampling.temperature == pytest.approx(temperature) and spec.sampling.seed == seed
    assert spec.sampling.max_tokens == 96
    assert spec.seed == seed + 100 and spec.environment.name == "store"
    assert spec.policy == p.base_policy() and kw["labels"]["arm"] == "gepa"
    assert dump(res) == {"job": "rollout-1", "uri": "file:///r/t.jsonl", "episodes": 2, "successes": 1,
                         "pass_rate": 0.5, "ci": [0.1, 0.9], "reward_mean": pytest.approx(0.6), "wall_seconds": 2.5}
