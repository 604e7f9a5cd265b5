"""The rollout service's domain object: job table, job creation, environment listing (no gRPC).

`endpoints` holds the operator's endpoint profiles (TRACE_ROLLOUT_ENDPOINTS): an OPENAI_HTTP
policy and a user simulator name one of them (runner.plan checks, before a job exists).

A job writes its trajectories under `runs/<run_id or adhoc>/rollouts/<job_id>` of this service's
store. A request's `output_uri` may only name another prefix there: inside this store, under its
own run's `rollouts/`, holding no object yet and claimed by no live job (DESIGN, trust boundaries: a
request never picks a path outside the store, and one run's request cannot overwrite another's
results)."""

from __future__ import annotations

from trace_common.artifacts import ArtifactStore, open_store, validate_key
from trace_common.endpoints import Endpoints
from trace_common.env import list_environments
from trace_common.errors import AlreadyExists, PermissionDenied
from trace_common.jobs import JobManager, JobRecord

from . import runner
from .metrics import M
from .settings import RolloutSettings
from .specs import RolloutSpecModel


class Rollouts:
    def __init__(self, settings: RolloutSettings, store: ArtifactStore | None = None):
        self.settings = settings
        self.jobs = JobManager("rollout", M, max_concurrent=settings.max_concurrent_jobs)
        self.store = store or open_store(settings.artifact_root, settings.s3_settings(), M.artifact_observer)
        #: The operator's endpoint profiles (the embedded stack's operator may add more in-process).
        self.endpoints = Endpoints(settings.endpoints, "TRACE_ROLLOUT_ENDPOINTS")
        self._writers: dict[str, str] = {}  # output prefix a request named -> the job writing it

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
        planned = runner.plan(spec, self.endpoints)  # bad endpoints / environment / tasks fail here, before a job
        retried = self.jobs.by_request(request_id) if request_id else None
        if retried is not None:
            return retried  # (a retried request gets its job back; its prefix is claimed by that job)
        prefix = self.output_prefix(spec.output_uri, run_id)

        async def body(ctx):
            return await runner.run(ctx, planned, self.store, prefix or f"runs/{run_id or 'adhoc'}/rollouts/{ctx.job_id}",
                                    self.settings.default_concurrency, self.settings.s3_settings())

        job = self.jobs.submit("rollout", body, run_id=run_id, labels=labels, request_id=request_id)
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
