"""Serving instances of registered environments by seed, each in a sandbox worker.

`ResetEpisode(name, version, seed)` -> an episode id, the first messages and the instance's hint
(`Observation.guidance`, kept apart from the messages); `StepEpisode(id, action)` ->
observation, done, reward (once done), diagnostics; `CloseEpisode(id)`. This is how the
trainer samples instances of a generated environment without ever running its code.

- Workers are per environment version: an idle worker with the module already loaded is
  reused for the next episode of that version (at most `idle_workers` kept per version),
  otherwise a new one is started and the module loaded (its source read from the
  registry, sha256-verified). One episode runs in one worker at a time. A worker that has used
  `RETIRE_FRACTION` of its lifetime CPU limit (RLIMIT_CPU counts every episode it served) or of its
  scratch limits (what earlier episodes left there stays) is not reused, so no episode is killed as a
  violation for what earlier ones spent.
- A sandbox violation or a crash ends that episode (the worker is discarded) and is
  reported to the caller as RESOURCE_EXHAUSTED -- except a worker killed from outside the
  sandbox (violation kind "killed": not at its limits, no OOM kill recorded), reported as
  UNAVAILABLE with what is known; the service and other episodes go on.
- Episodes idle for longer than `idle_timeout_s` are closed by a reaper task; at most
  `max_open` episodes are open at once (RESOURCE_EXHAUSTED beyond).

Worker calls block (pipes), so the async methods run them in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from trace_common.env import action_from_dict
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable

from . import metrics as m
from .registry import EnvironmentRecord, EnvironmentRegistry
from .sandbox.environment import LoadedModule, SandboxEnvironment, load_module
from .sandbox.parent import SandboxConfig, SandboxViolation, SandboxWorker, sandbox_for


def _reported(exc: SandboxViolation) -> Exception:
    """What the caller is told: a worker killed from outside the sandbox (kind "killed") is not
    the environment's doing, so UNAVAILABLE (reset a new episode) instead of RESOURCE_EXHAUSTED."""
    if exc.kind == "killed":
        return Unavailable(f"the sandbox worker of this episode was {exc.detail.removeprefix('worker ')}; "
                           "the episode is closed: reset a new one")
    return exc


@dataclass
class Episode:
    episode_id: str
    record: EnvironmentRecord
    worker: SandboxWorker
    env: SandboxEnvironment
    seed: int
    last_used: float = field(default_factory=time.monotonic)
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class StepOutcome:
    observation: list[dict[str, Any]]
    done: bool
    reward: float = 0.0
    diagnostics: list[dict[str, Any]] = field(default_factory=list)


#: Share of a worker's lifetime CPU limit (SandboxConfig.cpu_seconds), or of its scratch limits
#: (scratch_mb, scratch_entries), past which it is not reused.
RETIRE_FRACTION = 0.5


class EpisodeTable:
    def __init__(self, registry: EnvironmentRegistry, sandbox: SandboxConfig, *, max_open: int = 256,
                 idle_timeout_s: float = 300.0, idle_workers: int = 2):
        self.registry = registry
        self.sandbox = sandbox
        self.max_open = max_open
        self.idle_timeout_s = idle_timeout_s
        self.idle_workers = idle_workers
        self.episodes: dict[str, Episode] = {}
        self._pool: dict[tuple[str, str], list[tuple[SandboxWorker, LoadedModule]]] = {}
        self._pool_lock = threading.Lock()
        self._reaper: asyncio.Task | None = None
        self._opening = 0

    # -- workers ---------------------------------------------------------------------------
    def _reusable(self, worker: SandboxWorker) -> bool:
        """Alive, with at least 1 - RETIRE_FRACTION of its CPU limit and of its scratch limits left
        (unknown: yes)."""
        if not worker.alive:
            return False
        limits = worker.config
        used = worker.cpu_used()
        if used is not None and used >= RETIRE_FRACTION * limits.cpu_seconds:
            return False
        scratch = worker.scratch_usage()
        return scratch is None or (scratch.bytes < RETIRE_FRACTION * (limits.scratch_mb << 20)
                                   and scratch.entries < RETIRE_FRACTION * limits.scratch_entries)

    def _worker_for(self, record: EnvironmentRecord) -> tuple[SandboxWorker, LoadedModule]:
        """(blocking) An idle loaded worker for the record, or a new one."""
        while True:
            with self._pool_lock:
                pool = self._pool.get((record.name, record.version), [])
                if not pool:
                    break
                worker, module = pool.pop()
            if self._reusable(worker):
                return worker, module
            worker.close()
        source = self.registry.source(record)
        worker = SandboxWorker(sandbox_for(self.sandbox, record.mode), label=f"{record.name}-v{record.version}")
        try:
            worker.start()
            module = load_module(worker, source)
        except BaseException:
            worker.close()
            raise
        return worker, module

    def _release(self, episode: Episode) -> None:
        """(blocking) Give the worker back to the pool, or stop it."""
        key = (episode.record.name, episode.record.version)
        worker = episode.worker
        if self._reusable(worker):
            try:
                episode.env.close()
            except Exception:  # noqa: BLE001 - a worker that cannot close an instance is not reused
                worker.close()
                return
            with self._pool_lock:
                pool = self._pool.setdefault(key, [])
                if len(pool) < self.idle_workers:
                    pool.append((worker, episode.env.module))
                    return
        worker.close()

    # -- API -------------------------------------------------------------------------------
    def get(self, episode_id: str) -> Episode:
        if not episode_id:
            raise InvalidArgument(field="episode_id", expected="an id returned by ResetEpisode", got=episode_id)
        try:
            return self.episodes[episode_id]
        except KeyError:
            raise NotFound(f"no open episode {episode_id!r}; it was closed, timed out, or never opened") from None

    async def reset(self, record: EnvironmentRecord, seed: int) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        if isinstance(seed, bool) or seed < 0:
            raise InvalidArgument(field="seed", expected="a non-negative integer", got=seed)
        if len(self.episodes) + self._opening >= self.max_open:
            raise ResourceExhausted(f"{len(self.episodes)} episodes are open (limit {self.max_open}); close some "
                                    "or wait for idle ones to time out")
        self._ensure_reaper()
        self._opening += 1
        try:
            worker, module = await asyncio.to_thread(self._worker_for, record)
            env = SandboxEnvironment(worker, module)
            try:
                obs = await asyncio.to_thread(env.reset, seed)
            except SandboxViolation as exc:
                worker.close()
                raise _reported(exc) from None
            except BaseException:
                await asyncio.to_thread(self._release, Episode("", record, worker, env, seed))
                raise
        finally:
            self._opening -= 1
        episode_id = uuid.uuid4().hex
        self.episodes[episode_id] = Episode(episode_id, record, worker, env, seed)
        m.EPISODES_OPEN.set(len(self.episodes))
        return episode_id, {"messages": [msg.to_dict() for msg in obs.messages], "task_id": obs.task_id,
                            "guidance": obs.guidance}, env.tool_schemas()

    async def step(self, episode_id: str, action: dict[str, Any]) -> StepOutcome:
        episode = self.get(episode_id)
        async with episode.busy:
            episode.last_used = time.monotonic()
            try:
                result = await asyncio.to_thread(self._step, episode, action)
            except SandboxViolation as exc:
                self._drop(episode_id)
                episode.worker.close()
                raise _reported(exc) from None
            episode.last_used = time.monotonic()
            return result

    @staticmethod
    def _step(episode: Episode, action: dict[str, Any]) -> StepOutcome:
        if episode.env.done:
            raise FailedPrecondition(f"episode {episode.episode_id} is over; close it and reset a new one")
        result = episode.env.step(action_from_dict(action))
        out = StepOutcome(observation=[msg.to_dict() for msg in result.observation], done=result.done)
        if result.done:
            data = episode.env.result()
            out.reward, out.diagnostics = float(data["reward"]), list(data.get("diagnostics") or [])
        return out

    def _drop(self, episode_id: str) -> Episode | None:
        episode = self.episodes.pop(episode_id, None)
        m.EPISODES_OPEN.set(len(self.episodes))
        return episode

    async def close(self, episode_id: str) -> None:
        episode = self.get(episode_id)
        async with episode.busy:
            if self._drop(episode_id) is not None:
                await asyncio.to_thread(self._release, episode)

    # -- housekeeping ----------------------------------------------------------------------
    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        period = max(0.05, min(5.0, self.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            await self.reap()

    async def reap(self) -> int:
        """Close episodes idle for longer than the timeout; returns how many."""
        now = time.monotonic()
        stale = [e for e in list(self.episodes.values())
                 if now - e.last_used > self.idle_timeout_s and not e.busy.locked()]
        for episode in stale:
            with contextlib.suppress(NotFound):
                await self.close(episode.episode_id)
        return len(stale)

    def shutdown(self) -> None:
        """Stop every worker (service shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for episode in list(self.episodes.values()):
            episode.worker.close()
        self.episodes.clear()
        with self._pool_lock:
            pools, self._pool = list(self._pool.values()), {}
        for pool in pools:
            for worker, _ in pool:
                worker.close()
        m.EPISODES_OPEN.set(0)
