"""Training curves where RL practitioners look for them (services/trainer/grpo/trackers.py): a job's
per-iteration metrics as TensorBoard event files beside its checkpoints, read back with TensorBoard's
own reader, under TRL's names; `report_to` refused when wrong; W&B only when asked, offline by default."""

from __future__ import annotations

import json
import os
import signal
import sys
import types
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from services.trainer.configs import validate_training_config
from services.trainer.grpo import checkpoint as ckpt
from services.trainer.grpo.config import GRPOConfig, parse_config
from services.trainer.grpo.session import make_trainer
from services.trainer.grpo.trackers import TB_DIR, Trackers, logged_values
from services.trainer.jobspec import WorkerSpec
from tests.unit.trainer.grpo.helpers import PickEnv, tiny_tokenizer, warm_model
from trace_common.artifacts import open_store
from trace_common.errors import FailedPrecondition, InvalidArgument

PREFIX = "runs/r1/adapters/pick_skill"
JOB = dict(max_steps=3, groups_per_batch=2, num_generations=4, max_completion_length=4, learning_rate=5e-3,
           lora_r=4, save_steps=0, guidance_fraction=0.5, beta=0.05, seed=5, early_stop_uninformative_iterations=0)


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a TensorBoard logdir run, as TensorBoard's own reader loads it."""
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# ---- a trainer job (the worker, in this process) -------------------------------------------------------------
def run_job(tmp_path: Path, model_dir: Path, monkeypatch, rc: int = 0, **config) -> list[tuple[str, dict]]:
    """One adapter job through the worker's own code path (exit code `rc`); its events."""
    from services.trainer import worker

    events: list[tuple[str, dict]] = []

    class Sink:
        def __init__(self, store=None, key="", enabled=True):
            self.enabled = enabled

        def emit(self, kind, payload):
            if self.enabled:
                events.append((kind, payload))

    monkeypatch.setattr(signal, "signal", lambda *a: None)   # the worker's stop handlers stay out of pytest
    spec = WorkerSpec(job_id="j1", run_id="r1", capability="pick_skill",
                      environment={"name": "toy-pick", "params": {"hint": True}},
                      policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": str(model_dir)},
                      config={**JOB, **config}, artifact_root=(tmp_path / "store").as_uri(),
                      model_roots=[model_dir.as_uri()], prefix=PREFIX, torch_threads=1,
                      env_modules=["tests.unit.trainer.grpo.toy_registry"])
    assert worker.run(spec, sink_factory=Sink) == rc, events[-1:]
    return events


def _own(name: str):
    return lambda r: r.get(name)


def _both(a: str, b: str, f):
    return lambda r: f(r[a], r[b]) if a in r and b in r else None


#: The logged name -> its value in an iteration's row of metrics.jsonl (trackers.py's table).
LOGGED = {
    "train/reward": _own("reward_mean"), "train/reward_std": _own("reward_std"), "train/loss": _own("loss"),
    "train/kl": _own("kl"), "train/entropy": _own("entropy"), "train/clip_ratio/region_mean": _own("clip_fraction"),
    "train/grad_norm": _own("grad_norm"), "train/learning_rate": _own("learning_rate"),
    "train/frac_reward_zero_std": lambda r: 1.0 - r["informative_group_fraction"],
    "train/num_tokens": _both("prompt_tokens_total", "completion_tokens_total", lambda p, c: p + c),
    "train/completions/mean_length": _both("generated_tokens", "episodes", lambda g, n: g / n if n else None),
    # ours: informative groups, guided vs unguided reward, episodes, tokens
    **{f"train/{k}": _own(k) for k in ("informative_group_fraction", "guided_reward_mean", "unguided_reward_mean",
                                       "pass_rate", "episodes", "rollouts_total", "prompt_tokens_total",
                                       "completion_tokens_total")},
}


@pytest.mark.parametrize("report_to, writes", [
    (None, True),               # the default: ["tensorboard"]
    (["tensorboard"], True),
    (["none"], False),
])
def test_a_job_writes_event_files_tensorboard_reads_under_trl_names(tmp_path, model_dir, monkeypatch, report_to,
                                                                    writes):
    events = run_job(tmp_path, model_dir, monkeypatch, **({} if report_to is None else {"report_to": report_to}))
    result = next(p for k, p in events if k == "result")
    store = open_store((tmp_path / "store").as_uri())
    rows = [json.loads(line) for line in store.get_bytes(store.key_of(
        next(o["uri"] for o in result["outputs"] if o["kind"] == "training_metrics"))).decode().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    boards = [o for o in result["outputs"] if o["kind"] == "tensorboard"]
    logdir = tmp_path / "store" / PREFIX / TB_DIR
    if not writes:
        assert boards == [] and not logdir.exists()
        return
    assert len(boards) == 1 and boards[0]["uri"].startswith(store.uri_for(f"{PREFIX}/{TB_DIR}/events.out.tfevents."))
    assert store.stat(store.key_of(boards[0]["uri"])).sha256 == boards[0]["sha256"]
    series = scalars(logdir)
    for tag, value_of in LOGGED.items():
        want = [(int(r["iteration"]), value_of(r)) for r in rows if value_of(r) is not None]
        assert want, f"{tag}: the job measured it in no iteration"
        got = series.get(tag, [])
        assert [s for s, _ in got] == [s for s, _ in want], tag            # one value per iteration it measured
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), tag
    assert {"train/reward_mean", "train/clip_fraction"}.isdisjoint(series)  # renamed, not logged twice


# ---- report_to: the config field --------------------------------------------------------------------------
@pytest.mark.parametrize("value, parsed", [
    ("tensorboard", ["tensorboard"]),          # TRL's single-name form
    (["wandb", "tensorboard", "wandb"], ["wandb", "tensorboard"]),
    ([], ["none"]),
    (["none"], ["none"]),
])
def test_report_to_values(value, parsed):
    assert parse_config({"report_to": value}).report_to == parsed


@pytest.mark.parametrize("kind", ["TRAINING_KIND_ADAPTER", "TRAINING_KIND_GATES"])
@pytest.mark.parametrize("value, needle", [
    ("tensorbord", "unknown tracker"),
    (["tensorboard", "mlflow"], "'mlflow'"),
    ("all", "name them"),
    (["none", "wandb"], "either ['none']"),
    (3, "list of tracker names"),
])
def test_a_bad_report_to_is_refused_naming_the_field(kind, value, needle):
    with pytest.raises(InvalidArgument) as service:
        validate_training_config(kind, {"report_to": value}, "training.grpo")
    assert "training.grpo.report_to" in str(service.value) and needle in str(service.value)
    with pytest.raises(InvalidArgument) as worker:
        parse_config({"report_to": value})
    assert worker.value.field == "config.report_to" and needle in str(worker.value)


# ---- the mapping table ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("values, logged", [
    ({"reward_mean": 0.5, "reward_std": 0.25}, {"train/reward": 0.5, "train/reward_std": 0.25}),
    ({"informative_group_fraction": 0.25}, {"train/informative_group_fraction": 0.25,
                                            "train/frac_reward_zero_std": 0.75}),
    ({"prompt_tokens_total": 30.0, "completion_tokens_total": 12.0},
     {"train/prompt_tokens_total": 30.0, "train/completion_tokens_total": 12.0, "train/num_tokens": 42.0}),
    ({"generated_tokens": 12.0, "episodes": 4.0}, {"train/generated_tokens": 12.0, "train/episodes": 4.0,
                                                   "train/completions/mean_length": 3.0}),
    ({"generated_tokens": 0.0, "episodes": 0.0}, {"train/generated_tokens": 0.0, "train/episodes": 0.0}),
    ({"iteration": 3.0, "clip_fraction": 0.1, "replayed": True}, {"train/clip_ratio/region_mean": 0.1}),
])
def test_logged_names(values, logged):
    assert logged_values(values) == pytest.approx(logged)


# ---- resume: each iteration once ----------------------------------------------------------------------------------
def train(store, config: GRPOConfig, *, resume: bool) -> list[dict]:
    trackers = Trackers(config.report_to, store, PREFIX, config=config.model_dump(mode="json"))
    rows: list[dict] = []
    trainer = make_trainer(config, warm_model("pick"), tiny_tokenizer(), PickEnv, store=store, prefix=PREFIX,
                           capability="pick_skill", on_event=trackers.wrap(
                               lambda k, p: rows.append(p) if k == "iteration" else None))
    trainer.train(resume=resume, write_adapter=False)
    trackers.close()
    return rows


def test_a_resumed_job_shows_each_iteration_once(tmp_path):
    config = GRPOConfig(max_steps=4, save_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=4,
                        learning_rate=5e-3, seed=3, lora_r=4, early_stop_uninformative_iterations=0)
    store = open_store(tmp_path.as_uri())
    first = train(store, config, resume=False)
    (tmp_path / PREFIX / "ckpt-4" / ckpt.MANIFEST).unlink()   # died after iteration 4, before its checkpoint
    second = train(store, config, resume=True)
    assert [r["iteration"] for r in second] == [3, 4]          # iterations 3 and 4 were logged twice
    assert len(store.list(f"{PREFIX}/{TB_DIR}/events.out.tfevents.")) == 2   # one event file per attempt
    rewards = scalars(tmp_path / PREFIX / TB_DIR)["train/reward"]
    assert [s for s, _ in rewards] == [1, 2, 3, 4]
    assert [v for _, v in rewards] == pytest.approx([r["values"]["reward_mean"] for r in first[:2] + second])


# ---- the gate job: its warm start and its GRPO iterations ---------------------------------------------------------
def test_a_gate_job_logs_its_warm_start_steps_and_its_iterations(tmp_path):
    from services.trainer.gates.config import GateGRPOConfig
    from tests.unit.trainer.gates.test_grpo import PROV, composed
    from tests.unit.trainer.gates.test_grpo import run as gate_job

    prefix = "runs/r1/moe/m"
    config = GateGRPOConfig(**PROV, max_steps=2, warm_start_steps=4, warm_start_batch_size=4)
    store = open_store(tmp_path.as_uri())
    trackers = Trackers(config.report_to, store, prefix, config=config.model_dump(mode="json"))
    events: list[tuple[str, dict]] = []
    gate_job(config, composed(), store, prefix, on_event=trackers.wrap(lambda k, p: events.append((k, p))))
    trackers.close()
    iterations = {p["iteration"]: p["values"] for k, p in events if k == "iteration"}
    losses = [(p["step"], p["loss"]) for k, p in events if k == "warm_start"]
    assert sorted(iterations) == [0, 1, 2] and [s for s, _ in losses] == [1, 2, 3, 4]
    main = scalars(tmp_path / prefix / TB_DIR)
    assert main["train/warm_start_loss"] == [(0, pytest.approx(iterations[0]["warm_start_loss"], rel=1e-6))]
    assert main["train/rollouts_total"] == [(it, pytest.approx(v["rollouts_total"], rel=1e-6))
                                            for it, v in sorted(iterations.items())]   # the job's budget totals
    assert [s for s, _ in main["train/reward"]] == [1, 2]
    warm = scalars(tmp_path / prefix / TB_DIR / "warm_start")
    assert warm["warm_start/loss"] == [(s, pytest.approx(v, rel=1e-6)) for s, v in losses]


# ---- W&B: only when asked; offline unless the operator says otherwise -----------------------------------------------
def test_wandb_requested_but_not_installed_says_what_to_install(tmp_path, model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)   # import wandb raises ImportError
    with pytest.raises(FailedPrecondition) as exc:
        Trackers(["tensorboard", "wandb"], open_store(tmp_path.as_uri()), PREFIX)
    assert "config.report_to" in str(exc.value) and "trace-agents[wandb]" in str(exc.value)
    events = run_job(tmp_path, model_dir, monkeypatch, rc=1, report_to=["wandb"])   # the job fails before training
    assert [k for k, _ in events] == ["error"] and events[0][1]["code"] == "FAILED_PRECONDITION"
    assert "config.report_to" in events[0][1]["message"] and "trace-agents[wandb]" in events[0][1]["message"]


class FakeRun:
    """Records what the trackers ask of W&B and writes an offline run directory as wandb does."""

    def __init__(self, directory: str, **kwargs):
        self.kwargs, self.logged, self.finished = kwargs, [], False
        run_dir = Path(directory) / "wandb" / "offline-run-1-abc"
        (run_dir / "files").mkdir(parents=True)
        self.settings = types.SimpleNamespace(sync_dir=str(run_dir), sync_file=str(run_dir / "run-abc.wandb"))

    def define_metric(self, name, step_metric=None):
        pass

    def log(self, data):
        self.logged.append(dict(data))

    def finish(self):
        Path(self.settings.sync_file).write_text(json.dumps(self.logged))
        (Path(self.settings.sync_dir) / "files" / "config.yaml").write_text(json.dumps(self.kwargs["config"]))
        self.finished = True


@pytest.mark.parametrize("operator_mode, environment_mode", [("offline", "online"), ("online", "offline"),
                                                              ("offline", None)])
def test_wandb_runs_in_the_operators_mode_and_lands_beside_the_checkpoints(tmp_path, monkeypatch, operator_mode,
                                                                          environment_mode):
    runs: list[FakeRun] = []

    def init(dir, **kwargs):
        runs.append(FakeRun(dir, **kwargs, environment_mode=os.environ.get("WANDB_MODE")))
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=dict))
    if environment_mode:
        monkeypatch.setenv("WANDB_MODE", environment_mode)   # the worker's environment does not override it
    store = open_store(tmp_path.as_uri())
    trackers = Trackers(["wandb"], store, PREFIX, name="pick_skill", group="r1", config={"seed": 5},
                        wandb_mode=operator_mode)
    emitted: list[tuple[str, dict]] = []
    emit = trackers.wrap(lambda k, p: emitted.append((k, p)))
    for it in (1, 2):
        emit("iteration", {"iteration": it, "values": {"reward_mean": 0.1 * it}})
    emit("iteration", {"iteration": 2, "values": {"reward_mean": 0.2}, "replayed": True})
    emit("result", {"outputs": []})
    (run,) = runs
    assert run.kwargs["mode"] == run.kwargs["environment_mode"] == operator_mode and run.finished
    assert [r["train/iteration"] for r in run.logged] == [1, 2]   # the replayed iteration is not logged again
    assert [r["train/reward"] for r in run.logged] == pytest.approx([0.1, 0.2])
    outputs = emitted[-1][1]["outputs"]
    assert [o["kind"] for o in outputs] == ["wandb"]
    assert outputs[0]["uri"] == store.uri_for(f"{PREFIX}/wandb/offline-run-1-abc/run-abc.wandb")
    assert store.exists(f"{PREFIX}/wandb/offline-run-1-abc/files/config.yaml")
    assert not (tmp_path / PREFIX / TB_DIR).exists()              # report_to named wandb only
