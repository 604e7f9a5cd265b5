"""On-disk cache of built base agents, keyed by a hash of their build config.

    <cache_dir>/<kind>-<hash>/        the HF model directory (config, safetensors, tokenizer)
    <cache_dir>/<kind>-<hash>.json    what was built: kind, hash, config, wall time, metrics

A build runs in a scratch directory next to its final place and is renamed into place
only when complete (a rename within one filesystem is atomic), so a crashed build never
leaves a half-written model under the final name. A lock file serialises concurrent
builders of the same key: the second one waits, then finds the finished directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trace_common.errors import ArtifactCorrupted

#: Bumped when a change in the build code changes what a config produces.
BUILD_VERSION = 1
META_NAME = "trace_agent.json"


def default_cache_dir() -> Path:
    """`$TRACE_AGENT_CACHE`, else `~/.cache/trace/agents`."""
    env = os.environ.get("TRACE_AGENT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "trace" / "agents"


def config_hash(kind: str, config: BaseModel | dict[str, Any]) -> str:
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    blob = json.dumps({"kind": kind, "build_version": BUILD_VERSION, "config": data}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


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


def cached_build(cache_dir: Path, kind: str, config: BaseModel, build: Callable[[Path], dict[str, Any]], *,
                 log: Callable[[str], None] | None = None) -> Path:
    """Return the model dir for (kind, config), building it with `build(scratch_dir)` if absent.

    `build` writes the model into the directory it is given and returns metrics (JSON-able)
    to record; the wall time of the build is recorded as `build_seconds`.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = config_hash(kind, config)
    final, meta_path = entry_paths(cache_dir, kind, key)
    if meta_path.is_file() and final.is_dir():
        return final
    with open(cache_dir / f"{kind}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if meta_path.is_file() and final.is_dir():
                return final
            scratch = cache_dir / f".building-{kind}-{key}-{os.getpid()}"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            if log:
                log(f"building base agent {kind} ({key}) in {scratch}")
            started = time.perf_counter()
            try:
                metrics = build(scratch)
                seconds = time.perf_counter() - started
                meta = {"kind": kind, "hash": key, "build_version": BUILD_VERSION,
                        "config": config.model_dump(mode="json"), "build_seconds": round(seconds, 2),
                        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "metrics": metrics}
                (scratch / META_NAME).write_text(json.dumps(meta, indent=2), encoding="utf-8")
                if final.exists():  # a dir without its record: an interrupted older build
                    shutil.rmtree(final)
                os.rename(scratch, final)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            tmp_meta = meta_path.with_suffix(".json.tmp")
            tmp_meta.write_text(json.dumps(meta, indent=2), encoding="utf-8")
            os.replace(tmp_meta, meta_path)
            if log:
                log(f"built {kind} ({key}) in {seconds:.1f}s -> {final}")
            return final
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
