"""The environment service's domain object: jobs, registry and episodes (no gRPC here)."""

from __future__ import annotations

from trace_common.errors import InvalidArgument, NotFound, Unimplemented
from trace_common.jobs import JobManager, JobRecord

from .metrics import M
from .settings import EnvironmentSettings
from .specs import GenerationSpecModel


class Environments:
    def __init__(self, settings: EnvironmentSettings):
        self.settings = settings
        self.jobs = JobManager("environment", M, max_concurrent=settings.max_concurrent_jobs)
        self.registry: dict[tuple[str, str], dict] = {}
        self.episodes: dict[str, object] = {}

    def create_job(self, spec: GenerationSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        raise Unimplemented(
            f"generation jobs are not implemented yet ({len(spec.capabilities)} capabilities, mode {spec.mode}): "
            "the generation agent, the sandbox and validation arrive with the environment issue")

    def list_environments(self, capability: str, include_rejected: bool) -> list[dict]:
        return [r for r in self.registry.values()
                if (not capability or r["capability"] == capability)
                and (include_rejected or r["status"] == "accepted")]

    def get_environment(self, name: str, version: str) -> dict:
        if not name:
            raise InvalidArgument(field="name", expected="a registered environment name", got=name)
        matches = [r for (n, v), r in self.registry.items() if n == name and (not version or v == version)]
        if not matches:
            raise NotFound(f"no registered environment {name!r}{' version ' + version if version else ''}; "
                           "run a generation job or list environments")
        return matches[-1]

    def reset_episode(self, name: str, version: str, seed: int):
        self.get_environment(name, version)
        raise Unimplemented("episodes in sandbox workers arrive with the environment issue")

    def episode(self, episode_id: str):
        if not episode_id:
            raise InvalidArgument(field="episode_id", expected="an id returned by ResetEpisode", got=episode_id)
        try:
            return self.episodes[episode_id]
        except KeyError:
            raise NotFound(f"no open episode {episode_id!r}; it was closed, timed out, or never opened") from None
