"""What a training job may reach outside the trainer: the vLLM server of `rollout_backend='vllm'`.

Trust boundary (DESIGN, "Trust boundaries"): a job names its vLLM server by one of the operator's
endpoint profiles (TRACE_TRAINER_ENDPOINTS, `trace_common/endpoints.py`) or that profile's exact
base_url, and the adapter versions it saves for the server to load go inside the operator's
TRACE_TRAINER_VLLM_ADAPTER_ROOT (a shared volume); a request never picks either.

    check_vllm(config, endpoints, root)
        config.rollout_backend != "vllm"          -> config unchanged
        server = endpoints.server(vllm.profile, vllm.base_url)   PermissionDenied unless a profile
        root empty                                -> FailedPrecondition naming the setting
        dir = realpath(join(root, vllm.adapter_dir))             (relative: under root)
        dir not inside realpath(root)             -> PermissionDenied naming the field
        -> config with vllm.base_url = server.base_url, vllm.adapter_dir = dir

The trainer sends no key to its vLLM server (an in-cluster server), so a trainer profile with
`api_key_env` is refused when the settings load (settings.py), not ignored.
"""

from __future__ import annotations

import os

from trace_common.endpoints import Endpoints
from trace_common.errors import FailedPrecondition, PermissionDenied

from .grpo.config import GRPOConfig

FIELD = "spec.config.vllm"


def check_vllm(config: GRPOConfig, endpoints: Endpoints, adapter_root: str) -> GRPOConfig:
    """`config` with its vLLM server and adapter directory decided by the operator (module docstring)."""
    if config.rollout_backend != "vllm" or config.vllm is None:
        return config
    vllm = config.vllm
    server = endpoints.server(vllm.profile, vllm.base_url, FIELD)
    if not adapter_root:
        raise FailedPrecondition(
            "rollout_backend='vllm' needs the directory the trainer saves adapter versions to for the vLLM server: "
            "the operator sets TRACE_TRAINER_VLLM_ADAPTER_ROOT (a volume both can read); it is unset")
    root = os.path.realpath(adapter_root)
    wanted = os.path.realpath(os.path.join(root, vllm.adapter_dir))
    if os.path.commonpath([root, wanted]) != root:
        raise PermissionDenied(f"{vllm.adapter_dir!r} is outside the trainer's adapter root {root}",
                               field=f"{FIELD}.adapter_dir",
                               fix="Give a path inside TRACE_TRAINER_VLLM_ADAPTER_ROOT, e.g. a relative one such "
                                   "as 'adapters/<capability>'")
    return config.model_copy(update={"vllm": vllm.model_copy(update={
        "base_url": server.base_url, "profile": server.profile, "adapter_dir": wanted})})
