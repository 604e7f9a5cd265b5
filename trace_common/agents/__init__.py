"""Base agents: the policies TRACE starts from.

Two built-in agents are made by a warm-start stage on the built-in `store` domain's
scripted-expert trajectories (planted, partial capability gaps): `micro`, a
~1-million-parameter model trained from scratch (the demo's default), and `smollm2`,
SmolLM2-135M-Instruct converted from GGUF and warm-started. Each is reproducible from its
config (seeded) and cached on disk under a hash of that config and of its provenance (digests
of the training data and the build code), with a JSON build record next to it. `micro`'s
default build is also shipped in the repository (`shipped.py`), so a fresh clone installs it
in seconds. Any local HF model directory can replace them.

    from trace_common.agents import resolve_base_agent
    model_dir = resolve_base_agent("micro")           # -> Path of an HF model dir
    model_dir = resolve_base_agent("micro", progress=print)   # BuildEvents while built/waited for

Measure one with `python -m trace_common.agents.evaluate_cli micro`; build, ship and check one with
`tracectl agents build|ship|verify`.
"""

from trace_common.agents.cache import cached_build, config_hash, default_cache_dir, read_meta
from trace_common.agents.data import WarmStartData, expert_trajectories
from trace_common.agents.micro import MicroConfig, build_micro
from trace_common.agents.progress import BuildEvent, BuildProgress
from trace_common.agents.resolve import BUILT_IN, resolve_base_agent
from trace_common.agents.sft import SFTConfig
from trace_common.agents.smollm2 import SmolLM2BaseConfig, SmolLM2Config, gguf_path, smollm2_base_dir

__all__ = ["BUILT_IN", "BuildEvent", "BuildProgress", "MicroConfig", "SFTConfig", "SmolLM2BaseConfig",
           "SmolLM2Config", "WarmStartData", "build_micro", "cached_build", "config_hash", "default_cache_dir",
           "expert_trajectories", "gguf_path", "read_meta", "resolve_base_agent", "smollm2_base_dir"]
