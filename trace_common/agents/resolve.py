"""`resolve_base_agent`: a base agent name or a local model dir -> a local HF model directory.

    resolve_base_agent("micro")                 # built (warm start) once, then cached
    resolve_base_agent("smollm2", cache_dir)    # GGUF conversion + warm start, cached
    resolve_base_agent("smollm2-base")          # the converted model, no warm start
    resolve_base_agent("/models/Qwen3-0.6B")    # any local HF model dir, used as is

A served model name (vLLM, any OpenAI-compatible endpoint) needs no resolution: the
rollout service gives it to `OpenAIPolicy` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from trace_common.agents.cache import cached_build, default_cache_dir
from trace_common.agents.micro import MicroConfig, build_micro
from trace_common.agents.smollm2 import SmolLM2BaseConfig, SmolLM2Config, build_smollm2, smollm2_base_dir
from trace_common.errors import InvalidArgument, NotFound

BUILT_IN = ("micro", "smollm2", "smollm2-base")


def resolve_base_agent(name_or_path: str | Path, cache_dir: str | Path | None = None, *,
                       config: BaseModel | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Return a local HF model dir for `name_or_path` (see the module docstring).

    `config` overrides the built-in agent's default config (a `MicroConfig`,
    `SmolLM2Config` or `SmolLM2BaseConfig` matching the name); a different config is a
    different cache entry.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = str(name_or_path)
    if name == "micro":
        cfg = _expect(config, MicroConfig, name)
        return cached_build(cache, "micro", cfg, lambda out: build_micro(cfg, out, log=log), log=log)
    if name == "smollm2":
        cfg2 = _expect(config, SmolLM2Config, name)
        return cached_build(cache, "smollm2", cfg2, lambda out: build_smollm2(cfg2, out, cache, log=log), log=log)
    if name == "smollm2-base":
        return smollm2_base_dir(cache, _expect(config, SmolLM2BaseConfig, name), log=log)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        if config is not None:
            raise InvalidArgument(field="config", expected="None for a model directory (it is used as is)",
                                  got=type(config).__name__)
        return path.resolve()
    raise NotFound(f"base agent {name!r} is neither a built-in agent ({', '.join(BUILT_IN)}) nor a local "
                   "Hugging Face model directory with a config.json; for a served model use the HTTP policy backend")


def _expect(config: BaseModel | None, cls: type[BaseModel], name: str):
    if config is None:
        return cls()
    if not isinstance(config, cls):
        raise InvalidArgument(field="config", expected=f"a {cls.__name__} for base agent {name!r}",
                              got=type(config).__name__)
    return config
