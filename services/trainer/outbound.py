"""What a training job may reach outside the trainer: the vLLM server of `rollout_backend='vllm'`.

Trust boundary (docs/design.md, "Trust boundaries"): a job names its vLLM server by one of the operator's
endpoint profiles (TRACE_TRAINER_ENDPOINTS, `trace_common/endpoints.py`) or that profile's exact
base_url, and the adapter versions it saves for the server to load go inside the operator's
TRACE_TRAINER_VLLM_ADAPTER_ROOT (a shared volume); a request never picks either.

    check_vllm(config, endpoints, root)
        config.rollout_backend != "vllm"          -> config unchanged
        server = endpoints.server(vllm.profile, vllm.base_url)   PermissionDenied unless a profile
        root empty                                -> FailedPrecondition naming the setting
        local executor and root not a writable directory here -> FailedPrecondition (the workers
                                                     write the versions from this pod)
        executor is Kubernetes and no durable volume of the Job's container (kubernetes_job.shared_mounts)
            holds the root                        -> FailedPrecondition (the server could not read the versions)
        dir = normpath(join(root, vllm.adapter_dir))             (relative: under root)
        dir not inside root, lexically and with symlinks resolved -> PermissionDenied naming the field
        -> config with vllm.base_url = server.base_url, vllm.adapter_dir = dir

The trainer sends no key to its vLLM server (an in-cluster server), so a trainer profile with
`api_key_env` is refused when the settings load (settings.py), not ignored.
"""

from __future__ import annotations

import os

from trace_common.endpoints import Endpoints
from trace_common.errors import FailedPrecondition, InvalidArgument, PermissionDenied

from .grpo.config import GRPOConfig

FIELD = "spec.config.vllm"


def check_vllm(config: GRPOConfig, endpoints: Endpoints, adapter_root: str, *, field: str = FIELD,
               executor: str = "EXECUTOR_LOCAL", job_mounts: tuple[str, ...] = ()) -> GRPOConfig:
    """`config` with its vLLM server and adapter directory decided by the operator (module docstring).
    `field`: how the caller's input names the vllm block (e.g. "training.grpo.vllm"); `job_mounts`:
    where a Kubernetes training Job mounts durable volumes (kubernetes_job.shared_mounts)."""
    if config.rollout_backend != "vllm" or config.vllm is None:
        return config
    vllm = config.vllm
    server = endpoints.server(vllm.profile, vllm.base_url, field)
    if not adapter_root:
        raise FailedPrecondition(
            "rollout_backend='vllm' needs the directory the trainer saves adapter versions to for the vLLM server: "
            "the operator sets TRACE_TRAINER_VLLM_ADAPTER_ROOT (a volume both can read; the chart: "
            "vllm.adapterVolume.existingClaim); it is unset")
    configured = os.path.normpath(adapter_root)
    if executor != "EXECUTOR_KUBERNETES" and not (os.path.isdir(configured) and os.access(configured, os.W_OK)):
        raise FailedPrecondition(
            f"rollout_backend='vllm' under the local executor: TRACE_TRAINER_VLLM_ADAPTER_ROOT ({configured}) is "
            "not a writable directory in the trainer's pod, and its workers save the adapter versions there. "
            "Mount the volume the vLLM server reads at that path in the trainer's pod, or use the Kubernetes "
            "executor (the chart: vllm.adapterVolume.existingClaim mounts it in every training Job)")
    if executor == "EXECUTOR_KUBERNETES" and not any(_within(configured, os.path.normpath(m)) for m in job_mounts):
        raise FailedPrecondition(
            f"rollout_backend='vllm' under the Kubernetes executor: the training Job's container mounts no "
            f"persistent volume at TRACE_TRAINER_VLLM_ADAPTER_ROOT ({configured}; durable mounts: "
            f"{', '.join(job_mounts) or 'none'}), so the adapter versions it saves could not reach the vLLM "
            "server. Mount one volume in both (the chart: vllm.adapterVolume.existingClaim, a ReadWriteMany "
            "claim), or use rollout_backend='in_process' (the Job's own GPUs)")
    if "\x00" in vllm.adapter_dir:
        raise InvalidArgument(field=f"{field}.adapter_dir", expected="a path without NUL bytes",
                              got=vllm.adapter_dir, fix="give a relative path such as 'adapters/<capability>'")
    wanted = os.path.normpath(os.path.join(configured, vllm.adapter_dir))
    # contained lexically and after every symlink is resolved; the path handed on keeps the configured
    # root's spelling (the vLLM server mounts that path, not necessarily what it resolves to here)
    real_root = os.path.realpath(configured)
    inside = _within(wanted, configured) and _within(os.path.realpath(wanted), real_root)
    if not inside:
        raise PermissionDenied(f"{vllm.adapter_dir!r} is outside the trainer's adapter root {configured}",
                               field=f"{field}.adapter_dir",
                               fix="Give a path inside TRACE_TRAINER_VLLM_ADAPTER_ROOT, e.g. a relative one such "
                                   "as 'adapters/<capability>'")
    return config.model_copy(update={"vllm": vllm.model_copy(update={
        "base_url": server.base_url, "profile": server.profile, "adapter_dir": wanted})})


def _within(path: str, root: str) -> bool:
    """`path` is `root` or below it (both normalised absolute paths)."""
    return os.path.commonpath([root, path]) == root
