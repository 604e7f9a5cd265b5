"""`resolve_base_agent`: a base agent name or a local model dir -> a local HF model directory.

    resolve_base_agent("micro")                 # built (warm start) once, then cached
    resolve_base_agent("smollm2", cache_dir)    # GGUF conversion + warm start, cached
    resolve_base_agent("smollm2-base")          # the converted model, no warm start
    resolve_base_agent("/models/Qwen3-0.6B")    # any local HF model dir, used as is
    resolve_base_agent("micro", progress=show)  # show(BuildEvent) while it is built or waited for

`micro` with its default config comes from the shipped artifact (`shipped.py`) when the current
code produces the artifact's key: a verified copy into the cache, seconds instead of the
~15-minute warm start. Without `progress`, a build inside a service job (a rollout, a
calibration) reports as that job's progress, which `tracectl` shows while it watches the job;
outside any job it logs one line every 30 s (`trace_common.agents` logger).

A served model name (vLLM, any OpenAI-compatible endpoint) needs no resolution: the
rollout service gives it to `OpenAIPolicy` directly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trace_common.agents.cache import cached_build, config_hash, default_cache_dir, entry_paths
from trace_common.agents.micro import PROBE_EPISODES, MicroConfig, build_micro
from trace_common.agents.progress import BuildProgress, default_progress
from trace_common.agents.provenance import code_digests, data_digest
from trace_common.agents.shipped_files import shipped_dir
from trace_common.agents.smollm2 import SmolLM2BaseConfig, SmolLM2Config, build_smollm2, smollm2_base_dir
from trace_common.errors import InvalidArgument, NotFound

BUILT_IN = ("micro", "smollm2", "smollm2-base")
CONFIGS: dict[str, type[BaseModel]] = {"micro": MicroConfig, "smollm2": SmolLM2Config,
                                       "smollm2-base": SmolLM2BaseConfig}
#: What a first-use build takes here (2 cores), for the first progress line.
ESTIMATES = {"micro": "about 1 h 45 min on 2 cores", "smollm2": "about 15 min on 2 cores, after a ~30 s conversion"}


def provenance_of(kind: str, config: Any, cache_dir: Path | None, progress: BuildProgress | None = None
                  ) -> tuple[dict[str, Any], list | None]:
    """(provenance of a data-trained agent's build, the expert trajectories when they were played
    to compute it). See provenance.py."""
    digest, trajectories = data_digest(config.data, cache_dir, progress=progress, agent=kind)
    return {"config_hash": config_hash(kind, config), "data_digest": digest, "code": code_digests(kind)}, trajectories


def resolve_base_agent(name_or_path: str | Path, cache_dir: str | Path | None = None, *,
                       config: BaseModel | None = None, log: Callable[[str], None] | None = None,
                       progress: BuildProgress | None = None, use_shipped: bool = True) -> Path:
    """Return a local HF model dir for `name_or_path` (see the module docstring).

    `config` overrides the built-in agent's default config (a `MicroConfig`,
    `SmolLM2Config` or `SmolLM2BaseConfig` matching the name); a different config is a
    different cache entry. `progress` receives a `BuildEvent` for every phase of a build (or
    of a wait for another process's build) and every few training steps. `use_shipped=False`
    builds even where the shipped artifact would do (`tracectl agents ship`). A default-config
    `micro` build records a greedy pass-rate probe of `micro.PROBE_EPISODES` test episodes; a
    build of an explicit config does not (tests, experiments: `build_micro` takes the count).
    """
    name = str(name_or_path)
    # the cache only for a built-in agent: a model directory needs no usable TRACE_AGENT_CACHE
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) if name in BUILT_IN else None
    shown = progress if progress is not None else default_progress()
    if name == "micro":
        cfg = _expect(config, MicroConfig, name)
        prov, trajectories = provenance_of(name, cfg, cache, shown)
        return cached_build(cache, "micro", cfg,
                            lambda out, p: build_micro(cfg, out, log=log, progress=p, trajectories=trajectories,
                                                       probe_episodes=PROBE_EPISODES if config is None else 0),
                            log=log, progress=shown, provenance=prov, shipped=shipped_dir("micro") if use_shipped else None,
                            estimate=ESTIMATES["micro"] if config is None else "")
    if name == "smollm2":
        cfg2 = _expect(config, SmolLM2Config, name)
        prov2, _ = provenance_of(name, cfg2, cache, shown)
        return cached_build(cache, "smollm2", cfg2,
                            lambda out, p: build_smollm2(cfg2, out, cache, log=log, progress=p),
                            log=log, progress=shown, provenance=prov2,
                            estimate=ESTIMATES["smollm2"] if config is None else "")
    if name == "smollm2-base":
        return smollm2_base_dir(cache, _expect(config, SmolLM2BaseConfig, name), log=log, progress=shown)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        if config is not None:
            raise InvalidArgument(field="config", expected="None for a model directory (it is used as is)",
                                  got=type(config).__name__)
        return path.resolve()
    raise NotFound(f"base agent {name!r} is neither a built-in agent ({', '.join(BUILT_IN)}) nor a local "
                   "Hugging Face model directory with a config.json; for a served model use the HTTP policy backend")


def cached_entry(name: str, cache_dir: str | Path | None = None, config: BaseModel | None = None) -> Path | None:
    """The cache entry `resolve_base_agent(name)` would return, if it is already there (no build)."""
    if name not in ("micro", "smollm2"):
        return None
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final, meta = entry_paths(cache, name, _key(name, _expect(config, CONFIGS[name], name), cache))
    return final if final.is_dir() and meta.is_file() else None


def _key(name: str, config: BaseModel, cache: Path) -> str:
    """The cache key of a data-trained agent's build of `config` under the current code."""
    prov, _ = provenance_of(name, config, cache)
    return config_hash(name, config, prov)


def base_agent_key(name: str, cache_dir: str | Path | None = None) -> str | None:
    """Which agent `resolve_base_agent(name)` gives under the current code, without building it: the
    cache key of a built-in agent's default config (config, training data and build code: a rebuilt
    `micro` has another key), or for a local model directory a digest of its files' names, sizes and
    mtimes; None for anything else (a served model is known only by its name)."""
    if name in ("micro", "smollm2"):
        return _key(name, CONFIGS[name](), Path(cache_dir) if cache_dir is not None else default_cache_dir())
    try:
        path = Path(name).expanduser()
        if not (path.is_dir() and (path / "config.json").is_file()):
            return None
        stats = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
    except (OSError, RuntimeError) as err:  # an unknown ~user, an unreadable directory
        raise InvalidArgument(field="base_agent.name", expected="a built-in agent or a readable local model "
                              "directory", got=name, reason=str(err)) from None
    return hashlib.sha256(json.dumps([str(path.resolve()), stats]).encode()).hexdigest()[:16]


def _expect(config: BaseModel | None, cls: type[BaseModel], name: str):
    if config is None:
        return cls()
    if not isinstance(config, cls):
        raise InvalidArgument(field="config", expected=f"a {cls.__name__} for base agent {name!r}",
                              got=type(config).__name__)
    return config
