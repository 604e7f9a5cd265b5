"""The trainer service's domain object: validates training jobs, runs them through an executor,
keeps their per-iteration metrics, lists their checkpoints (no gRPC here). Two job kinds:
TRAINING_KIND_ADAPTER (GRPO LoRA for one capability) and TRAINING_KIND_GATES (the MoE gates over
frozen adapters: warm start + GRPO, gates/).

A job is cheap to reject and expensive to run, so everything checkable without loading a
model is checked in `create_job` before a job exists: the kind, the capability name, one
environment that is registered (and accepts its parameters and the training split), the
GRPO config (messages say how to fix), that a config asking for guided rollouts gets hints from
that environment (`check_guidance`), the data directory each environment names (under
TRACE_TRAINER_DATA_ROOTS, else PERMISSION_DENIED before the environment is made: trace_common/data_roots.py;
the worker gets it resolved), the policy's model and adapter references (this store or
TRACE_TRAINER_MODEL_ROOTS, else PERMISSION_DENIED: trace_common/model_refs.py; the trainer loads the base
weights itself, so an HTTP-served base agent trains only with vLLM rollouts and its served name must be such
a reference too: `_check_policy_backend`), the executor's settings, the vLLM
server and adapter directory of vLLM rollouts against the operator's settings (`outbound.py`) and
the resume URI. `validate_config` parses a config alone, for clients that check theirs before any
work starts (configs.py), and checks its vLLM rollouts as a job's when told the executor its jobs will
run under. Capabilities train in parallel as separate jobs (`max_concurrent_jobs`).
"""

from __future__ import annotations

import importlib
import math
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, get_args

from services.trainer.grpo import checkpoint as ckpt
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.guidance import check_guidance
from services.trainer.grpo.models import check_adapter_merge
from trace_common.artifacts import ArtifactStore, open_store
from trace_common.data_roots import own_data_hidden
from trace_common.endpoints import Endpoints, normalize_url, refuse_outbound_params
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from trace_common.jobs import JobContext, JobManager, JobRecord, Output, estimate_footprint
from trace_common.model_refs import ModelRoots, check_model_ref, check_policy_refs

from . import metrics as m
from .configs import validate_training_config
from .executors import LocalExecutor
from .gates.job import gates_prefix, validate_gates
from .job_template import job_container, load_job_template, shared_mounts
from .jobspec import (
    DATA_ROOTS_SETTING,
    WorkerSpec,
    confined_environment,
    env_factory,
    events_key_for,
    prefix_for,
)
from .metrics import M
from .outbound import check_vllm
from .settings import TrainerSettings, environment_token
from .specs import TrainingSpecModel

#: The executors a job may name (TrainingSpec.executor).
EXECUTORS: tuple[str, ...] = get_args(TrainingSpecModel.model_fields["executor"].annotation)
CAPABILITY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
RECENT_ITERATIONS = 20
MAX_KEPT_ITERATIONS = 100_000


@dataclass(frozen=True)
class IterationRecord:
    iteration: int
    values: dict[str, float]


class Training:
    def __init__(self, settings: TrainerSettings, store: ArtifactStore | None = None, kube_api_client=None):
        self.settings = settings
        self.jobs = JobManager.from_settings("trainer", M, settings)
        self.store = store or open_store(settings.artifact_root, settings.s3_settings(), M.artifact_observer)
        self.local = LocalExecutor(settings)
        self.endpoints = Endpoints(settings.endpoints, "TRACE_TRAINER_ENDPOINTS")
        #: Where a job's base model and adapter may lie: this store and TRACE_TRAINER_MODEL_ROOTS.
        self.model_roots = ModelRoots.of(settings, self.store.root_uri)
        #: Directories a job's environments may name data under (TRACE_TRAINER_DATA_ROOTS; the embedded
        #: stack adds the run's data directory in-process, tracectl/embedded.py).
        self.data_roots = list(settings.data_roots)
        self._kube_api_client = kube_api_client
        self._kube = None
        self.iterations: dict[str, deque[IterationRecord]] = {}
        self.prefixes: dict[str, str] = {}
        self.jobs.on_evict.append(self._forget)
        for module in settings.env_modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise FailedPrecondition(f"env_modules: cannot import {module!r} ({exc}); fix "
                                         "TRACE_TRAINER_ENV_MODULES") from exc

    # -- validation --------------------------------------------------------------------------------
    def confined(self, spec: TrainingSpecModel) -> TrainingSpecModel:
        """`spec` with every environment's data directory checked against the data roots and resolved
        (`confined_environment`; PERMISSION_DENIED naming spec.environments[i] otherwise)."""
        envs = [confined_environment(ref, self.data_roots, f"spec.environments[{i}]")
                for i, ref in enumerate(spec.environments)]
        return spec.model_copy(update={"environments": envs})

    def validate(self, spec: TrainingSpecModel) -> GRPOConfig:
        spec = self.confined(spec)   # before any environment is made: no data read from outside the roots
        if spec.kind == "TRAINING_KIND_GATES":
            config = validate_gates(spec, self.store, self.settings.environment_address,
                                    environment_token(self.settings), data_roots=self.data_roots,
                                    environment_tls_ca_file=self.settings.environment_tls_ca_file)
            check_policy_refs(spec.policy, self.model_roots)
            if spec.policy.backend == "POLICY_BACKEND_OPENAI_HTTP":
                self._check_served_weights(spec)   # its served name is the base the gates job loads
            self._check_executor(spec)
            self._check_resume_model(spec, spec.policy.model)
            return config
        if not CAPABILITY_RE.match(spec.capability):
            raise InvalidArgument(field="spec.capability", expected="a snake_case capability name "
                                  "(lower-case letters, digits, '_', starting with a letter)", got=spec.capability,
                                  fix="use the name the analysis retained, e.g. 'precondition_verification'")
        if len(spec.environments) != 1:
            raise InvalidArgument(field="spec.environments", expected="exactly one environment for "
                                  "TRAINING_KIND_ADAPTER (the capability's environment)", got=len(spec.environments))
        config = validate_training_config(spec.kind, spec.config, "spec.config")
        check_adapter_merge(config.dtype, spec.policy.adapter_uri)   # the worker's rule, before a job is queued
        if spec.policy.adapter_uri and config.rollout_backend == "vllm":
            raise InvalidArgument(field="spec.policy.adapter_uri", expected="empty with config.rollout_backend 'vllm'",
                                  got=spec.policy.adapter_uri,
                                  fix="the job would train on the base with this adapter merged while the vLLM server "
                                      "samples from the base and the new LoRA only (another policy): train from the "
                                      "plain base, or roll out in-process (rollout_backend in_process)")
        ref = spec.environments[0]
        # built in: made here; otherwise served by the environment service (NotFound / InvalidArgument with the reason)
        refuse_outbound_params(ref.params, "spec.environments[0].params")  # no URL or key chosen by a request
        with own_data_hidden(ref.name, ref.version, ref.params, setting=DATA_ROOTS_SETTING):  # no default path shown
            env = env_factory(ref.model_dump(), self.settings.environment_address, environment_token(self.settings),
                              self.settings.environment_tls_ca_file)()
        if config.train_split not in env.splits():
            raise InvalidArgument(field="spec.config.train_split", expected=f"one of {sorted(env.splits())}",
                                  got=config.train_split, fix=f"environment {ref.name!r} defines these splits")
        # asked for guided rollouts: the environment must supply hints (refused now, not once the model loaded)
        check_guidance(config, env)
        served = self._check_policy_backend(spec, config)
        check_policy_refs(spec.policy, self.model_roots)
        if served:
            self._check_served_weights(spec)
        mounts = self._check_executor(spec)
        # the vLLM server and the adapter directory are the operator's (outbound.py), never the request's
        config = check_vllm(config, self.endpoints, self.settings.vllm_adapter_root, executor=spec.executor,
                            job_mounts=mounts)
        if served:
            self._check_served_endpoint(spec, config)
        self._check_resume_model(spec, ckpt.model_label(spec.policy.model, spec.policy.adapter_uri))
        return config

    def _check_resume_model(self, spec: TrainingSpecModel, label: str) -> None:
        """A checkpoint named in spec.resume_from_uri exists and was trained on the model this job loads
        (its label: the worker's rule, `GRPOTrainer.resume`), refused now rather than once the worker
        loaded the model: NotFound without a checkpoint.json there, FailedPrecondition for another model."""
        key = self.resume_key(spec.resume_from_uri)
        if not key:
            return
        record = ckpt.read_record(self.store, key)
        if record.model is not None and record.model != label:
            raise FailedPrecondition(
                f"spec.resume_from_uri: checkpoint {spec.resume_from_uri} was trained on model {record.model!r}, and "
                f"this job trains model {label!r}: training continues only on the model it was trained on. Resume "
                f"from a checkpoint trained on {label!r}, or start fresh (leave spec.resume_from_uri empty)")

    # -- an adapter job's base agent ---------------------------------------------------------------
    # The trainer always loads the base weights itself (the LoRA trains on them): `spec.policy.model`
    # goes to the worker as the model to load, whatever the backend (worker.py: load_base). A base
    # agent served over HTTP (POLICY_BACKEND_OPENAI_HTTP, e.g. by the chart's vLLM) is accepted only
    # when the job's rollouts come from a vLLM server (config.rollout_backend='vllm'): then its served
    # name must also be a reference the trainer may load (the model roots), and the server the
    # rollouts use is the trainer's own profile, config.vllm.profile; `spec.policy.endpoint` is never
    # called (a request does not pick a URL), only required to name that same server when it is set.
    # `spec.policy.endpoint_profile` names a profile of the services that call the base agent, not
    # one of the trainer's, and is not looked at.

    @staticmethod
    def _check_policy_backend(spec: TrainingSpecModel, config: GRPOConfig) -> bool:
        """Whether the adapter job's base agent is served over HTTP (see above); InvalidArgument naming
        spec.policy.backend for a backend the trainer cannot train on."""
        backend = spec.policy.backend
        if backend == "POLICY_BACKEND_IN_PROCESS":
            return False
        if backend == "POLICY_BACKEND_OPENAI_HTTP":
            if config.rollout_backend == "vllm":
                return True
            raise InvalidArgument(
                field="spec.policy.backend", got=backend,
                expected="POLICY_BACKEND_IN_PROCESS, or POLICY_BACKEND_OPENAI_HTTP with rollouts from the vLLM "
                         "server (the trainer loads the base weights itself and cannot sample from an HTTP base "
                         f"agent in-process; config.rollout_backend is {config.rollout_backend!r})",
                fix="an HTTP-served base agent trains only with rollouts from the vLLM server: set "
                    "config.rollout_backend='vllm' and config.vllm={'profile': ..., 'adapter_dir': ...} (one of "
                    "the trainer's endpoint profiles, TRACE_TRAINER_ENDPOINTS), or use POLICY_BACKEND_IN_PROCESS")
        raise InvalidArgument(
            field="spec.policy.backend", got=backend,
            expected="POLICY_BACKEND_IN_PROCESS (the trainer loads the base model itself), or "
                     "POLICY_BACKEND_OPENAI_HTTP with config.rollout_backend='vllm'",
            fix="a scripted policy has no weights to train: name the base model (POLICY_BACKEND_IN_PROCESS)")

    def _check_served_weights(self, spec: TrainingSpecModel) -> None:
        """The served name of an HTTP base agent as the model the trainer loads: the same confinement
        as an in-process model's (`check_model_ref`, this store and TRACE_TRAINER_MODEL_ROOTS);
        PermissionDenied / NotFound naming spec.policy.model, saying why the trainer reads it."""
        field, ref = "spec.policy.model", spec.policy.model
        why = ("the trainer loads the weights of an HTTP-served base agent itself to train on them (an adapter "
               "job's rollouts come from the vLLM server, a gate job's from those weights in-process)")
        try:
            check_model_ref(ref, field, allowed=self.model_roots)
        except PermissionDenied as exc:
            shown = ref if len(ref) <= 200 else ref[:200] + "..."
            raise PermissionDenied(
                f"{shown!r} is the served model name, and {why}, so it must also be a model location the trainer "
                f"may read; allowed: {self.model_roots.allowed()}", field=field,
                fix="Serve the model under the name of its directory or s3:// URI inside the store or "
                    f"{self.model_roots.setting} (the operator lists where the weights lie; a Hugging Face id is "
                    "not fetched from the Hub), or train with POLICY_BACKEND_IN_PROCESS") from exc
        except NotFound as exc:
            raise NotFound(f"{exc.reason}; {why}") from exc

    @staticmethod
    def _check_served_endpoint(spec: TrainingSpecModel, config: GRPOConfig) -> None:
        """InvalidArgument naming spec.policy.endpoint when it is set and is not the base_url of the
        trainer's vLLM profile (`config` as check_vllm resolved it): the served base agent and the
        server the adapters train against must be one server."""
        endpoint = spec.policy.endpoint
        assert config.vllm is not None   # rollout_backend='vllm' (GRPOConfig requires the block)
        if endpoint and normalize_url(endpoint) != normalize_url(config.vllm.base_url):
            raise InvalidArgument(
                field="spec.policy.endpoint", got=endpoint,
                expected=f"the server the adapters' rollouts use, {config.vllm.base_url} (the base_url of the "
                         f"trainer's profile {config.vllm.profile!r}, config.vllm)",
                fix="the served base agent and the vLLM server the adapters train against must be the same "
                    "server: leave spec.policy.endpoint empty (the trainer never calls it) or name that server "
                    "in config.vllm.profile")

    def validate_config(self, kind: str, values: dict[str, Any] | None, field_path: str = "",
                        executor: str | None = None) -> GRPOConfig:
        """A job kind's config parsed without creating a job (ValidateTrainingConfig; configs.py). With
        `executor` (EXECUTOR_LOCAL / EXECUTOR_KUBERNETES) the vLLM server and adapter directory of its vLLM
        rollouts are checked against the operator's settings as a job's under that executor are; None: the
        fields only (the caller asks a trainer whose settings are not those of the one that will run the jobs)."""
        if executor not in (None, *EXECUTORS):
            raise InvalidArgument(field="executor", expected=" or ".join(EXECUTORS), got=executor,
                                  fix="name the executor the config's jobs will run under, or leave it unset to "
                                      "check the fields only")
        config = validate_training_config(kind, values, field_path)
        if executor is None or config.rollout_backend != "vllm":
            return config
        field = f"{field_path}.vllm" if field_path else "config.vllm"
        # the Job template's mounts decide a Kubernetes job's adapter root (and without an image or a
        # readable template no Job starts at all)
        return check_vllm(config, self.endpoints, self.settings.vllm_adapter_root, field=field, executor=executor,
                          job_mounts=self._check_executor(executor))

    def _check_executor(self, spec: TrainingSpecModel | str) -> tuple[str, ...]:
        """Refuse a Kubernetes job (a spec, or just its executor's name) the executor could not start;
        return where its Job mounts durable volumes (job_template.shared_mounts; () for the local
        executor or the built-in Job)."""
        executor = spec if isinstance(spec, str) else spec.executor
        if executor != "EXECUTOR_KUBERNETES":
            return ()
        template = load_job_template(self.settings.job_template)   # FailedPrecondition when unreadable
        if not self.settings.job_image and not (template and job_container(template).get("image")):
            raise FailedPrecondition("EXECUTOR_KUBERNETES needs the trainer image: set TRACE_TRAINER_JOB_IMAGE")
        return tuple(shared_mounts(template)) if template else ()

    def resume_key(self, uri: str) -> str:
        """The key of the checkpoint.json `uri` names (a ListCheckpoints URI, or its checkpoint's
        directory) in this trainer's store; InvalidArgument naming spec.resume_from_uri elsewhere."""
        if not uri:
            return ""
        try:
            key = self.store.key_of(uri.rstrip("/"))
        except InvalidArgument:
            raise InvalidArgument(field="spec.resume_from_uri", expected=f"a checkpoint in this trainer's artifact "
                                  f"store ({self.store.root_uri})", got=uri,
                                  fix="copy the checkpoint into the store or use a ListCheckpoints URI") from None
        return ckpt.manifest_key_of(key)

    # -- jobs -----------------------------------------------------------------------------------------
    def create_job(self, spec: TrainingSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str, config: GRPOConfig | None = None) -> JobRecord:
        """`config`: the result of `validate(spec)` when the caller already ran it (off the event
        loop: validating an environment served by the environment service is a blocking RPC)."""
        self.jobs.validate_request(run_id, labels, request_id)
        config = config if config is not None else self.validate(spec)
        spec = self.confined(spec)   # the worker (a child process or a Job pod) gets the resolved data directories
        resume = self.resume_key(spec.resume_from_uri)
        gates = spec.kind == "TRAINING_KIND_GATES"
        prefix = gates_prefix(run_id, spec.capability) if gates else prefix_for(run_id, spec.capability)
        if self.jobs.by_request(request_id, run_id=run_id) is None:   # (a retried request gets its job back from submit)
            self._refuse_second_writer(prefix)
        s3 = self.settings
        kube = spec.executor == "EXECUTOR_KUBERNETES"

        async def body(ctx: JobContext) -> dict[str, Any]:
            wspec = WorkerSpec(job_id=ctx.job_id, run_id=run_id, kind=spec.kind, capability=spec.capability,
                               environment=spec.environments[0].model_dump(),
                               environments=[e.model_dump() for e in spec.environments] if gates else [],
                               adapter_uris=dict(spec.adapter_uris) if gates else {}, policy=spec.policy.model_dump(),
                               config=config.model_dump(mode="json"), artifact_root=self.store.root_uri,
                               model_roots=list(self.model_roots.roots),
                               s3_endpoint=s3.s3_endpoint, s3_access_key=s3.s3_access_key, s3_region=s3.s3_region,
                               s3_secure=s3.s3_secure, prefix=prefix, resume_from=resume,
                               events_key=events_key_for(prefix, ctx.job_id) if kube else "",
                               torch_threads=self.settings.torch_threads,
                               env_modules=list(self.settings.env_modules),
                               environment_target=self.settings.environment_address,
                               wandb_mode=self.settings.wandb_mode)
            ctx.progress(completed=0, total=config.max_steps, stage="starting")
            executor = self.kube_executor() if kube else self.local
            result = await executor.run(wspec, lambda ev: self._on_event(ctx, spec.capability, ev))
            for out in result.get("outputs", []):
                ctx.add_output(Output(uri=out["uri"], sha256=out["sha256"], size_bytes=int(out["size"]),
                                      kind=out["kind"]))
            ctx.progress(stage="done", message=str(result.get("stop_reason", "")))
            return result

        rec = self.jobs.submit("training", body, run_id=run_id, labels=labels, request_id=request_id,
                               footprint=estimate_footprint(spec, config))
        self.prefixes.setdefault(rec.job_id, prefix)
        self.iterations.setdefault(rec.job_id, deque(maxlen=MAX_KEPT_ITERATIONS))
        return rec

    def _forget(self, job_id: str) -> None:
        """An evicted job's iterations and checkpoint prefix go with it (JobManager.on_evict)."""
        self.iterations.pop(job_id, None)
        self.prefixes.pop(job_id, None)

    def _refuse_second_writer(self, prefix: str) -> None:
        """One live job per checkpoint prefix: two workers training the same run's capability would
        interleave their checkpoints, and each resumes from whatever the other wrote last."""
        for job_id, other in list(self.prefixes.items()):
            if other == prefix and self.jobs.is_live(job_id):
                raise FailedPrecondition(f"training job {job_id} is already training {prefix}; a second job would "
                                         "write the same checkpoints. Wait for it (WatchJob) or cancel it "
                                         "(CancelJob) -- a new job then resumes from its last checkpoint -- or use "
                                         "another run_id or capability")

    def kube_executor(self):
        if self._kube is None:
            from .kubernetes_job import KubernetesExecutor, default_api_client

            self._kube = KubernetesExecutor(self.settings, self.store, self._kube_api_client or default_api_client)
        return self._kube

    def _on_event(self, ctx: JobContext, capability: str, event: dict[str, Any]) -> None:
        """One worker event -> the job's progress, metrics and the Prometheus series. An iteration
        event with `"replayed": true` re-sends an iteration a resumed job had already finished (its
        totals): it updates the job and the gauges, but the counters (iterations, tokens) and the
        step-duration histogram count each iteration once, when it ran."""
        kind = event.get("event")
        if kind == "iteration":
            it = int(event["iteration"])
            values = {k: float(v) for k, v in event.get("values", {}).items() if isinstance(v, int | float)}
            self.iterations.setdefault(ctx.job_id, deque(maxlen=MAX_KEPT_ITERATIONS)).append(
                IterationRecord(it, values))
            # Job.metrics is the last iteration's values: a value that iteration did not measure (no update
            # -> no loss) is NaN rather than left over from an earlier iteration.
            stale = {k: math.nan for k in ctx.record.metrics if k not in values}
            ctx.set_metrics({**stale, **values})
            ctx.progress(completed=it, stage="training",
                         message=f"reward {values.get('reward_mean', 0):.3f}, informative groups "
                                 f"{values.get('informative_group_fraction', 0):.2f}")
            for gauge, key in ((m.REWARD_MEAN, "reward_mean"), (m.PASS_RATE, "pass_rate"),
                               (m.INFORMATIVE_GROUP_FRACTION, "informative_group_fraction"), (m.LOSS, "loss"),
                               (m.KL, "kl")):
                if key in values:
                    gauge.labels(capability).set(values[key])
            if event.get("replayed"):  # counted when it first ran: counters and histograms skip it
                return
            m.ITERATIONS.labels(capability).inc()
            if "step_seconds" in values:
                m.STEP_DURATION.labels(capability).observe(values["step_seconds"])
            if values.get("trained_tokens"):
                m.TOKENS.labels(capability).inc(values["trained_tokens"])
        elif kind == "warm_start":
            loss = event.get("loss")
            shown = f"{loss:.4f}" if isinstance(loss, (int, float)) else "n/a"
            ctx.progress(stage="gate warm start", message=f"step {event.get('step')}, loss {shown}")
        elif kind == "phase":  # iteration i running: i - 1 done (also right after a resume from a checkpoint)
            it = int(event.get("iteration") or 1)
            ctx.progress(completed=max(0, it - 1), stage=f"iteration {it}: {event.get('phase', '')}"[:200])
        elif kind == "checkpoint":
            ctx.progress(stage=f"checkpoint {event.get('iteration')}")
        elif kind == "stopped":
            ctx.progress(message=str(event.get("reason", ""))[:500])

    def recent_iterations(self, job_id: str, limit: int = RECENT_ITERATIONS) -> list[IterationRecord]:
        self.jobs.get(job_id)
        return list(self.iterations.get(job_id, ()))[-limit:]

    def iteration_history(self, job_id: str) -> list[IterationRecord]:
        return list(self.iterations.get(job_id, ()))

    async def watch(self, job_id: str) -> AsyncIterator[tuple[JobRecord, IterationRecord | None]]:
        """One (job, iteration) per job change; the iteration is set when that change completes one.

        A late watcher first gets the iterations it missed (oldest first, each with the job as it is
        now), then live updates, so every completed iteration reaches every watcher exactly once.
        Iteration 0 exists for gate jobs only (the warm start's summary)."""
        sent = -1
        first = True
        async for rec in self.jobs.watch(job_id):
            if first:
                first = False
                for it in self.iteration_history(job_id):
                    if it.iteration < rec.completed:
                        yield rec, it
                        sent = it.iteration
            done: IterationRecord | None = None
            if rec.completed > sent:
                hist = [it for it in self.iteration_history(job_id) if it.iteration == rec.completed]
                if hist:
                    done, sent = hist[-1], rec.completed
            yield rec, done

    def list_checkpoints(self, job_id: str) -> list[ckpt.CheckpointInfo]:
        self.jobs.get(job_id)
        prefix = self.prefixes.get(job_id)
        if prefix is None:
            return []
        return ckpt.list_checkpoints(self.store, prefix)

    async def shutdown(self) -> None:
        await self.jobs.shutdown()
        self.local.close()
