"""TRAINING_KIND_GATES request validation for slot 0's provenance and the target (services.trainer.gates.job):
refused before a job exists, naming the field and the fix."""

from __future__ import annotations

import pytest

from services.trainer.gates.job import read_base_trajectories, validate_gates
from services.trainer.specs import TrainingSpecModel
from tests.unit.trainer.gates.test_grpo import _traj
from tests.unit.trainer.gates.test_grpo_toy import toy_world
from trace_common.artifacts import open_store
from trace_common.env.trajectory import dumps_jsonl
from trace_common.errors import FailedPrecondition, InvalidArgument

CONFIG = dict(max_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=4, warm_start_steps=5,
              warm_start_episodes=4, guidance_fraction=0.0)
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


def _spec(store, environments=("toy-early", "toy-late", "toy-target"), **config) -> TrainingSpecModel:
    root = store.root_uri.rstrip("/")
    base_dir, _ = toy_world()
    return TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_GATES", capability="r1-moe",
        adapter_uris={n: f"{root}/runs/r1/adapters/{n}/v1/adapter_model.safetensors" for n in ("early", "late")},
        environments=[{"name": e, **({"params": {"split": "train"}} if e == "toy-target" else {})}
                      for e in environments],
        policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": str(base_dir)}, config={**CONFIG, **config}))


def _uri(store, name: str) -> str:
    return f"{store.root_uri.rstrip('/')}/runs/r1/rollouts/{name}/trajectories.jsonl"


@pytest.mark.parametrize("case, error, needle", [
    ("outside_store", InvalidArgument, "this trainer's artifact store"),
    ("missing", InvalidArgument, "an existing trajectories artifact"),
    ("test_split", InvalidArgument, "outside it"),
    ("all_failed", FailedPrecondition, "none of the 2 base trajectories succeeded"),
    ("no_target", InvalidArgument, "target's training tasks only"),
])
def test_gates_request_with_bad_slot0_provenance_or_no_target_is_refused(store, case, error, needle):
    uris = {"outside_store": ["file:///elsewhere/trajectories.jsonl"], "missing": [_uri(store, "nope")],
            "test_split": [_uri(store, "test_split")], "all_failed": [_uri(store, "all_failed")],
            "no_target": [_uri(store, "train")]}[case]
    envs = ("toy-early", "toy-late") if case == "no_target" else ("toy-early", "toy-late", "toy-target")
    with pytest.raises(error) as err:
        validate_gates(_spec(store, envs, base_provenance_uris=uris), store)
    assert needle in str(err.value), err.value


@pytest.mark.parametrize("config", [
    {"base_provenance_uris": []},                                  # accepted: slot 0 without examples (logged)
    {"base_provenance_uris": ["TRAIN"]},
    {"base_provenance_uris": ["ALL_FAILED"], "base_provenance": "all"},
    {"base_provenance_uris": ["TEST_SPLIT"], "base_provenance": "none"},  # not read at all
    {"max_steps": 0},                                               # warm start only: no target needed
])
def test_gates_request_accepted(store, config):
    config = {k: [_uri(store, u.lower()) for u in v] if k == "base_provenance_uris" else v for k, v in config.items()}
    envs = ("toy-early", "toy-late") if config.get("max_steps") == 0 else ("toy-early", "toy-late", "toy-target")
    parsed = validate_gates(_spec(store, envs, **config), store)
    assert parsed.base_provenance_uris == config.get("base_provenance_uris", [])
    if parsed.base_provenance_uris:
        assert len(read_base_trajectories(store, parsed.base_provenance_uris)) in (2, 3)
