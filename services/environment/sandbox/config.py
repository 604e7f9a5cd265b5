"""The settings of one sandbox worker: `SandboxConfig` (limits, isolation layers, backend) and
`PodConfig` (its pods, backend "kubernetes").

Declared once, here: the environment settings nest them (`settings.py`, variables
TRACE_ENVIRONMENT_SANDBOX_*), the parent side (`parent.py`) starts workers from them, and the pod
transport (`pods.py`) builds pods from them. This module imports neither of those, so both can
depend on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .isolation import NOBODY


class PodConfig(BaseModel):
    """Where and how sandbox pods are created (backend "kubernetes"; see pods.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field("", description="Namespace of the sandbox pods (default: the service's own, from its "
                           "service-account mount, else 'default').")
    template: str = Field("", description="Path of the pod template JSON the chart renders "
                          "(/etc/trace/templates/sandbox-pod.json); empty = the built-in template.")
    image: str = Field("", description="Sandbox image; overrides the template's (required without a template).")
    cpu: str = Field("1", description="CPU limit of a sandbox pod (Kubernetes quantity).")
    deadline_s: int = Field(3600, ge=60, le=7 * 86_400, description="activeDeadlineSeconds of a sandbox pod.")
    scratch_mb: int = Field(512, ge=16, le=1 << 20, description="sizeLimit of the pod's scratch emptyDir (MiB).")
    poll_s: float = Field(0.25, gt=0, le=10, description="How often pod status is read while it starts.")
    require_egress_policy: bool = Field(
        True, description="Count the 'pod' layer only when a NetworkPolicy denying all egress selects the pod.")


class SandboxConfig(BaseModel):
    """Limits and isolation layers of one sandbox worker (see isolation.py for the layers)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    backend: Literal["process", "kubernetes"] = Field(
        "process", description="Where workers run: a local child process, or a Kubernetes pod per worker.")
    cpu_seconds: int = Field(300, ge=1, le=86_400, description="Total CPU seconds of a worker (RLIMIT_CPU).")
    memory_mb: int = Field(1024, ge=128, le=1 << 20, description="Address-space limit (RLIMIT_AS) in MiB.")
    file_size_mb: int = Field(16, ge=1, le=1 << 20, description="Largest file the worker may write (RLIMIT_FSIZE).")
    scratch_mb: int = Field(256, ge=1, le=1 << 20, description=(
        "Most the worker's scratch dir may hold on disk, its stderr file included (process backend; a pod's is "
        "pod.scratch_mb). The service measures it every scratch_check_s during a call and after each reply and "
        "kills a worker past it (violation 'disk'); it can overshoot by what the worker writes in one interval."))
    scratch_entries: int = Field(10_000, ge=16, le=10_000_000, description=(
        "Most files and directories the worker's scratch dir may hold (process backend), checked as scratch_mb."))
    scratch_check_s: float = Field(0.25, gt=0, le=10, description="How often the scratch dir is measured during a "
                                   "call (process backend).")
    max_processes: int = Field(0, ge=0, le=4096, description="RLIMIT_NPROC of the sandbox uid; 0 forbids fork.")
    open_files: int = Field(64, ge=16, le=65_536, description="RLIMIT_NOFILE.")
    call_timeout_s: float = Field(10.0, gt=0, le=3600, description="Wall-clock deadline of one call.")
    startup_timeout_s: float = Field(30.0, gt=0, le=600, description="Deadline of the startup handshake.")
    max_output_kb: int = Field(1024, ge=4, le=1 << 20, description="Largest response line in KiB.")
    pid_namespace: bool = Field(True, description="Run the worker as pid 1 of its own PID namespace (root only).")
    network_namespace: bool = Field(True, description="Unshare a network namespace (root or userns).")
    mount_namespace: bool = Field(True, description="Read-only root except scratch, private /proc (root only).")
    fs_root: bool = Field(True, description=(
        "Give the worker a root of its own (layer fs_root, with mount_namespace): an empty tmpfs holding read-only "
        "binds of the interpreter, its libraries, the standard library, site-packages, the project packages "
        "environment code may import and scratch; no /etc, host temp dir, artifact store or other worker's files."))
    drop_privileges: bool = Field(True, description="Drop to a sandbox uid when started as root.")
    uid_base: int = Field(1_000_000, ge=0, le=4_000_000_000, description=(
        "First uid of the range workers run as (one uid per live worker). 0: every worker runs as nobody "
        "(65534), and uid_distinct is not in force. The uids must be mapped where the service runs."))
    uid_count: int = Field(65_536, ge=1, le=1 << 24, description="Size of the uid range.")
    seccomp: bool = Field(True, description="Install the seccomp filter.")
    audit_hook: bool = Field(True, description=(
        "Install the Python audit hook and guarded builtins (typed violation reports; advisory). "
        "TRACE_ENVIRONMENT_SANDBOX_AUDIT_HOOK=false leaves the kernel layers alone, as the tests of those layers do."))
    require_network_isolation: bool = Field(
        True, description="Refuse a worker in which no kernel layer (netns or seccomp) blocks the network.")
    allow_weak: bool = Field(False, description=(
        "Let workers run although a required isolation layer is missing (e.g. a non-root service, a restricted "
        "pod). The validation report still names the missing layers. Never for untrusted code in production."))
    plain: bool = Field(False, description="No lockdown at all: benchmark baseline only, never untrusted code.")
    scratch_root: str = Field("", description=(
        "Parent directory of per-worker scratch dirs; every directory above it must be searchable by other "
        "users (o+x), since the worker runs under a uid of its own. Default: the system temp dir, or the first "
        "of /tmp, /var/tmp, /dev/shm when the temp dir is private (0700), said in the log (`scratch.py`)."))
    hash_seed: int = Field(0, ge=0, le=4_294_967_295, description="PYTHONHASHSEED of the worker.")
    python: str = Field("", description="Interpreter for the worker (default: this one).")
    pod: PodConfig = Field(default_factory=PodConfig, description="Sandbox pods (backend 'kubernetes').")
    kubernetes_api: Callable[[], Any] | None = Field(
        None, exclude=True, repr=False, description="Factory of the kubernetes ApiClient (default: in-cluster "
        "config, else kubeconfig); tests point it at an emulated API server.")

    @model_validator(mode="before")
    @classmethod
    def _flat_pod_names(cls, data: Any) -> Any:
        """Pod fields spelled flat, as the environment settings' variables spell them
        (TRACE_ENVIRONMENT_SANDBOX_NAMESPACE -> pod.namespace, ..._POD_<FIELD> -> pod.<field>)."""
        if not isinstance(data, dict):
            return data
        flat = [k for k in data if k == "namespace" or k.startswith("pod_")]
        if not flat:
            return data
        data = dict(data)
        pod = data.get("pod") or {}
        pod = pod.model_dump() if isinstance(pod, PodConfig) else dict(pod)
        for k in flat:
            pod["namespace" if k == "namespace" else k.removeprefix("pod_")] = data.pop(k)
        data["pod"] = pod
        return data

    @model_validator(mode="after")
    def _uids(self) -> SandboxConfig:
        if self.uid_base and self.uid_base <= NOBODY < self.uid_base + self.uid_count:
            raise ValueError(f"the sandbox uid range [{self.uid_base}, {self.uid_base + self.uid_count}) contains "
                             f"nobody ({NOBODY}); move TRACE_ENVIRONMENT_SANDBOX_UID_BASE past it (e.g. 1000000)")
        return self

    def worker_json(self, scratch: str, uid: int = NOBODY, uid_distinct: bool = False) -> str:
        return json.dumps({
            "scratch": scratch,
            "limits": {"cpu_seconds": self.cpu_seconds, "memory_bytes": self.memory_mb << 20,
                       "file_size_bytes": self.file_size_mb << 20, "max_processes": self.max_processes,
                       "open_files": self.open_files},
            "pid_namespace": self.pid_namespace, "network_namespace": self.network_namespace,
            "mount_namespace": self.mount_namespace, "fs_root": self.fs_root, "drop_privileges": self.drop_privileges,
            "uid": uid, "uid_distinct": uid_distinct, "seccomp": self.seccomp, "audit_hook": self.audit_hook,
            "plain": self.plain, "max_output_bytes": self.max_output_kb << 10})
