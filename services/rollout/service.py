"""The rollout service's domain object: job table, job creation, environment listing (no gRPC).

`endpoints` holds the operator's endpoint profiles (TRACE_ROLLOUT_ENDPOINTS): an OPENAI_HTTP
policy and a user simulator name one of them (runner.plan checks, before a job exists)."""

from __future__ import annotations

from trace_common.artifacts import ArtifactStore, open_store
from trace_common.endpoints import Endpoints
from trace_common.env import list_environments
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

    def create_job(self, spec: RolloutSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        planned = runner.plan(spec, self.endpoints)  # bad endpoints / environment / tasks fail here, before a job
        prefix = spec.output_uri

        async def body(ctx):
            key_prefix = f"runs/{run_id or 'adhoc'}/rollouts/{ctx.job_id}"
            store = self.store
            if prefix:
                from trace_common.artifacts import open_uri

                store, key_prefix = open_uri(prefix.rstrip("/"), self.settings.s3_settings(), M.artifact_observer)
            return await runner.run(ctx, planned, store, key_prefix, self.settings.default_concurrency,
                                    self.settings.s3_settings())

        return self.jobs.submit("rollout", body, run_id=run_id, labels=labels, request_id=request_id)

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
