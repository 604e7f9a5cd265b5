"""The operator's training Job template (TRACE_TRAINER_JOB_TEMPLATE, the chart's training-job.json):
reading it, and what its container mounts. Kept apart from kubernetes_job.py (which needs the
`kubernetes` client) so the service can check a job against the template without that import.

    load_job_template(path)  -> the manifest, or None (no template: the built-in Job); an unreadable
                                file, a non-Job, or not exactly one container -> FailedPrecondition
    shared_mounts(job)       -> mount paths of the container on volumes that outlive the pod and are
                                not one node's (not emptyDir / configMap / secret / hostPath / ...),
                                writable (neither mount nor claim readOnly), whole (no subPath): vLLM
                                rollouts under the Kubernetes executor need the adapter root on one
                                (outbound.py)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_common import errors as E

#: Volume kinds that live and die with the pod, are read-only projections, or are one node's own disk
#: (hostPath): nothing the vLLM server's pod could be sure to read a file from that the trainer wrote.
POD_LOCAL_VOLUMES = frozenset({"emptyDir", "configMap", "secret", "downwardAPI", "projected", "ephemeral",
                               "hostPath"})


def load_job_template(path: str) -> dict[str, Any] | None:
    """The operator's Job manifest at `path` (TRACE_TRAINER_JOB_TEMPLATE), or None for the built-in Job."""
    if not path:
        return None
    fix = "point TRACE_TRAINER_JOB_TEMPLATE at the chart's training-job.json, or unset it for the built-in Job"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise E.FailedPrecondition(f"cannot read the training Job template {path}: {exc}; {fix}") from exc
    pod = ((data.get("spec") or {}).get("template") or {}).get("spec") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("kind") != "Job" or not isinstance(pod, dict):
        raise E.FailedPrecondition(f"the training Job template {path} is not a batch/v1 Job manifest with "
                                   f"spec.template.spec; {fix}")
    containers = pod.get("containers")
    if not isinstance(containers, list) or len(containers) != 1 or not isinstance(containers[0], dict):
        raise E.FailedPrecondition(f"the training Job template {path} must have exactly one container (the "
                                   f"worker), it has {len(containers) if isinstance(containers, list) else 0}; {fix}")
    return data


def job_container(job: dict[str, Any]) -> dict[str, Any]:
    """The Job's one container (load_job_template checked there is exactly one)."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def shared_mounts(job: dict[str, Any]) -> list[str]:
    """Mount paths of the Job's container on volumes that outlive the pod (module docstring)."""
    pod = job["spec"]["template"]["spec"]
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}

    def durable(v: dict[str, Any]) -> bool:
        kinds = {k for k in v if k != "name"}   # none: an emptyDir (the API server's default)
        claim = v.get("persistentVolumeClaim") or {}
        return bool(kinds) and not POD_LOCAL_VOLUMES & kinds and not claim.get("readOnly")

    container = job_container(job)
    # a subPath mount shows the trainer another directory than the vLLM server sees at that path
    return [m["mountPath"] for m in container.get("volumeMounts") or []
            if m.get("name") in volumes and durable(volumes[m["name"]]) and m.get("mountPath")
            and not m.get("readOnly") and not m.get("subPath") and not m.get("subPathExpr")]


def memory_limit(job: dict[str, Any]) -> str:
    container = job_container(job)
    return str(((container.get("resources") or {}).get("limits") or {}).get("memory") or "none set")


