"""The rollout service's domain object: job table, job creation, environment listing (no gRPC).

`endpoints` holds the operator's endpoint profiles (TRACE_ROLLOUT_ENDPOINTS): an OPENAI_HTTP
policy and a user simulator name one of them (runner.plan checks, before a job exists). `data_roots`
holds the directories a request may name data under (TRACE_ROLLOUT_DATA_ROOTS, trace_common/data_roots.py;
runner.plan checks them too).

A job writes its trajectories under `runs/<run_id or adhoc>/rollouts/<job_id>` of this service's
store. A request's `output_uri` may only name another prefix there: inside this store, under its
own run's `rollouts/`, holding no object yet and claimed by no live job (docs/design.md, "Trust boundaries": a
request never picks a path outside the store, and one run's request cannot overwrite another's
results)."""

from __future__ import annotations

from trace_common.artifacts import ArtifactStore, open_store, validate_key
from trace_common.endpoints import Endpoints
from trace_common.env import list_environments
from trace_common.errors import AlreadyExists, PermissionDenied
from trace_common.jobs import JobManager, JobRecord
from trace_common.model_refs import ModelRoots

from . import runner
from .metrics import M
from .settings import RolloutSettings
from .specs import RolloutSpecModel


class Rollouts:
    def __init__(self, settings: RolloutSettings, store: ArtifactStore | None = None):
        self.settings = settings
        self.jobs = JobManager.from_settings("rollout", M, settings)
        self.store = store or open_store(settings.artifact_root, settings.s3_settings(), M.artifact_observer)
        #: The operator's endpoint profiles (the embedded stack's operator may add more in-process).
        self.endpoints = Endpoints(settings.endpoints, "TRACE_ROLLOUT_ENDPOINTS")
        self._writers: dict[str, str] = {}  # output prefix a request named -> the job writing it
        self.jobs.on_evict.append(self._forget)
        #: Where a policy's model, adapter and composition may lie: this store and TRACE_ROLLOUT_MODEL_ROOTS
        #: (trace_common/model_refs.py; runner.plan checks them before a job exists).
        self.model_roots = ModelRoots.of(settings, self.store.root_uri)
        #: Directories a request may name data under (TRACE_ROLLOUT_DATA_ROOTS; the embedded stack's
        #: operator may add more in-process, as it adds endpoints).
        self.data_roots = list(settings.data_roots)

    def _forget(self, job_id: str) -> None:
        """An evicted job's claim on its output prefix goes with it (JobManager.on_evict)."""
        for prefix in [p for p, writer in self._writers.items() if writer == job_id]:
            del self._writers[prefix]

    def output_prefix(self, uri: str, run_id: str) -> str:
        """The store key prefix `spec.output_uri` names ("" when it names none); see the module doc."""
        if not uri:
            return ""
        runs = f"runs/{run_id or 'adhoc'}/rollouts/"
        root = self.store.root_uri.rstrip("/") + "/"
        key = uri.rstrip("/")[len(root):] if uri.startswith(root) else ""
        if not key.startswith(runs) or key == runs.rstrip("/"):
            raise PermissionDenied(f"expected a prefix under {root}{runs} (this service's store, this run), got "
                                   f"{uri!r}", field="spec.output_uri",
                                   fix="leave it empty: the job writes under its own id there")
        key = validate_key(key)
        if self.jobs.is_live(self._writers.get(key, "")) or self.store.list(key + "/"):
            raise AlreadyExists(f"spec.output_uri: {uri!r} already holds a rollout (or a live job writes it); "
                                "name a new prefix or leave it empty")
        return key

    def create_job(self, spec: RolloutSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        planned = runner.plan(spec, self.endpoints, self.data_roots, allowed=self.model_roots)  # bad endpoints / environment / tasks fail here, before a job
        retried = self.jobs.by_request(request_id, run_id=run_id) if request_id else None
        if retried is not None:
            return retried  # (a retried request gets its job back; its prefix is claimed by that job)
        prefix = self.output_prefix(spec.output_uri, run_id)

        async def body(ctx):  # (the plan comes back as ctx.spec: held pickled while the job waits, jobs.py)
            return await runner.run(ctx, ctx.spec, self.store, prefix or f"runs/{run_id or 'adhoc'}/rollouts/{ctx.job_id}",
                                    self.settings.default_concurrency, self.settings.s3_settings(),
                                    allowed=self.model_roots)

        job = self.jobs.submit("rollout", body, run_id=run_id, labels=labels, request_id=request_id, spec=planned)
        if prefix:
            self._writers[prefix] = job.job_id
        return job

    def environments(self) -> list[dict]:
        out = []
        for spec in list_environments():
            try:
                env = spec.factory()
            except Exception:  # noqa: BLE001 -- envs needing parameters (a data dir) are listed bare
                out.append(dict(name=spec.name, version=spec.version, description=spec.description))
                continue
            out.append(dict(name=spec.name, version=spec.version, description=spec.description,
                            split_sizes={k: len(v) for k, v in env.splits().items()},
                            tools=env.tool_schemas()))
        return out
