"""The store's splits, fixed before any training run: disjoint, sized, balanced, and the
generated tasks pinned by hash. A change to a generator, the task model or the world
breaks `test_generated_tasks_are_pinned`; the splits and generators must not change after
results have been seen (update the pins only for a change made before any run)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

from trace_common.domains.store import DEFAULT_TASK_TYPES, PROBE_TYPES, SPLITS, StoreEnv, generate_task

PINNED_SEEDS = {"dev": SPLITS["dev"], "test": SPLITS["test"], "train[0:500]": range(0, 500)}
# sha256 over the seeds in order of: json.dumps(Task.model_dump(mode="json"), sort_keys=True) + "\n"
PINS = {
    ("compound", "dev"): "1b6a91daba25cafcbdff9c14bd9a9e42a552b52eeb4c946aa1e08c3cf8a72aa0",
    ("compound", "test"): "39513b3b0b1ae292f7e137e9c296602a1f53b39592965fee30b95309d46742f3",
    ("compound", "train[0:500]"): "a870873b0e2ad23924f81b338d168c86077252d65ca80195ecf021fba3eb1a39",
    ("probes", "dev"): "fe642820187760256d3ef3be8124a1b9c8873db984062f3d3d05a0755e788ce9",
    ("probes", "test"): "fa7b560ef959fb3c2e6e3e0d65714da0f22c7610e058e740e38841999a3d84fb",
    ("probes", "train[0:500]"): "12cab23e27d359896c83c42731f4b9fc1a7b5c1c3fd9e32f8eecced5d9b8d172",
}
TYPES = {"compound": DEFAULT_TASK_TYPES, "probes": PROBE_TYPES}


def task_json(seed: int, task_types: tuple[str, ...]) -> str:
    return json.dumps(generate_task(seed, task_types).model_dump(mode="json"), sort_keys=True)


def split_digest(seeds, task_types: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for seed in seeds:
        h.update(task_json(seed, task_types).encode() + b"\n")
    return h.hexdigest()


@pytest.mark.parametrize("env, split", sorted(PINS), ids=[f"{e}-{s}" for e, s in sorted(PINS)])
def test_generated_tasks_are_pinned(env, split):
    assert split_digest(PINNED_SEEDS[split], TYPES[env]) == PINS[(env, split)]


@pytest.mark.parametrize("split, start, stop", [("train", 0, 100_000), ("dev", 500_000, 500_300),
                                                ("test", 1_000_000, 1_000_600)])
def test_split_ranges(split, start, stop):
    assert SPLITS[split] == range(start, stop)
    assert StoreEnv().splits()[split] == SPLITS[split] == StoreEnv(task_types="probes").splits()[split]


def test_splits_disjoint_and_test_large_enough():
    assert sorted(SPLITS) == ["dev", "test", "train"]
    names = sorted(SPLITS)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            assert not set(SPLITS[x]) & set(SPLITS[y]), (x, y)
    assert len(SPLITS["test"]) >= 500


@pytest.mark.parametrize("split, per_type", [("test", 150), ("dev", 75)])
def test_probe_splits_are_balanced(split, per_type):
    counts = Counter(generate_task(s, PROBE_TYPES).task_type for s in SPLITS[split])
    assert counts == {t: per_type for t in PROBE_TYPES}


def test_pins_see_a_one_task_change():
    """The pin is sensitive to any task: changing one seed's task changes the digest."""
    seeds = list(PINNED_SEEDS["dev"])
    assert split_digest(seeds[:-1] + [seeds[0]], DEFAULT_TASK_TYPES) != PINS[("compound", "dev")]
