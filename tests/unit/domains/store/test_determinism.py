"""Same seed -> identical instance (also across processes with different hash seeds);
different seeds -> different instances; the global RNG is never touched."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys

import pytest

from tests.unit.domains.store.helpers import TEST_SEEDS
from trace_common.domains.store import SPLITS, TASK_TYPES, StoreEnv, generate_task
from trace_common.env import make

SEEDS = [0, 1, 2, 3, 17, 99_999, 500_000, 1_000_000, 1_000_003, 123_456_789]


def _digest(seed: int) -> str:
    return hashlib.sha256(generate_task(seed).model_dump_json().encode()).hexdigest()


@pytest.mark.parametrize("seed", SEEDS)
def test_same_seed_same_instance_and_observation(seed):
    assert generate_task(seed) == generate_task(seed)
    a, b = StoreEnv(), StoreEnv()
    assert a.reset(seed) == b.reset(seed)
    assert a.db == b.db


def test_different_seeds_differ():
    digests = {_digest(s) for s in range(200)}
    assert len(digests) == 200
    openings = {StoreEnv().reset(s).messages[1].content for s in range(200)}
    assert len(openings) == 200


@pytest.mark.parametrize("seed", SEEDS)
def test_task_type_follows_seed(seed):
    assert generate_task(seed).task_type == TASK_TYPES[seed % 4]


@pytest.mark.parametrize("hash_seed", ["0", "12345"])
def test_identical_across_processes(hash_seed):
    code = ("import hashlib,sys; from trace_common.domains.store import generate_task; "
            "print(' '.join(hashlib.sha256(generate_task(int(s)).model_dump_json().encode()).hexdigest() "
            "for s in sys.argv[1:]))")
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", code, *map(str, SEEDS[:4])], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    assert out.stdout.split() == [_digest(s) for s in SEEDS[:4]]


def test_global_rng_untouched():
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    got = [random.random()]
    generate_task(11)
    StoreEnv().reset(12)
    got += [random.random() for _ in range(2)]
    assert got == expected


def test_splits_disjoint_balanced_and_documented():
    names = sorted(SPLITS)
    assert names == ["dev", "test", "train"]
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            assert not set(SPLITS[x]) & set(SPLITS[y])
    assert len(SPLITS["test"]) == 200
    counts = {t: sum(generate_task(s).task_type == t for s in TEST_SEEDS) for t in TASK_TYPES}
    assert counts == {t: 50 for t in TASK_TYPES}
    assert StoreEnv().splits() == SPLITS


@pytest.mark.parametrize("task_types, expected", [
    ("precondition_check", {"precondition_check"}),
    ("argument_format,record_selection", {"argument_format", "record_selection"}),
    (["multi_request"], {"multi_request"}),
])
def test_task_types_parameter(task_types, expected):
    env = make("store", task_types=task_types)
    assert {env.reset(s).info["task_type"] for s in range(8)} == expected


def test_observation_is_policy_plus_opening():
    obs = StoreEnv().reset(1_000_000)
    assert obs.messages[0].role == "system" and obs.messages[0].content.startswith("# Store support policy")
    assert obs.messages[1].role == "user" and "@example.com" in obs.messages[1].content
    assert json.dumps(obs.tools) == json.dumps(StoreEnv().tool_schemas())
    assert obs.task_id == "1000000" and obs.info["task_type"] == "record_selection"
