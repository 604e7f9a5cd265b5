"""Reading rollout artifacts and writing an analysis's outputs (blocking; call via to_thread).

Which rollout artifacts a job may read is decided before the job exists (`confine_rollouts`): an
object of this service's own store under the request's own run, `runs/<run_id or adhoc>/rollouts/`,
or an object under a store prefix the operator lists (`rollout_roots`, TRACE_ANALYSIS_ROLLOUT_ROOTS).
`file://` paths are checked with symlinks resolved; '.'/'..' segments (also percent-encoded), other
buckets, other directories and other runs' rollouts are PermissionDenied, naming the field and what
is allowed, with one message whether or not the object exists (no object is read to decide; only
symlinks along a `file://` path change the outcome). An
adversarial review had copied another run's trajectories (and their evidence) into its own run's
labels.jsonl by naming them.

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

import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from trace_common.artifacts import ArtifactInfo, ArtifactStore, S3Settings, open_store, validate_key
from trace_common.artifacts.keys import RootSpec, parse_root_uri
from trace_common.env import Trajectory, loads_jsonl
from trace_common.errors import FailedPrecondition, InvalidArgument, PermissionDenied, ResourceExhausted

#: The setting that lists the store prefixes a job may read besides its own run's rollouts.
ROLLOUT_ROOTS_SETTING = "TRACE_ANALYSIS_ROLLOUT_ROOTS"


@dataclass(frozen=True)
class RolloutSource:
    uri: str
    sha256: str
    trajectories: int


@dataclass(frozen=True)
class RolloutRef:
    """A rollout URI a request named, as `confine_rollouts` admitted it: `key` in `store`."""

    uri: str
    store: ArtifactStore
    key: str


def _parse(uri: str) -> tuple[str, str, str] | None:
    """(scheme, location, path) of a rollout URI: ('file', '', '/abs/path') or ('s3', bucket, 'key');
    None when it has '.', '..' or empty segments (percent-decoded in file URIs) or is no such URI."""
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://"):].partition("/")
        parts = key.split("/")
        return None if any(p in ("", ".", "..") for p in parts) else ("s3", bucket, key)
    if uri.startswith("file://"):
        rest = uri[len("file://"):]
        uri = unquote(rest[len("localhost"):] if rest.startswith("localhost/") else rest)
    if not uri.startswith("/") or "\x00" in uri:
        return None
    parts = uri[1:].split("/")
    return None if any(p in ("", ".", "..") for p in parts) else ("file", "", uri)


def _key_under(parsed: tuple[str, str, str], root: RootSpec, prefix: str) -> str | None:
    """The key `parsed` names in the store rooted at `root` when it lies under `prefix` there (symlinks
    resolved for file stores), else None."""
    scheme, location, path = parsed
    if scheme != root.scheme:
        return None
    if scheme == "s3":
        base = f"{root.prefix}/" if root.prefix else ""
        if location != root.location or not path.startswith(base + prefix):
            return None
        key = path[len(base):]
    else:
        base = root.location.rstrip("/") + "/"
        if not path.startswith(base + prefix):
            return None
        key = path[len(base):]
        real_base = os.path.realpath(os.path.join(root.location, prefix)) if prefix else os.path.realpath(root.location)
        if not os.path.realpath(path).startswith(real_base.rstrip("/") + "/"):
            return None   # a symlink inside points out of the allowed prefix
    if key == prefix or not key:
        return None
    try:
        return validate_key(key)
    except InvalidArgument:
        return None


def confine_rollouts(uris: Sequence[str], run_id: str, store: ArtifactStore, roots: Sequence[str],
                     s3: S3Settings | None, observer=None) -> list[RolloutRef]:
    """Each of `uris` as a `RolloutRef` in `store` (this service's own store: only under
    `runs/<run_id or adhoc>/rollouts/`) or in one of `roots` (the operator's store prefixes);
    PermissionDenied for any other (module docstring). Reads nothing."""
    own = parse_root_uri(store.root_uri)
    prefix = f"runs/{run_id or 'adhoc'}/rollouts/"
    allowed = [parse_root_uri(r, field="rollout_roots") for r in roots]
    opened: dict[str, ArtifactStore] = {}  # root URI -> its store, opened once for all the URIs under it
    out = []
    for i, uri in enumerate(uris):
        parsed = _parse(uri)
        key = _key_under(parsed, own, prefix) if parsed else None
        if key is not None:
            out.append(RolloutRef(uri=store.uri_for(key), store=store, key=key))
            continue
        for root in allowed:
            key = _key_under(parsed, root, "") if parsed else None
            if key is not None:
                if root.uri not in opened:
                    opened[root.uri] = open_store(root.uri, s3 if root.scheme == "s3" else None, observer)
                other = opened[root.uri]
                out.append(RolloutRef(uri=other.uri_for(key), store=other, key=key))
                break
        else:
            raise PermissionDenied(
                f"expected an object under {prefix} in this service's store (this request's run; the store's "
                f"location is not shown) or under a store prefix the operator lists in {ROLLOUT_ROOTS_SETTING}; "
                "this URI is neither "
                "(symlinks resolved, no '.' or '..' segments)", field=f"spec.rollout_uris[{i}]",
                fix="pass the trajectories a rollout job of this run wrote (its output URI); tracectl analyze "
                    "imports a local file into the run's store first")
    return out


def read_rollouts(refs: Sequence[RolloutRef], max_bytes: int | None = None
                  ) -> tuple[list[Trajectory], list[RolloutSource]]:
    """The trajectories of admitted rollout artifacts (sha256-verified reads). With `max_bytes`, every
    artifact is sized first and ResourceExhausted raised, before any is read, if together they exceed it."""
    infos = [ref.store.stat(ref.key) for ref in refs]
    total = sum(info.size for info in infos)
    if max_bytes is not None and total > max_bytes:
        raise ResourceExhausted(f"the {len(refs)} rollout artifact(s) hold {total:,} bytes, more than one analysis "
                                f"job reads ({max_bytes:,}: TRACE_ANALYSIS_MAX_ROLLOUT_BYTES); analyse fewer "
                                "rollouts per job, or raise the setting together with the service's memory")
    trajectories: list[Trajectory] = []
    sources: list[RolloutSource] = []
    for ref, info in zip(refs, infos, strict=True):
        uri, store, key = ref.uri, ref.store, ref.key
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
