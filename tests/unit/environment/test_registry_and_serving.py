"""The registry in a real (file) artifact store, and serving episodes of registered environments
through sandbox workers (episode table: reuse, idle timeout, limits, violations)."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.environment.registry import EnvironmentRegistry
from services.environment.sandbox.parent import SandboxConfig, SandboxViolation
from services.environment.serving import EpisodeTable
from trace_common.artifacts import open_store
from trace_common.errors import (
    ArtifactCorrupted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

from .helpers import RESET_ANCHOR, bundled, make_env, patched

GOOD = bundled("precondition_verification", "store")
#: registered as accepted, but seed 1_000_013 (test split) forks in reset
TRAPPED = patched(GOOD, RESET_ANCHOR, "        if seed == 1_000_013:\n            __builtins__['__import__']('os').fork()\n"
                  + RESET_ANCHOR)


def _report(status: str, **numbers) -> dict:
    return {"status": status, "reasons": [] if status == "ACCEPTED" else ["oracle: failed"],
            "numbers": numbers, "isolation": {"network": "netns"}}


def _register(reg: EnvironmentRegistry, capability: str, status: str = "ACCEPTED", source: str = GOOD, run="r1"):
    return reg.register(run_id=run, capability=capability, mode="GENERATION_MODE_LIBRARY", source=source,
                        report=_report(status, calibration_mean=0.44, informative_fraction=0.9),
                        target={"name": "store"}, tool_schemas=make_env("precondition_verification",
                                                                        "store").tool_schemas())


@pytest.fixture
def registry(tmp_path):
    return EnvironmentRegistry(open_store(tmp_path.as_uri()))


def test_register_lays_out_the_artifacts_and_versions_count_up(registry, tmp_path):
    first = _register(registry, "precondition_verification")
    second = _register(registry, "precondition_verification", status="REJECTED", run="r2")
    assert (first.version, second.version) == ("1", "2")
    base = tmp_path / "runs/r1/environments/precondition_verification/v1"
    assert {"env.py", "manifest.json", "validation.json"} <= {p.name for p in base.iterdir()}
    manifest = json.loads((base / "manifest.json").read_text())
    assert manifest["code"]["sha256"] == first.code["sha256"] and manifest["status"] == "ACCEPTED"
    assert registry.source(first) == GOOD
    assert first.calibration_mean == 0.44 and first.informative_fraction == 0.9


@pytest.mark.parametrize(("name", "version", "kwargs", "expect"), [
    ("precondition_verification", "", {}, "1"),             # latest accepted, not the newer rejected v2
    ("precondition_verification", "2", {}, "2"),
    ("precondition_verification", "9", {}, NotFound),
    ("precondition_verification", "x", {}, InvalidArgument),
    ("precondition_verification", "2", {"accepted_only": True}, FailedPrecondition),
    ("ghost", "", {}, NotFound),
    ("", "", {}, InvalidArgument),
])
def test_get(registry, name, version, kwargs, expect):
    _register(registry, "precondition_verification")
    _register(registry, "precondition_verification", status="REJECTED")
    if isinstance(expect, str):
        assert registry.get(name, version, **kwargs).version == expect
    else:
        with pytest.raises(expect):
            registry.get(name, version, **kwargs)


def test_list_filters_and_reload_from_the_store(registry):
    _register(registry, "precondition_verification")
    _register(registry, "tool_call_precision", status="REJECTED")
    assert [r.name for r in registry.list()] == ["precondition_verification"]
    assert [r.name for r in registry.list(include_rejected=True)] == ["precondition_verification",
                                                                      "tool_call_precision"]
    assert registry.list("tool_call_precision") == []
    fresh = EnvironmentRegistry(registry.store)
    assert fresh.load() == 2
    assert fresh.get("tool_call_precision").status == "REJECTED"
    assert _register(fresh, "tool_call_precision").version == "2"


def _hand_written(root, key: str, data: bytes) -> None:
    """An object put under the store root behind its back (`cp`, `mc cp`): no recorded digest."""
    (root / key).parent.mkdir(parents=True, exist_ok=True)
    (root / key).write_bytes(data)


BAD_V = "runs/r9/environments/tool_call_precision/v7/manifest.json"
#: (what, how to break the store under its root, the manifest key the registry must skip or None)
DAMAGE = [
    ("a rollout without a digest", lambda st, root: _hand_written(root, "runs/r1/rollouts/mine.jsonl", b"{}\n"), None),
    ("an object without a digest outside runs/", lambda st, root: _hand_written(root, "notes.txt", b"x"), None),
    ("an adapter without a digest", lambda st, root: _hand_written(root, "runs/r1/adapters/c/v1/a.bin", b"x"), None),
    ("a manifest without a digest", lambda st, root: _hand_written(root, BAD_V, b"{}"), BAD_V),
    ("a manifest whose bytes changed", lambda st, root: (st.put_bytes(BAD_V, b"{}"),
                                                         (root / BAD_V).write_bytes(b"[]")), BAD_V),
    ("a manifest that is a JSON list", lambda st, root: st.put_bytes(BAD_V, b"[]"), BAD_V),
    ("a manifest that is not JSON", lambda st, root: st.put_bytes(BAD_V, b"\xff\xfe"), BAD_V),
    ("a manifest missing fields", lambda st, root: st.put_bytes(BAD_V, b'{"name": "x"}'), BAD_V),
    ("a manifest with fields of the wrong type", lambda st, root: st.put_bytes(BAD_V, json.dumps(
        {"name": "tool_call_precision", "version": "7", "capability": "c", "mode": "m", "status": "ACCEPTED",
         "run_id": "r9", "code": {}, "validation": {}, "created": "yesterday"}).encode()), BAD_V),
    ("a directory left by the old '.sha256' key rule",
     lambda st, root: _hand_written(root, "runs/r1/environments/x.sha256/v1/manifest.json", b"{}"), None),
]


@pytest.mark.parametrize(("what", "damage", "skipped"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_load_survives_any_one_bad_object(registry, tmp_path, what, damage, skipped):
    """Defect: one object without a digest anywhere under runs/ made `load` (the environment
    service's start-up, and so every command embedding the stack) fail. Now a bad manifest is left
    out, recorded in `skipped`, and its version is not given out again; other objects are not read."""
    _register(registry, "precondition_verification")
    _register(registry, "tool_call_precision", status="REJECTED", run="r2")
    damage(registry.store, tmp_path)
    fresh = EnvironmentRegistry(registry.store)
    assert fresh.load() == 2
    assert [(r.name, r.version) for r in fresh.list(include_rejected=True)] == [("precondition_verification", "1"),
                                                                                 ("tool_call_precision", "1")]
    assert [s.split(":", 1)[0] for s in fresh.skipped] == ([skipped] if skipped else [])
    # a skipped manifest's version (v7) stays taken
    assert _register(fresh, "tool_call_precision").version == ("8" if skipped else "2")


def test_load_lists_only_the_runs_environments(registry):
    _register(registry, "precondition_verification")
    for key in ["runs/r1/rollouts/part-0.jsonl", "runs/r1/adapters/c/v1/adapter_model.safetensors", "top.txt"]:
        registry.store.put_bytes(key, b"x")
    prefixes = []
    real_list = registry.store.list
    registry.store.list = lambda prefix="": prefixes.append(prefix) or real_list(prefix)
    fresh = EnvironmentRegistry(registry.store)
    assert fresh.load() == 1
    assert prefixes == ["runs/r1/environments/"]


def test_tampered_code_is_detected(registry, tmp_path):
    record = _register(registry, "precondition_verification")
    path = tmp_path / record.code["key"]
    path.write_text(GOOD + "\n# tampered\n")
    with pytest.raises(ArtifactCorrupted):
        registry.source(record)


# -- episodes ---------------------------------------------------------------------------------------

def _table(registry, **kw) -> EpisodeTable:
    return EpisodeTable(registry, SandboxConfig(call_timeout_s=10.0), **kw)


def _oracle(seed: int) -> list[dict]:
    return make_env("precondition_verification", "store").script(seed, skilled=True)


def test_episode_plays_to_reward_one_and_the_worker_is_reused(registry):
    record = _register(registry, "precondition_verification")
    table = _table(registry)

    async def run():
        rewards, workers = [], []
        for seed in (500_001, 500_002):
            episode_id, obs, tools = await table.reset(record, seed)
            assert obs["messages"][0]["role"] == "system" and len(tools) == 9  # all of the store's tools
            workers.append(table.episodes[episode_id].worker.proc.pid)
            for action in _oracle(seed):
                out = await table.step(episode_id, action)
            assert out.done and out.diagnostics == []
            rewards.append(out.reward)
            with pytest.raises(FailedPrecondition, match="is over"):
                await table.step(episode_id, {"message": "again"})
            await table.close(episode_id)
            with pytest.raises(NotFound):
                await table.step(episode_id, {"message": "hi"})
        return rewards, workers
    try:
        rewards, workers = asyncio.run(run())
    finally:
        table.shutdown()
    assert rewards == [1.0, 1.0]
    assert workers[0] == workers[1]  # the idle loaded worker served the second episode


@pytest.mark.parametrize("cpu_used, scratch, reused", [
    (None, None, True),            # neither observable (a pod): reused
    (0.0, (0, 3), True),
    (149.0, (0, 3), True),         # under half of cpu_seconds (300)
    (150.0, (0, 3), False),        # half of it spent: the next episode gets a fresh worker
    (299.0, (0, 3), False),
    (0.0, (31 << 20, 3), True),    # under half of scratch_mb (64)
    (0.0, (32 << 20, 3), False),   # half of it left behind by earlier episodes
    (0.0, (0, 49), True),          # under half of scratch_entries (100)
    (0.0, (0, 50), False),
])
def test_a_worker_that_spent_half_a_limit_is_not_reused(registry, monkeypatch, cpu_used, scratch, reused):
    """RLIMIT_CPU counts a worker's whole life, and what episodes leave in its scratch dir stays: a
    worker reused episode after episode would kill a cheap episode as a violation once earlier ones
    had spent its limit."""
    from services.environment.sandbox.parent import SandboxWorker
    from services.environment.sandbox.scratch import ScratchUsage

    record = _register(registry, "precondition_verification")
    table = EpisodeTable(registry, SandboxConfig(call_timeout_s=10.0, cpu_seconds=300, scratch_mb=64,
                                                 scratch_entries=100))
    monkeypatch.setattr(SandboxWorker, "cpu_used", lambda self: cpu_used)
    monkeypatch.setattr(SandboxWorker, "scratch_usage", lambda self: scratch and ScratchUsage(*scratch))

    async def run():
        pids = []
        for seed in (500_001, 500_002):
            episode_id, _, _ = await table.reset(record, seed)
            pids.append(table.episodes[episode_id].worker.proc.pid)
            await table.close(episode_id)
        return pids
    try:
        first, second = asyncio.run(run())
    finally:
        table.shutdown()
    assert (first == second) is reused


def test_idle_episodes_are_reaped_and_the_open_limit_holds(registry):
    record = _register(registry, "precondition_verification")
    table = _table(registry, max_open=1, idle_timeout_s=0.2)

    async def run():
        first, _, _ = await table.reset(record, 500_003)
        with pytest.raises(ResourceExhausted, match="limit 1"):
            await table.reset(record, 500_004)
        await asyncio.sleep(0.6)  # the background reaper (period idle/4) closes it
        assert first not in table.episodes
        assert await table.reap() == 0
        second, _, _ = await table.reset(record, 500_004)  # room again
        return second
    try:
        assert asyncio.run(run())
    finally:
        table.shutdown()


def test_a_violation_ends_only_that_episode(registry):
    record = _register(registry, "precondition_verification", source=TRAPPED)
    table = _table(registry)

    async def run():
        good, _, _ = await table.reset(record, 500_005)
        with pytest.raises(SandboxViolation) as caught:
            await table.reset(record, 1_000_013)
        assert caught.value.kind == "processes"
        # the other episode and new ones are unaffected
        for action in _oracle(500_005):
            out = await table.step(good, action)
        again, _, _ = await table.reset(record, 500_006)
        return out.reward, again
    try:
        reward, again = asyncio.run(run())
    finally:
        table.shutdown()
    assert reward == 1.0 and again
