"""Training jobs as Kubernetes Jobs on the GPU node pool, through the official `kubernetes` client.

One Job per training job: one pod running
    torchrun --standalone --nproc_per_node=<gpus> -m services.trainer.worker
with the job spec in `TRACE_TRAINER_JOB_SPEC`, `nvidia.com/gpu: <gpus>` in its limits, the
pool's nodeSelector and tolerations, a memory-backed /dev/shm for NCCL, the restricted pod
security profile, the artifact-store settings as environment (the S3 secret key by
reference to a Secret, never inline) and `backoffLimit` retries -- each retry resumes from
the last checkpoint in the store, since the worker resumes the latest checkpoint under
its prefix.

Where the Job comes from (`build_job`):
    TRACE_TRAINER_JOB_TEMPLATE set (the chart's training-job.json): that batch/v1 Job manifest is
        the operator's -- command, image, resources, GPU pool, volumes, security context as it
        says; the trainer sets metadata.name/namespace, adds its labels and annotations (pod
        template too) and sets the job's own environment (below; a template entry of the same
        name is replaced), and nothing else -- but a gate job (TRAINING_KIND_GATES), whose training
        runs in one process (worker.py), gets one torchrun process and at most one GPU
        (`single_process`), whatever the template gives the adapters' data-parallel jobs
    unset: the built-in Job from the job_* settings (the same shape; a gate job: at most one GPU)
    job environment: TRACE_TRAINER_JOB_SPEC, TRACE_TRAINER_CHECKPOINT_URI, HF_HUB_OFFLINE, the
        cache locations, the S3 secret key and the environment service's token by Secret
        reference (job_s3_secret_name, job_auth_from), the environment service's TLS CA path
        (environment_tls_ca_file: a template must mount it; the built-in Job refuses it), job_extra_env
The template's reading and what it mounts: job_template.py.

The pod's progress comes back through the artifact store: the worker keeps its event log at
`events_key`, which this executor polls together with the Job's status.

Semantics (run):
    create Job; every poll_seconds: forward new events (iterations, checkpoints)
    Job condition Complete -> the worker's `result` event
    Job condition Failed (retries used up) -> the worker's last `error` event, else the Job's reason
                                              and how its pods' containers ended (OOMKilled -> what to lower)
    cancelled -> delete the Job (pods too, background propagation), re-raise
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client

from trace_common import errors as E
from trace_common.artifacts import ArtifactStore

from .executors import EventFn, error_from_event
from .job_template import job_container, load_job_template, memory_limit
from .jobspec import ENVIRONMENT_TLS_CA_ENV, ENVIRONMENT_TOKEN_ENV, SPEC_ENV, WorkerSpec
from .settings import TrainerSettings

log = logging.getLogger(__name__)

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LABEL_APP = "app.kubernetes.io/name"
LABEL_JOB = "trace.dev/training-job"
LABEL_CAP = "trace.dev/capability"
GPU = "nvidia.com/gpu"
#: The job kind whose training runs in one process (gates/job.py; worker.py refuses torchrun ranks).
GATES = "TRAINING_KIND_GATES"
#: torchrun's process-count flag, either spelling, with its value after '=' or as the next argument.
NPROC = re.compile(r"^--nproc[-_]per[-_]node(=|$)")
#: Reads of a Job's state that may fail in a row (an API server restarting, a rate limit) before the run
#: gives up; it then deletes the Job, which would otherwise hold its GPUs until its activeDeadlineSeconds.
STATE_READ_TRIES = 5


def job_name(job_id: str) -> str:
    """A DNS-1123 label for the Job (<= 63 chars), stable per job id."""
    slug = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")[:40].strip("-")
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    return f"trace-train-{slug}-{digest}" if slug else f"trace-train-{digest}"


def _label_value(v: str) -> str:
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", v)[:63].strip("-_.")
    return v or "none"


def job_env(spec: WorkerSpec, settings: TrainerSettings) -> list[dict[str, Any]]:
    """The job's own environment (module docstring), as the API receives it."""
    env: list[dict[str, Any]] = [
        {"name": SPEC_ENV, "value": spec.model_dump_json()},
        {"name": "TRACE_TRAINER_CHECKPOINT_URI", "value": _checkpoint_uri(spec)},
        {"name": "TRACE_TRAINER_LOG_LEVEL", "value": settings.log_level},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        # the root filesystem is read-only: every cache goes to the scratch volume
        {"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/hf"},
        {"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"}, {"name": "TRACE_AGENT_CACHE", "value": "/tmp/agents"}]
    if settings.job_s3_secret_name:
        env.append({"name": "TRACE_TRAINER_S3_SECRET_KEY", "valueFrom": {"secretKeyRef": {
            "name": settings.job_s3_secret_name, "key": settings.job_s3_secret_key}}})
    if settings.job_auth_from:  # the environment service's token, for environments it serves
        secret, key = settings.job_auth_from.split(":", 1)
        env.append({"name": ENVIRONMENT_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    if settings.environment_tls_ca_file is not None:   # the template mounts it (the chart's: tls.existingSecret)
        env.append({"name": ENVIRONMENT_TLS_CA_ENV, "value": str(settings.environment_tls_ca_file)})
    env += [{"name": k, "value": v} for k, v in sorted(settings.job_extra_env.items())]
    return env


def _labels(spec: WorkerSpec) -> dict[str, str]:
    return {LABEL_APP: "trace-trainer-job", LABEL_JOB: _label_value(spec.job_id),
            LABEL_CAP: _label_value(spec.capability)}


def _with_labels(template: dict[str, str] | None, spec: WorkerSpec) -> dict[str, str]:
    """The template's labels plus the job's; the template keeps its own app name (the chart's
    selectors use it), the job and capability labels are always the trainer's."""
    ours = _labels(spec)
    return {**ours, **(template or {}), LABEL_JOB: ours[LABEL_JOB], LABEL_CAP: ours[LABEL_CAP]}


def _annotations(spec: WorkerSpec) -> dict[str, str]:
    return {"trace.dev/run-id": spec.run_id, "trace.dev/checkpoint-uri": _checkpoint_uri(spec)}


def _checkpoint_uri(spec: WorkerSpec) -> str:
    return f"{spec.artifact_root.rstrip('/')}/{spec.prefix}"


def build_job(spec: WorkerSpec, settings: TrainerSettings, *, namespace: str,
              template: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Job manifest (a dict, as the API receives it) for one training job (module docstring):
    from `template` or the settings' TRACE_TRAINER_JOB_TEMPLATE when there is one, else built in."""
    template = template if template is not None else load_job_template(settings.job_template)
    if template is None:
        return manifest_dict(_built_in_job(spec, settings, namespace=namespace))
    job = copy.deepcopy(template)
    meta = job.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta.update(name=job_name(spec.job_id), namespace=namespace)
    meta["labels"] = _with_labels(meta.get("labels"), spec)
    meta["annotations"] = {**(meta.get("annotations") or {}), **_annotations(spec)}
    pod_template = job["spec"]["template"]
    pod_meta = pod_template.setdefault("metadata", {})
    pod_meta["labels"] = _with_labels(pod_meta.get("labels"), spec)
    container = job_container(job)
    if not container.get("image"):
        if not settings.job_image:
            raise E.FailedPrecondition("the training Job template's container has no image and "
                                       "TRACE_TRAINER_JOB_IMAGE is unset: set one of them")
        container["image"] = settings.job_image
    ours = job_env(spec, settings)
    names = {e["name"] for e in ours}
    container["env"] = [e for e in container.get("env") or [] if e.get("name") not in names] + ours
    if spec.kind == GATES:
        single_process(container)
    return job


def single_process(container: dict[str, Any]) -> None:
    """A gate job's container, in place: torchrun's process count (`--nproc-per-node=N`,
    `--nproc_per_node N`, ...) becomes 1 and its nvidia.com/gpu requests and limits at most 1."""
    for key in ("command", "args"):
        argv = container.get(key)
        for i, arg in enumerate(argv or []):
            flag = NPROC.match(str(arg))
            if flag and flag.group(1):
                argv[i] = f"{flag.group(0).removesuffix('=')}=1"
            elif flag and i + 1 < len(argv):
                argv[i + 1] = "1"
    for section in ((container.get("resources") or {}).get(k) for k in ("limits", "requests")):
        if section and GPU in section and int(section[GPU]) > 1:
            section[GPU] = type(section[GPU])(1)


def _built_in_job(spec: WorkerSpec, settings: TrainerSettings, *, namespace: str) -> client.V1Job:
    """The Job from the job_* settings, when no template is configured (module docstring)."""
    if not settings.job_image:
        raise E.FailedPrecondition("EXECUTOR_KUBERNETES needs the trainer image: set TRACE_TRAINER_JOB_IMAGE "
                                   "(e.g. registry/trace-trainer:1.0.0)")
    if settings.environment_tls_ca_file is not None:
        raise E.FailedPrecondition("TRACE_TRAINER_ENVIRONMENT_TLS_CA_FILE is set, and the built-in Job mounts no "
                                   "TLS Secret for its workers to read it from: give a Job template that mounts it "
                                   "(TRACE_TRAINER_JOB_TEMPLATE; the chart's mounts tls.existingSecret)")
    gpus = min(settings.job_gpus, 1) if spec.kind == GATES else settings.job_gpus
    name = job_name(spec.job_id)
    labels = _labels(spec)
    env = job_env(spec, settings)
    limits = {"memory": settings.job_memory}
    requests = {"cpu": settings.job_cpu, "memory": settings.job_memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
        requests["nvidia.com/gpu"] = str(gpus)
    container = client.V1Container(
        name="trainer", image=settings.job_image, image_pull_policy=settings.job_image_pull_policy,
        command=["torchrun", "--standalone", f"--nproc_per_node={max(1, gpus)}", "-m", "services.trainer.worker"],
        env=env, resources=client.V1ResourceRequirements(limits=limits, requests=requests),
        volume_mounts=[client.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
                       client.V1VolumeMount(name="scratch", mount_path="/tmp")],
        security_context=client.V1SecurityContext(
            allow_privilege_escalation=False, read_only_root_filesystem=True, run_as_non_root=True,
            capabilities=client.V1Capabilities(drop=["ALL"]),
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")))
    pod = client.V1PodSpec(
        restart_policy="Never", containers=[container],
        node_selector=dict(settings.job_node_selector) or None,
        tolerations=[client.V1Toleration(**{_snake(k): v for k, v in t.items()}) for t in settings.job_tolerations]
        or None,
        service_account_name=settings.job_service_account or None,
        automount_service_account_token=False,
        security_context=client.V1PodSecurityContext(run_as_non_root=True, run_as_user=10001, run_as_group=10001,
                                                     fs_group=10001,
                                                     seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")),
        volumes=[client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(
                     medium="Memory", size_limit=settings.job_shm_size)),
                 client.V1Volume(name="scratch", empty_dir=client.V1EmptyDirVolumeSource())])
    job_spec = client.V1JobSpec(
        backoff_limit=settings.job_backoff_limit,
        ttl_seconds_after_finished=settings.job_ttl_seconds_after_finished,
        active_deadline_seconds=settings.job_active_deadline_seconds or None,
        template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod))
    return client.V1Job(api_version="batch/v1", kind="Job",
                        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels,
                                                     annotations=_annotations(spec)),
                        spec=job_spec)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def manifest_dict(job: client.V1Job) -> dict[str, Any]:
    """The Job as the JSON the API server receives (camelCase, no nulls)."""
    return client.ApiClient().sanitize_for_serialization(job)


def default_namespace(settings: TrainerSettings) -> str:
    if settings.kubernetes_namespace:
        return settings.kubernetes_namespace
    if SA_NAMESPACE.is_file():
        return SA_NAMESPACE.read_text().strip()
    return "default"


def default_api_client() -> client.ApiClient:
    from kubernetes import config as kconfig

    try:
        kconfig.load_incluster_config()
    except kconfig.ConfigException:
        kconfig.load_kube_config()
    return client.ApiClient()


class KubernetesExecutor:
    """Runs workers as Jobs (module docstring). `api_client` builds the `ApiClient` (in-cluster
    config by default; tests point it at an emulated API server)."""

    def __init__(self, settings: TrainerSettings, store: ArtifactStore,
                 api_client: Callable[[], client.ApiClient] = default_api_client):
        self.settings = settings
        self.store = store
        self._api_factory = api_client
        self._api: client.BatchV1Api | None = None
        self._core: client.CoreV1Api | None = None

    @property
    def batch(self) -> client.BatchV1Api:
        if self._api is None:
            self._api = client.BatchV1Api(self._api_factory())
        return self._api

    @property
    def core(self) -> client.CoreV1Api:
        if self._core is None:
            self._core = client.CoreV1Api(self.batch.api_client)
        return self._core

    async def run(self, spec: WorkerSpec, on_event: EventFn) -> dict[str, Any]:
        ns = default_namespace(self.settings)
        job = build_job(spec, self.settings, namespace=ns)
        name = job["metadata"]["name"]
        created = asyncio.ensure_future(asyncio.to_thread(self.batch.create_namespaced_job, ns, job))
        try:
            await asyncio.shield(created)
        except client.ApiException as exc:
            raise E.Unavailable(f"could not create Kubernetes Job {name} in namespace {ns}: {exc.status} "
                                f"{exc.reason}") from exc
        except asyncio.CancelledError:
            # cancelled while the create was on its way: it may still make the Job, which nothing would
            # then delete (its GPUs held to its deadline), so wait for it and delete what it made
            await asyncio.shield(self._delete_after(created, name, ns))
            raise
        seen: set[str] = set()

        def drain(events: list[dict[str, Any]]) -> dict[str, Any] | None:
            """Forward events not seen yet; return the last terminal (result/error) event."""
            final = None
            for ev in events:
                if ev["event"] in ("result", "error"):
                    final = ev
                    continue
                key = json.dumps(ev, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    on_event(ev)
            return final

        failed_reads = 0
        try:
            while True:
                await asyncio.sleep(self.settings.job_poll_seconds)
                drain(await asyncio.to_thread(self._events, spec.events_key))
                try:
                    state, reason = await asyncio.to_thread(self._state, name, ns)
                except E.Unavailable as exc:
                    failed_reads += 1
                    if failed_reads >= STATE_READ_TRIES:   # TRACE stops following it: nothing else would end it
                        await asyncio.shield(asyncio.to_thread(self._delete, name, ns))
                        raise E.Unavailable(f"{exc.reason} ({failed_reads} reads in a row failed; the Job is "
                                            "deleted)") from exc
                    log.warning("%s; asking again (%d of %d)", exc.reason, failed_reads, STATE_READ_TRIES)
                    continue
                failed_reads = 0
                if state == "running":
                    continue
                # The worker writes its events before it exits, so after a terminal Job state one more
                # read sees everything (no event may slip between the read above and the state read).
                final = drain(await asyncio.to_thread(self._events, spec.events_key))
                if state == "complete":
                    if final is None or final["event"] != "result":
                        raise E.TraceError(f"Kubernetes Job {name} completed but its worker reported no result")
                    return final
                if final is not None and final["event"] == "error":
                    raise error_from_event(final)
                ends = await asyncio.to_thread(self._container_ends, spec.job_id, ns)
                raise E.TraceError(f"Kubernetes Job {name} failed: {reason}{_ends_text(ends, memory_limit(job), self.settings)}")
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.to_thread(self._delete, name, ns))
            raise

    def _events(self, key: str) -> list[dict[str, Any]]:
        if not key:
            return []
        try:
            data = self.store.get_bytes(key)
        except E.NotFound:
            return []
        except E.TraceError as exc:
            log.warning("cannot read training events %s: %s", key, exc)
            return []
        out = []
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(ev, dict) and "event" in ev:
                out.append(ev)
        return out

    def _state(self, name: str, ns: str) -> tuple[str, str]:
        try:
            # the Job itself carries its status: a get of jobs, which the chart's Role grants (jobs/status,
            # read_namespaced_job_status's subresource, is checked apart and is not granted)
            job = self.batch.read_namespaced_job(name, ns)
        except client.ApiException as exc:
            if exc.status == 404:
                return "failed", "the Job was deleted outside TRACE"
            raise E.Unavailable(f"cannot read Kubernetes Job {name}: {exc.status} {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:   # no answer at all: refused, reset, timed out
            raise E.Unavailable(f"cannot read Kubernetes Job {name}: {type(exc).__name__}: {exc}") from exc
        status = job.status
        for cond in (status.conditions if status is not None and status.conditions else []):
            if cond.status == "True" and cond.type == "Complete":
                return "complete", cond.reason or ""
            if cond.status == "True" and cond.type == "Failed":
                return "failed", f"{cond.reason or ''} {cond.message or ''}".strip()
        if status is not None and status.succeeded:
            return "complete", ""
        return "running", ""

    def _container_ends(self, job_id: str, ns: str) -> list[str]:
        """How the trainer containers of the Job's pods ended ("OOMKilled (exit 137)", ...), oldest
        pod first. A worker killed from outside writes no `error` event, so this is the only place
        that says why; unreadable pods give [] (the Job's own reason is still reported)."""
        label = _label_value(job_id)
        try:
            pods = self.core.list_namespaced_pod(ns, label_selector=f"{LABEL_JOB}={label}")
        except client.ApiException as exc:
            log.warning("cannot list the pods of training job %s: %s %s", job_id, exc.status, exc.reason)
            return []
        # the label check again here: an API server (or emulator) that ignores the selector must not
        # blame another job's pods
        mine = [p for p in pods.items if (p.metadata.labels or {}).get(LABEL_JOB) == label]
        ends = []
        for pod in sorted(mine, key=lambda p: str(p.metadata.creation_timestamp or "")):
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                term = (cs.state.terminated if cs.state else None) or (
                    cs.last_state.terminated if cs.last_state else None)
                if term is not None and term.reason:
                    ends.append(f"{term.reason} (exit {term.exit_code})")
        return ends

    async def _delete_after(self, created: asyncio.Future, name: str, ns: str) -> None:
        """Delete Job `name` once its create call (`created`) has ended, whatever its outcome."""
        try:
            await created
        except Exception:  # noqa: BLE001 (a failed create made nothing; the delete is then a 404)
            pass
        await asyncio.to_thread(self._delete, name, ns)

    def _delete(self, name: str, ns: str) -> None:
        try:
            self.batch.delete_namespaced_job(name, ns, propagation_policy="Background")
        except client.ApiException as exc:
            if exc.status != 404:
                log.warning("could not delete Kubernetes Job %s: %s %s", name, exc.status, exc.reason)


def _ends_text(ends: list[str], memory: str, settings: TrainerSettings) -> str:
    """The pods' container ends for a failed Job's error, with what to change when one was OOMKilled."""
    if not ends:
        return ""
    text = f"; its pods' trainer containers ended: {', '.join(ends)}"
    if any(e.startswith("OOMKilled") for e in ends):
        where = ("the Job template's memory limit (the chart: trainer.jobs.resources)" if settings.job_template
                 else "TRACE_TRAINER_JOB_MEMORY")
        text += (f". OOMKilled: the worker went over the pod's memory limit ({memory}). Raise "
                 f"{where}, or lower the worker's peak memory: raise the config's "
                 "gradient_accumulation_steps (smaller micro-batches, same update) or set gradient_checkpointing: "
                 "true; a re-run continues from the job's last checkpoint")
    return text

