"""The rollout service's domain object: job table, job creation, environment listing (no gRPC).

`endpoints` holds the operator's endpoint profiles (TRACE_ROLLOUT_ENDPOINTS): an OPENAI_HTTP
policy and a user simulator name one of them (runner.plan checks, before a job exists). `data_roots`
holds the directories a request may name data under (TRACE_ROLLOUT_DATA_ROOTS, trace_common/data_roots.py;
runner.plan checks them too).

A job writes its trajectories under `runs/<run_id or adhoc>/rollouts/<job_id>` of this service's
store. A request's `output_uri` may only name another prefix there: inside this store, under its
own run's `rollouts/`, holding no object yet and claimed by no live job (docs/design.md, "Trust boundaries": a
request never picks a path outside the store, and one run's request cannot overwrite another's
results). Every live job claims the prefix it writes -- the one its request named, or its default
one -- from its creation until it ends; a prefix equal to a claimed one, inside it or holding it is
refused (ALREADY_EXISTS), and so is one a concurrent request is checking -- unless that request is this
one (same run_id and request_id): a retry waits for the first attempt and gets its job. The store is listed in a
worker thread (an S3 listing is network I/O; the event loop serves every other call meanwhile)."""

from __future__ import annotations

import asyncio

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
        #: Job id -> the output prefix it writes (the one its request named, or its default one), from
        #: the job's creation until it ends (or, for a job cancelled before it started, is evicted).
        self._writers: dict[str, str] = {}
        #: Prefixes that requests being created named and are checking against the store now.
        self._checking: set[str] = set()
        #: (run_id, request_id) of requests being created now -> done when their creation ends, so a retry
        #: of one waits for its job instead of finding its prefix being checked.
        self._creating: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.jobs.on_evict.append(self._forget)
        #: Where a policy's model, adapter and composition may lie: this store and TRACE_ROLLOUT_MODEL_ROOTS
        #: (trace_common/model_refs.py; runner.plan checks them before a job exists).
        self.model_roots = ModelRoots.of(settings, self.store.root_uri)
        #: Directories a request may name data under (TRACE_ROLLOUT_DATA_ROOTS; the embedded stack's
        #: operator may add more in-process, as it adds endpoints).
        self.data_roots = list(settings.data_roots)

    def _forget(self, job_id: str) -> None:
        """A job's claim on its output prefix ends with the job (its body's end, or JobManager.on_evict
        for a job that never started)."""
        self._writers.pop(job_id, None)

    def _refuse_claimed(self, uri: str, key: str) -> None:
        """AlreadyExists when a live job writes `key`, a prefix inside it or one holding it, or a request
        being created is checking it."""
        def overlaps(other: str) -> bool:
            return other == key or other.startswith(key + "/") or key.startswith(other + "/")
        if any(overlaps(p) for p in self._checking) or any(
                overlaps(p) and self.jobs.is_live(job_id) for job_id, p in self._writers.items()):
            raise AlreadyExists(f"spec.output_uri: {uri!r} is written by a live rollout job (its own prefix, or "
                                "one inside or above it); name a new prefix or leave it empty")

    async def output_prefix(self, uri: str, run_id: str) -> str:
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
        self._refuse_claimed(uri, key)
        self._checking.add(key)  # (until the caller's job claims it: no await between our return and that)
        try:
            held = await asyncio.to_thread(self.store.list, key + "/")
        finally:
            self._checking.discard(key)
        if held:
            raise AlreadyExists(f"spec.output_uri: {uri!r} already holds a rollout; name a new prefix or leave "
                                "it empty")
        return key

    async def create_job(self, spec: RolloutSpecModel, run_id: str, labels: dict[str, str],
                         request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        planned = runner.plan(spec, self.endpoints, self.data_roots, allowed=self.model_roots,
                              max_episodes=self.settings.max_episodes_per_job)  # bad endpoints / environment / tasks fail here, before a job
        creating = (run_id, request_id) if request_id else None
        while creating in self._creating:
            # the same request is being created (its prefix checked against the store): wait for it, then
            # take its job, rather than being refused because that request is checking the prefix
            await asyncio.shield(self._creating[creating])
        retried = self.jobs.by_request(request_id, run_id=run_id) if request_id else None
        if retried is not None:
            return retried  # (a retried request gets its job back; its prefix is claimed by that job)
        if creating is None:
            return await self._create(spec, run_id, labels, request_id, planned)
        done = self._creating[creating] = asyncio.get_running_loop().create_future()
        try:
            return await self._create(spec, run_id, labels, request_id, planned)
        finally:
            del self._creating[creating]
            done.set_result(None)

    async def _create(self, spec: RolloutSpecModel, run_id: str, labels: dict[str, str], request_id: str,
                      planned: runner.PlannedRollout) -> JobRecord:
        prefix = await self.output_prefix(spec.output_uri, run_id)

        async def body(ctx):  # (the plan comes back as ctx.spec: held pickled while the job waits, jobs.py)
            try:
                return await runner.run(ctx, ctx.spec, self.store, prefix or self.default_prefix(run_id, ctx.job_id),
                                        self.settings.default_concurrency, self.settings.s3_settings(),
                                        allowed=self.model_roots)
            finally:
                self._forget(ctx.job_id)

        job = self.jobs.submit("rollout", body, run_id=run_id, labels=labels, request_id=request_id, spec=planned)
        self._writers[job.job_id] = prefix or self.default_prefix(run_id, job.job_id)
        return job

    @staticmethod
    def default_prefix(run_id: str, job_id: str) -> str:
        """Where a job whose request named no `output_uri` writes."""
        return f"runs/{run_id or 'adhoc'}/rollouts/{job_id}"

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
