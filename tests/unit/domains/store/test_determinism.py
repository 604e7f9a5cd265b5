"""Same seed -> identical instance (also across processes with different hash seeds), for
the compound target and the probe env; different seeds -> different instances; the global
RNG is never touched; the `task_types` parameter."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys

import pytest

from trace_common.domains.store import COMPOUND, DEFAULT_TASK_TYPES, PROBE_TYPES, StoreEnv, generate_task
from trace_common.env import make

SEEDS = [0, 1, 2, 3, 17, 99_999, 500_000, 1_000_000, 1_000_003, 123_456_789]
TYPES = {"compound": DEFAULT_TASK_TYPES, "probes": PROBE_TYPES}


def _digest(seed: int, env: str) -> str:
    return hashlib.sha256(generate_task(seed, TYPES[env]).model_dump_json().encode()).hexdigest()


@pytest.mark.parametrize("env", sorted(TYPES))
@pytest.mark.parametrize("seed", SEEDS)
def test_same_seed_same_instance_and_observation(seed, env):
    assert generate_task(seed, TYPES[env]) == generate_task(seed, TYPES[env])
    a, b = StoreEnv(task_types=env), StoreEnv(task_types=env)
    assert a.reset(seed) == b.reset(seed)
    assert a.db == b.db


@pytest.mark.parametrize("env", sorted(TYPES))
def test_different_seeds_differ(env):
    digests = {_digest(s, env) for s in range(200)}
    assert len(digests) == 200
    openings = {StoreEnv(task_types=env).reset(s).messages[1].content for s in range(200)}
    assert len(openings) == 200


@pytest.mark.parametrize("seed", SEEDS)
def test_probe_type_follows_seed_and_compound_is_the_default(seed):
    assert generate_task(seed, PROBE_TYPES).task_type == PROBE_TYPES[seed % 4]
    assert generate_task(seed).task_type == COMPOUND == StoreEnv().reset(seed).info["task_type"]


@pytest.mark.parametrize("env", sorted(TYPES))
@pytest.mark.parametrize("hash_seed", ["0", "12345"])
def test_identical_across_processes(hash_seed, env):
    code = ("import hashlib,sys; from trace_common.domains.store import generate_task, parse_task_types; "
            "types = parse_task_types(sys.argv[1]); "
            "print(' '.join(hashlib.sha256(generate_task(int(s), types).model_dump_json().encode()).hexdigest() "
            "for s in sys.argv[2:]))")
    environ = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", code, env, *map(str, SEEDS[:5])], capture_output=True, text=True,
                         env=environ, check=True, timeout=120)
    assert out.stdout.split() == [_digest(s, env) for s in SEEDS[:5]]


def test_global_rng_untouched():
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    got = [random.random()]
    generate_task(11)
    generate_task(11, PROBE_TYPES)
    StoreEnv().reset(12)
    got += [random.random() for _ in range(2)]
    assert got == expected


@pytest.mark.parametrize("task_types, expected", [
    (None, {"compound"}),
    ("", {"compound"}),
    ("compound", {"compound"}),
    (["compound"], {"compound"}),
    ("probes", set(PROBE_TYPES)),
    ("precondition_check", {"precondition_check"}),
    ("argument_format,record_selection", {"argument_format", "record_selection"}),
    (["multi_request"], {"multi_request"}),
])
def test_task_types_parameter(task_types, expected):
    env = make("store") if task_types is None else make("store", task_types=task_types)
    assert {env.reset(s).info["task_type"] for s in range(8)} == expected


@pytest.mark.parametrize("task_types, seed, capability, capabilities", [
    ("compound", 1_000_000, None, ["multi_step_task_completion", "structured_data_reasoning"]),
    ("probes", 1_000_000, "structured_data_reasoning", ["structured_data_reasoning"]),
    ("probes", 1_000_002, "precondition_verification", ["precondition_verification"]),
])
def test_info_names_capabilities_and_a_single_capability_only_for_probes(task_types, seed, capability,
                                                                          capabilities):
    info = StoreEnv(task_types=task_types).reset(seed).info
    assert info.get("capability") == capability and ("capability" in info) == (capability is not None)
    assert info["capabilities"] == capabilities
    assert set(info) <= {"task_type", "capability", "capabilities", "mode", "kinds"}
    assert info["mode"] in ("all_at_once", "sequential") and info["kinds"]


def test_observation_is_policy_plus_opening():
    obs = StoreEnv().reset(1_000_000)
    assert obs.messages[0].role == "system" and obs.messages[0].content.startswith("# Store support policy")
    assert obs.messages[1].role == "user" and "@example.com" in obs.messages[1].content
    assert json.dumps(obs.tools) == json.dumps(StoreEnv().tool_schemas())
    assert obs.task_id == "1000000" and obs.info["task_type"] == "compound"
    assert StoreEnv(task_types="probes").reset(1_000_000).info["task_type"] == "record_selection"
