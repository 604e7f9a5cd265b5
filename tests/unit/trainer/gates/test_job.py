"""TRAINING_KIND_GATES request validation for slot 0's provenance (provenance labels) and the target
(services.trainer.gates.job): refused before a job exists, naming the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load

from services.trainer.gates.job import read_base_trajectories, validate_gates
from services.trainer.jobspec import WorkerSpec
from services.trainer.specs import TrainingSpecModel
from tests.support.tau2_data import require_tau2_data, tau2_data_root
from tests.unit.trainer.gates.test_grpo import _traj
from tests.unit.trainer.gates.test_grpo_toy import toy_world
from trace_common.artifacts import open_store
from trace_common.env.trajectory import dumps_jsonl
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied

CONFIG = dict(max_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=4, warm_start_steps=5,
              guidance_fraction=0.0)
PROV = {"warm_start_labels": "provenance", "warm_start_episodes": 4}
FILES = {  # name -> trajectories of the base agent
    "train": [_traj(1, 1.0), _traj(2, 0.0), _traj(4, 1.0)],
    "test_split": [_traj(1, 1.0), _traj(1001, 1.0)],
    "all_failed": [_traj(1, 0.0), _traj(2, 0.0)],
}


@pytest.fixture
def store(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    _, dirs = toy_world()
    for name, directory in dirs.items():
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            store.put_file(f"runs/r1/adapters/{name}/v1/{f}", directory / f)
    for name, trajs in FILES.items():
        store.put_bytes(f"runs/r1/rollouts/{name}/trajectories.jsonl", dumps_jsonl(trajs))
    return store


def _spec(store, environments=("toy-early", "toy-late", "toy-target"), target: dict | None = None,
          **config) -> TrainingSpecModel:
    """`target`: EnvironmentRefModel fields of a target listed instead of toy-target's."""
    root = store.root_uri.rstrip("/")
    base_dir, _ = toy_world()
    return TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_GATES", capability="r1-moe",
        adapter_uris={n: f"{root}/runs/r1/adapters/{n}/v1/adapter_model.safetensors" for n in ("early", "late")},
        environments=[target if e == "toy-target" and target else
                      {"name": e, **({"params": {"split": "train"}} if e == "toy-target" else {})}
                      for e in environments],
        policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": str(base_dir)}, config={**CONFIG, **config}))


def _uri(store, name: str) -> str:
    return f"{store.root_uri.rstrip('/')}/runs/r1/rollouts/{name}/trajectories.jsonl"


@pytest.mark.parametrize("case, config, error, needle", [
    ("outside_store", PROV, InvalidArgument, "this trainer's artifact store"),
    ("missing", PROV, InvalidArgument, "an existing trajectories artifact"),
    ("test_split", PROV, InvalidArgument, "outside it"),
    ("all_failed", PROV, FailedPrecondition, "none of the 2 base trajectories succeeded"),
    ("no_target", PROV, InvalidArgument, "target's training tasks only"),
    ("no_target_outcome", {"max_steps": 0, "warm_start_labels": "outcome"}, InvalidArgument,
     "the outcome warm start replays every slot"),
    ("outcome_with_uris", {}, InvalidArgument,                      # outcome labels (default) would not read them
     "base_provenance_uris: provenance labels only"),
])
def test_gates_request_with_bad_slot0_provenance_or_no_target_is_refused(store, case, config, error, needle):
    uris = {"outside_store": ["file:///elsewhere/trajectories.jsonl"], "missing": [_uri(store, "nope")],
            "test_split": [_uri(store, "test_split")], "all_failed": [_uri(store, "all_failed")],
            "no_target": [_uri(store, "train")], "outcome_with_uris": [_uri(store, "train")]}.get(case)
    envs = ("toy-early", "toy-late") if case.startswith("no_target") else ("toy-early", "toy-late", "toy-target")
    config = {**config, **({"base_provenance_uris": uris} if uris is not None else {})}
    with pytest.raises(error) as err:
        validate_gates(_spec(store, envs, **config), store)
    assert needle in str(err.value), err.value



@pytest.mark.parametrize("config", [
    {**PROV, "base_provenance_uris": []},                          # accepted: slot 0 without examples (logged)
    {**PROV, "base_provenance_uris": ["TRAIN"]},
    {**PROV, "base_provenance_uris": ["ALL_FAILED"], "base_provenance": "all"},
    {**PROV, "base_provenance_uris": ["TEST_SPLIT"], "base_provenance": "none"},  # not read at all
    {**PROV, "max_steps": 0},                                       # provenance warm start only: no target needed
    {},                                                             # outcome labels (default): no provenance field
])
def test_gates_request_accepted(store, config):
    config = {k: [_uri(store, u.lower()) for u in v] if k == "base_provenance_uris" else v for k, v in config.items()}
    envs = ("toy-early", "toy-late") if config.get("max_steps") == 0 else ("toy-early", "toy-late", "toy-target")
    parsed = validate_gates(_spec(store, envs, **config), store)
    assert parsed.base_provenance_uris == config.get("base_provenance_uris", [])
    if parsed.base_provenance_uris:
        assert len(read_base_trajectories(store, parsed.base_provenance_uris)) in (2, 3)


#: (the target's fields, the data roots, the error, text it has); the target is environments[2]
TAU2_TARGETS = {
    "data outside the roots": ({"params": {"split": "train", "data": "/etc"}}, "tau2", PermissionDenied,
                               "spec.environments[2].params['data']"),
    "uri outside the roots": ({"uri": "file:///etc", "params": {"split": "train"}}, "tau2", PermissionDenied,
                              "spec.environments[2].uri"),
    "no roots listed": ({"params": {"split": "train", "data": "{tau2}/retail"}}, "", PermissionDenied,
                        "TRACE_TRAINER_DATA_ROOTS"),
    "the service's own data missing": ({"params": {"split": "train"}}, "tau2", NotFound, "TRACE_TAU2_DATA"),
}


@pytest.mark.parametrize(("target", "roots", "error", "text"), list(TAU2_TARGETS.values()), ids=list(TAU2_TARGETS))
def test_a_tau2_targets_data_is_confined_and_its_default_path_not_named(store, tmp_path, monkeypatch, target, roots,
                                                                        error, text):
    # the operator's data root: the tau2 data, or a stand-in without it (nothing under the root is read here)
    tau2 = (tau2_data_root() or tmp_path / "tau2-root").resolve()
    missing = tmp_path / "home" / "tau2-missing"
    monkeypatch.setenv("TRACE_TAU2_DATA", str(missing))   # the service's own data: not there
    target = {"name": "tau2-retail", **target,
              "params": {k: v.format(tau2=tau2) for k, v in target["params"].items()}}
    with pytest.raises(error) as err:
        validate_gates(_spec(store, target=target), store, data_roots=[tau2] if roots else [])
    assert text in str(err.value), err.value
    assert str(tmp_path) not in str(err.value) and "/etc" not in str(err.value), err.value


def test_a_tau2_target_under_a_root_is_accepted_through_a_symlink(store, tmp_path):
    tau2 = require_tau2_data().resolve()
    (tmp_path / "link").symlink_to(tau2 / "retail")   # resolves under the root
    target = {"name": "tau2-retail", "params": {"split": "train", "data": str(tmp_path / "link")}}
    parsed = validate_gates(_spec(store, target=target), store, data_roots=[tau2])
    assert parsed.max_steps == CONFIG["max_steps"]


@pytest.mark.parametrize("dtype, want", [(None, torch.float32), ("bfloat16", torch.bfloat16)])
def test_a_gate_job_loads_its_base_in_the_configured_dtype(store, tmp_path, monkeypatch, dtype, want):
    """run_gates, the worker body, loads the composition's base in `config.dtype` (spied, not replaced:
    the real load runs), trains the gates on it and writes the composition, whose gates stay float32."""
    import services.trainer.grpo.models as models
    from services.trainer.gates.job import run_gates

    loaded = []
    real = models.load_base

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        loaded.append(next(out[0].parameters()).dtype)
        return out
    monkeypatch.setattr(models, "load_base", spy)
    config = {"max_steps": 1, "warm_start_steps": 2, "warm_start_tasks": 2, **({"dtype": dtype} if dtype else {})}
    request = _spec(store, **config)
    base_dir, _ = toy_world()
    spec = WorkerSpec(job_id="j1", run_id="r1", kind="TRAINING_KIND_GATES", capability="r1-moe",
                      environment=request.environments[0].model_dump(),
                      environments=[e.model_dump() for e in request.environments],
                      adapter_uris=dict(request.adapter_uris), policy=request.policy.model_dump(),
                      config=validate_gates(request, store).model_dump(mode="json"), artifact_root=store.root_uri,
                      model_roots=[Path(base_dir).parent.as_uri()], prefix="runs/r1/gates/moe")
    events = []
    code = run_gates(spec, store, s3=None, emit=lambda kind, payload: events.append((kind, payload)),
                     should_stop=lambda: False, cache=tmp_path / "cache", device="cpu")
    assert code == 0, events[-1]
    assert loaded == [want]
    gates = st_load(store.get_bytes("runs/r1/gates/moe/gates.safetensors"))
    assert gates and all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in gates.values())
