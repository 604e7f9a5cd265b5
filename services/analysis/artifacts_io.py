"""Reading rollout artifacts and writing an analysis's outputs (blocking; call via to_thread).

Rollout artifacts are JSONL files of `Trajectory` written through the artifact store, so each
read is sha256-verified. Documented failures (each fails the job with that code):
  * NOT_FOUND            -- a rollout URI names no object;
  * DATA_LOSS            -- its bytes do not match the recorded sha256, or a line is not a
                            valid trajectory (ArtifactCorrupted names the line);
  * FAILED_PRECONDITION  -- an artifact holds no trajectories (empty file).

Outputs go to `runs/<run_id>/analysis/<job_id>/` (or `analysis/<job_id>/` for a job without a
run) in the service's artifact root; `report.json` is written last, so its presence means the
analysis completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trace_common.artifacts import ArtifactInfo, ArtifactStore, S3Settings, open_store, open_uri
from trace_common.env import Trajectory, loads_jsonl
from trace_common.errors import FailedPrecondition


@dataclass(frozen=True)
class RolloutSource:
    uri: str
    sha256: str
    trajectories: int


def normalise_uri(uri: str) -> str:
    """Absolute local paths (accepted by the spec) become file:// URIs."""
    return Path(uri).as_uri() if uri.startswith("/") else uri


def read_rollouts(uris: list[str], s3: S3Settings | None, observer=None
                  ) -> tuple[list[Trajectory], list[RolloutSource]]:
    trajectories: list[Trajectory] = []
    sources: list[RolloutSource] = []
    for raw in uris:
        uri = normalise_uri(raw)
        store, key = open_uri(uri, s3=s3 if uri.startswith("s3://") else None, observer=observer)
        info = store.stat(key)
        data = store.get_bytes(key)
        batch = loads_jsonl(data, source=uri)
        if not batch:
            raise FailedPrecondition(f"rollout artifact {uri} holds no trajectories ({len(data)} bytes); "
                                     "point rollout_uris at the JSONL a rollout job wrote")
        trajectories.extend(batch)
        sources.append(RolloutSource(uri=uri, sha256=info.sha256, trajectories=len(batch)))
    return trajectories, sources


def output_prefix(run_id: str, job_id: str) -> str:
    return f"runs/{run_id}/analysis/{job_id}" if run_id else f"analysis/{job_id}"


def open_root(root_uri: str, s3: S3Settings | None, observer=None) -> ArtifactStore:
    return open_store(root_uri, s3=s3, observer=observer)


def write_files(store: ArtifactStore, prefix: str, files: list[tuple[str, bytes]]) -> list[ArtifactInfo]:
    """Write files in the order given (put report.json last)."""
    return [store.put_bytes(f"{prefix}/{name}", data) for name, data in files]
