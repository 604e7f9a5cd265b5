"""The run manifest: what each stage consumed and produced, so a run resumes stage by stage.

Stored at `runs/<run_id>/manifest.json` in the artifact store and rewritten atomically after
every stage transition (the store's writes are atomic and sha256-verified), so a crash or a
SIGKILL at any point leaves either the previous manifest or the new one -- never a torn one.

Semantics:
    stage s is reusable  <=>  manifest[s].status == "completed"
                              and manifest[s].config_hash == hash(config of s and of every stage before it)
    `--from s` marks s and every later stage stale; a stale or failed stage is re-run, and
    re-running a stage makes every later stage stale.
    Within a stage, units of work (the evaluation's arms) are recorded in `partial` as they
    finish: a re-run of a killed or failed stage under the same config_hash reuses them;
    `--from`, another config or the stage's completion clears them.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from trace_common.artifacts import ArtifactStore
from trace_common.artifacts.file_store import NotAFile
from trace_common.errors import ArtifactCorrupted, NotFound

STAGES = ("rollout", "analysis", "environments", "adapters", "gates", "evaluation", "report")

Status = Literal["pending", "running", "completed", "failed", "stale"]


class StageRecord(BaseModel):
    status: Status = "pending"
    config_hash: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    #: Job ids per service call, for tracing numbers back to jobs.
    jobs: list[str] = Field(default_factory=list)
    #: Output artifact URIs by role (e.g. {"trajectories": "file:///..."}).
    outputs: dict[str, Any] = Field(default_factory=dict)
    #: Small results the next stages and the report need (retained capabilities, pass rates...).
    result: dict[str, Any] = Field(default_factory=dict)
    error: str = ""
    #: Units of work finished while the stage was running (key -> the unit's result), reused by a
    #: re-run under the same config_hash (module docstring); empty once the stage completes.
    partial: dict[str, Any] = Field(default_factory=dict)


class Manifest(BaseModel):
    run_id: str
    config: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    stages: dict[str, StageRecord] = Field(default_factory=lambda: {s: StageRecord() for s in STAGES})

    @staticmethod
    def key(run_id: str) -> str:
        return f"runs/{run_id}/manifest.json"

    @classmethod
    def load(cls, store: ArtifactStore, run_id: str) -> Manifest | None:
        """The run's manifest, None when the run has none yet. A manifest whose bytes fail their
        sha256 check, or that does not parse as a manifest, raises ArtifactCorrupted saying how to
        get going again (`corrupted`): a run never resumes from a manifest it cannot trust."""
        key = cls.key(run_id)
        try:
            data = store.get_bytes(key)
        except NotFound:
            return None
        except NotAFile:
            raise corrupted(store, run_id, "it is not a regular file (a directory or the like stands in its place)") from None
        except ArtifactCorrupted as err:
            raise corrupted(store, run_id, "its bytes fail the sha256 check recorded when it was written") from err
        try:
            return cls.model_validate_json(data)
        except ValidationError as err:
            raise corrupted(store, run_id, f"it does not parse as a run manifest ({err.errors()[0]['msg']})") from None

    def save(self, store: ArtifactStore) -> None:
        store.put_bytes(self.key(self.run_id), self.model_dump_json(indent=2).encode())

    def stage_naming(self, text: str) -> str | None:
        """The first stage whose outputs or results name an artifact URI that occurs in `text` (an
        error message about that artifact), so the message can say which stage to re-run."""
        for stage in STAGES:
            rec = self.stages[stage]
            if any(uri in text for uri in _uris([rec.outputs, rec.result, rec.partial])):
                return stage
        return None

    def invalidate_from(self, stage: str) -> None:
        for s in STAGES[STAGES.index(stage):]:
            if self.stages[s].status == "completed":
                self.stages[s].status = "stale"
            self.stages[s].partial = {}


def _uris(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.startswith(("file://", "s3://")) else []
    if isinstance(value, dict):
        return [u for v in value.values() for u in _uris(v)]
    if isinstance(value, list):
        return [u for v in value for u in _uris(v)]
    return []


def corrupted(store: ArtifactStore, run_id: str, why: str) -> ArtifactCorrupted:
    """The one-line error for a manifest that cannot be used, with the way out: delete it and re-run
    (every stage runs again) or start a separate run."""
    uri = store.uri_for(Manifest.key(run_id))
    sidecar = " and its .sha256 file" if uri.startswith("file://") else ""
    return ArtifactCorrupted(
        f"run {run_id!r}: manifest {uri} is damaged: {why}. Delete it{sidecar} and re-run `tracectl run` "
        f"to run every stage again (or pass --run-id NEW to start a separate run); `tracectl report` needs "
        "an intact manifest")


def config_hash(*parts: Any) -> str:
    """Hash of the configuration a stage depends on (its own and every earlier stage's)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
