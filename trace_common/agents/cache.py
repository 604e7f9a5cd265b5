"""On-disk cache of built base agents, keyed by a hash of everything a build depends on.

    <cache_dir>/<kind>-<key>/                 the HF model directory (config, safetensors, tokenizer)
    <cache_dir>/<kind>-<key>.json             what was built: kind, key, config, provenance, wall time, metrics
    <cache_dir>/<kind>-<key>.lock             held (flock) by the one process building that entry
    <cache_dir>/<kind>-<key>.building.json    that builder: pid, host, start time, its last progress event

The key hashes the kind, `BUILD_VERSION`, the config and, for agents trained on the domain's
data, their provenance (`provenance.py`: digests of the training data and of the build code),
so a domain change that changes the expert's conversations is a new entry, not a stale one.

A build runs in a scratch directory next to its final place and is renamed into place only when
complete (a rename within one filesystem is atomic), so a crashed build never leaves a
half-written model under the final name. The lock serialises builders of one key: a second
process does not wait silently, it reports (`BuildEvent` phase "waiting") who builds the entry,
since when, and that builder's last progress, every `poll_s` seconds, then finds the finished
directory. A shipped artifact (`shipped_files.py`) whose build record carries the same key is installed
(sha256-verified copy) instead of building; one with another key is not used, and the reason
(which digest differs) is part of the build's first progress event.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trace_common.agents.progress import BuildEvent, BuildProgress, default_progress, fmt_seconds
from trace_common.agents.shipped_files import REBUILD_COMMAND, install_if_matching, read_record
from trace_common.errors import ArtifactCorrupted, FailedPrecondition

#: Bumped when a change in the build code changes what a config produces and no digest sees it.
BUILD_VERSION = 2
META_NAME = "trace_agent.json"
#: How often a process waiting for another's build checks the lock and reports (seconds).
POLL_S = 2.0
#: How often a builder rewrites its `.building.json` state file (seconds).
STATE_EVERY_S = 2.0


def default_cache_dir() -> Path:
    """`$TRACE_AGENT_CACHE`, else `~/.cache/trace/agents`. FailedPrecondition where the variable names
    something that is not a directory (a job would otherwise fail on a bare FileExistsError)."""
    env = os.environ.get("TRACE_AGENT_CACHE")
    if env and os.path.lexists(env) and not os.path.isdir(env):
        raise FailedPrecondition(f"TRACE_AGENT_CACHE={env} is not a directory: point it at a directory this "
                                 "process can write (it is created when missing), or unset it for "
                                 "~/.cache/trace/agents")
    return Path(env) if env else Path.home() / ".cache" / "trace" / "agents"


def config_hash(kind: str, config: BaseModel | dict[str, Any], provenance: dict[str, Any] | None = None) -> str:
    """The cache key: 16 hex digits over kind, BUILD_VERSION, config and (when given) provenance."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    body: dict[str, Any] = {"kind": kind, "build_version": BUILD_VERSION, "config": data}
    if provenance is not None:
        body["provenance"] = {k: provenance[k] for k in ("data_digest", "code") if k in provenance}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def entry_paths(cache_dir: Path, kind: str, key: str) -> tuple[Path, Path]:
    return cache_dir / f"{kind}-{key}", cache_dir / f"{kind}-{key}.json"


def read_meta(model_dir: Path) -> dict[str, Any] | None:
    """The build record next to a cached model dir (None for a dir not built here)."""
    path = model_dir.with_name(model_dir.name + ".json")
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ArtifactCorrupted(f"{path} is not valid JSON ({exc}); delete it and its model dir to rebuild") from exc


#: `build(scratch_dir, progress)` writes the model into scratch_dir and returns metrics (JSON-able).
Build = Callable[[Path, BuildProgress | None], dict[str, Any]]


def cached_build(cache_dir: Path, kind: str, config: BaseModel, build: Build, *,
                 log: Callable[[str], None] | None = None, progress: BuildProgress | None = None,
                 provenance: dict[str, Any] | None = None, shipped: Path | None = None,
                 estimate: str = "", poll_s: float = POLL_S) -> Path:
    """Return the model dir for (kind, config, provenance), building it if absent (see the module
    docstring). `estimate` (e.g. "~15 min on 2 cores") goes into the first progress event.
    Without `progress`, events go to the current service job's progress, or to the log
    (`progress.default_progress`)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = config_hash(kind, config, provenance)
    final, meta_path = entry_paths(cache_dir, kind, key)
    if meta_path.is_file() and final.is_dir():
        return final
    if progress is None:
        progress = default_progress()
    lock_path = cache_dir / f"{kind}-{key}.lock"
    state_path = cache_dir / f"{kind}-{key}.building.json"
    with open(lock_path, "a+") as lock:
        _acquire(lock, kind, key, state_path, progress, poll_s)
        try:
            if meta_path.is_file() and final.is_dir():
                return final  # built by the process we waited for
            scratch = cache_dir / f".building-{kind}-{key}-{os.getpid()}"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            started = time.perf_counter()
            state = _StateWriter(state_path, kind, key, progress)
            try:
                installed = install_if_matching(shipped, kind, key, scratch, state) if shipped is not None else None
                if installed is not None:
                    metrics, source = installed, {"source": "shipped", "shipped_from": str(shipped)}
                else:
                    why = _why(shipped, kind, key, provenance, final)
                    state(BuildEvent(agent=kind, phase="start", message=(
                        f"building the {kind} base agent: {why}. Built once{f' ({estimate})' if estimate else ''}, "
                        f"then cached at {final}")))
                    if log:
                        log(f"building base agent {kind} ({key}) in {scratch}: {why}")
                    metrics, source = build(scratch, state), {"source": "built"}
                seconds = time.perf_counter() - started
                meta = {"kind": kind, "hash": key, "build_version": BUILD_VERSION,
                        "config": config.model_dump(mode="json"), "provenance": provenance, **source,
                        "build_seconds": round(seconds, 2),
                        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "metrics": metrics}
                (scratch / META_NAME).write_text(json.dumps(meta, indent=2), encoding="utf-8")
                if final.exists():  # a dir without its record: an interrupted older build
                    shutil.rmtree(final)
                os.rename(scratch, final)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            finally:
                state.close()
            tmp_meta = meta_path.with_suffix(".json.tmp")
            tmp_meta.write_text(json.dumps(meta, indent=2), encoding="utf-8")
            os.replace(tmp_meta, meta_path)
            done = (f"installed the shipped {kind} agent (sha256 verified)" if source["source"] == "shipped"
                    else f"built {kind} in {fmt_seconds(seconds)}")
            if progress is not None:
                progress(BuildEvent(agent=kind, phase="done", elapsed_s=seconds, message=f"{done}; cached at {final}"))
            if log:
                log(f"{done} -> {final}")
            return final
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _why(shipped: Path | None, kind: str, key: str, provenance: dict[str, Any] | None, final: Path) -> str:
    """Why this build runs, for its first progress line."""
    reason = f"first use of this {kind} configuration (no {final.name} in {final.parent})"
    if shipped is None:
        return reason
    from trace_common.agents.provenance import digest_differences

    record = read_record(shipped)
    if record is None:
        return f"{reason}; no shipped artifact in {shipped} (make one with: {REBUILD_COMMAND[kind]})"
    diffs = digest_differences(record.get("provenance") or {}, provenance or {})
    if record.get("key") != key:
        what = "; ".join(diffs) or "another build version"
        return (f"{reason}; the shipped artifact in {shipped} was built from {what}, so it is not used "
                f"(rebuild it with: {REBUILD_COMMAND[kind]})")
    return reason


def _acquire(lock, kind: str, key: str, state_path: Path, progress: BuildProgress | None, poll_s: float) -> None:
    """Take the entry's lock; while another process holds it, report who and what it is doing."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    waited = time.monotonic()
    while True:
        if progress is not None:
            progress(waiting_event(kind, key, state_path, time.monotonic() - waited))
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(min(0.2, poll_s))


def waiting_event(kind: str, key: str, state_path: Path, waited_s: float) -> BuildEvent:
    """What a process waiting for another's build of (kind, key) reports."""
    holder = _read_json(state_path)
    if holder is None:
        who = f"another process (no {state_path.name}: starting, or just finished)"
        last = None
    else:
        since = holder.get("started_at", 0.0)
        who = (f"pid {holder.get('pid')} on {holder.get('host')} since "
               f"{time.strftime('%H:%M:%S', time.localtime(since))} ({fmt_seconds(time.time() - since)} ago)")
        last = holder.get("event")
    theirs = f"; its progress: {BuildEvent(**last).line()}" if last else ""
    return BuildEvent(agent=kind, phase="waiting", elapsed_s=waited_s,
                      step=(last or {}).get("step", 0), total=(last or {}).get("total", 0),
                      message=f"waiting for the build of the {kind} base agent ({key}) by {who}{theirs}")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


class _StateWriter:
    """The builder's side of the lock: forwards each event to `progress` and keeps
    `.building.json` (who builds, since when, last event) fresh for processes that wait."""

    def __init__(self, path: Path, kind: str, key: str, progress: BuildProgress | None):
        self.path, self.progress = path, progress
        self.head = {"kind": kind, "key": key, "pid": os.getpid(), "host": socket.gethostname(),
                     "started_at": time.time()}
        self._written = float("-inf")
        self._phase: str | None = None
        self._write(None)

    def _write(self, event: BuildEvent | None) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps({**self.head, "event": event.to_dict() if event else None}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            return  # the state file only informs waiters; never fail a build over it
        self._written = time.monotonic()

    def __call__(self, event: BuildEvent) -> None:
        if event.phase != self._phase or time.monotonic() - self._written >= STATE_EVERY_S:
            self._phase = event.phase
            self._write(event)
        if self.progress is not None:
            self.progress(event)

    def close(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            pass
