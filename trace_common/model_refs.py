"""Model references -> local directories: the one place every service decides whether it may load
a base model, an adapter, a composition or a gates file a request names, and resolves it.

The rule (docs/design.md, "Trust boundaries"): a reference is accepted only if it is

| form                                                   | accepted when                                           |
|--------------------------------------------------------|---------------------------------------------------------|
| a built-in base agent (`micro`, `smollm2`, `smollm2-base`) | always: the service builds or fetches it (`trace_common.agents`) |
| `file:///dir`, `/abs/dir`, `./rel/dir` (relative to the service's working directory) | the path, with `..` and symlinks resolved, lies under the service's `file://` store root or under one of the operator's model roots (`ServiceSettings.model_roots`) |
| `s3://bucket/prefix`                                   | with `..` resolved, it lies under the service's `s3://` store root or an `s3://` model root |

A reference holding a control character (a NUL, a newline ...) is no path or URI at all: it is
`InvalidArgument` naming the field, before any decision. Anything else is `PermissionDenied` naming
the field and what is allowed (the store root and the operator's roots, nothing else of the host).
The decision is made on the resolved path alone (`os.path.realpath`: it reads the symlinks along the
path, nothing else), never on whether the path exists or what it holds, and the message is the same
for every refused reference but for the reference itself: a refused path gets one answer whether it
exists or not. Only an accepted
reference is then looked at, and may be `NotFound` / corrupt.

Resolution of an accepted reference:

| form                  | resolves to                                                                     |
|-----------------------|---------------------------------------------------------------------------------|
| local                 | that directory, symlinks resolved (it must exist)                               |
| `s3://bucket/prefix`  | a copy under the cache dir, downloaded once per URI; every object sha256-verified by the store; published by renaming a complete `.partial` copy, so a killed download is never used |
| any of the above naming a file in an artifact directory (`.../adapter_model.safetensors`, what training jobs output) | that file's directory |
| a built-in base agent | its built (or shipped, or cached) model directory                                |

`check_model_ref` is the cheap form for request validation (no download, no build); `fetch_file`
reads one file (a composition's gates) through the store it lies in, sha256-verified, into a cache
entry named by the resolved location (so `/./`, `//` or `..` spellings of one file share one copy).
`ModelRoots.of(settings)` is a service's rule; `UNCONFINED` is for trusted in-process callers only
(benchmarks, tests, a user's own Python), never for a path a request names.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trace_common.errors import InvalidArgument, NotFound, PermissionDenied

#: Files that identify a model / adapter directory when a URI names one of them.
ARTIFACT_DIR_FILES = frozenset({"adapter_model.safetensors", "adapter_config.json", "model.safetensors",
                                "config.json"})
DEFAULT_CACHE = Path.home() / ".cache" / "trace" / "artifacts"


def _built_in() -> tuple[str, ...]:
    from trace_common.agents.resolve import BUILT_IN

    return BUILT_IN


def _dir_ref(ref: str) -> str:
    return ref.rsplit("/", 1)[0] if ref.rsplit("/", 1)[-1] in ARTIFACT_DIR_FILES else ref


@dataclass(frozen=True)
class Resolved:
    """An accepted reference. `kind` says which form; `root` is the store or model root it lies under
    (a root URI, "" for built-in names and unconfined references) and `key` its path below that root."""

    kind: Literal["built_in", "local", "s3"]
    ref: str                 # the reference as given
    name: str = ""           # built_in: the agent name
    path: Path | None = None  # local: the resolved path
    uri: str = ""            # s3: the normalised URI
    root: str = ""
    key: str = ""


def _check_printable(ref: str, field: str) -> None:
    """InvalidArgument naming `field` when `ref` holds a control character: `os.path.realpath` and `open`
    fail on a NUL with a bare ValueError (an INTERNAL error, not the caller's), and no path, URI or
    built-in name holds one. Checked here as well as by the request specs (trace_common.specs.check_printable)
    because references also come from stored manifests and in-process callers."""
    for i, ch in enumerate(ref):
        if unicodedata.category(ch) == "Cc":
            raise InvalidArgument(field=field, expected="a path, URI or built-in agent name of printable characters",
                                  got=ref, reason=f"control character {ch!r} at position {i}", fix="Remove it")


def _local_path(ref: str) -> Path | None:
    """The path a local reference names (relative ones against the working directory), unresolved;
    None when `ref` has no local form."""
    if ref.startswith("file://"):
        rest = ref[len("file://"):]
        return Path(rest) if rest.startswith("/") else None
    if "://" in ref:
        return None
    if ref.startswith("/"):
        return Path(ref)
    if ref.startswith("./") or ref.startswith("../") or "/" in ref:
        return Path.cwd() / ref
    return None


def _split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key with `..`, `.` and empty segments resolved) of an s3:// URI."""
    bucket, _, key = uri[len("s3://"):].partition("/")
    key = posixpath.normpath("/" + key).lstrip("/") if key else ""
    return bucket, "" if key == "." else key


def _under(key: str, prefix: str) -> str | None:
    """`key` relative to `prefix` when it lies under it (None otherwise)."""
    if not prefix:
        return key
    if key == prefix:
        return ""
    return key[len(prefix) + 1:] if key.startswith(prefix + "/") else None


@dataclass(frozen=True)
class ModelRoots:
    """Where a service may load models from: its own artifact store (`store`, a root URI) and the
    operator's model roots (`roots`, `file:///abs` or `s3://bucket[/prefix]`). `setting` names the
    variable listing the roots (for refusal messages)."""

    store: str = ""
    roots: tuple[str, ...] = ()
    setting: str = "model_roots"
    unconfined: bool = False

    @classmethod
    def of(cls, settings, store_root: str | None = None) -> ModelRoots:
        """The rule of a service from its `ServiceSettings` (artifact_root + model_roots); `store_root`:
        the root of the store the service opened, when it was given one other than artifact_root."""
        name = getattr(settings, "service_name", "") or ""
        setting = f"TRACE_{name.upper()}_MODEL_ROOTS" if name else "model_roots"
        return cls(store=store_root or settings.artifact_root, roots=tuple(settings.model_roots), setting=setting)

    def with_roots(self, *roots: str) -> ModelRoots:
        return ModelRoots(self.store, (*self.roots, *roots), self.setting, self.unconfined)

    def allowed(self) -> str:
        """What may be named, for messages: built-in agents, the store root, the operator's roots."""
        roots = ", ".join(self.roots) or f"none listed in {self.setting}"
        return (f"a built-in base agent ({', '.join(_built_in())}), an artifact under this service's store "
                f"({self.store or 'none'}) or a path under an operator model root ({roots})")

    def _refuse(self, ref: str, field: str) -> PermissionDenied:
        shown = ref if len(ref) <= 200 else ref[:200] + "..."
        return PermissionDenied(f"{shown!r} is not a model location this service may read; allowed: "
                                f"{self.allowed()}", field=field,
                                fix=f"Copy the model into the store, or have the operator list its directory in "
                                    f"{self.setting}")

    def _file_roots(self) -> list[tuple[str, Path]]:
        out = []
        for root in (self.store, *self.roots):
            if root.startswith("file://"):
                out.append((root, Path(os.path.realpath(root[len("file://"):]))))
        return out

    def _s3_roots(self) -> list[tuple[str, str, str]]:
        out = []
        for root in (self.store, *self.roots):
            if root.startswith("s3://"):
                bucket, prefix = _split_s3(root)
                out.append((f"s3://{bucket}" + (f"/{prefix}" if prefix else ""), bucket, prefix))
        return out

    def resolve(self, ref: str, field: str) -> Resolved:
        """Decide (module docstring) and resolve `ref` without looking at what it names; PermissionDenied
        naming `field` when it is not allowed, InvalidArgument when it is empty."""
        if not ref:
            raise InvalidArgument(field=field, expected=self.allowed())
        _check_printable(ref, field)
        if ref in _built_in():
            return Resolved("built_in", ref, name=ref)
        if ref.startswith("s3://"):
            bucket, key = _split_s3(ref)
            uri = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
            if not bucket or not key:
                raise self._refuse(ref, field)
            if self.unconfined:
                return Resolved("s3", ref, uri=uri)
            for root, rbucket, prefix in self._s3_roots():
                rel = _under(key, prefix) if bucket == rbucket else None
                if rel is not None:
                    return Resolved("s3", ref, uri=uri, root=root, key=rel)
            raise self._refuse(ref, field)
        path = _local_path(ref)
        if path is None:
            raise self._refuse(ref, field)
        real = Path(os.path.realpath(path))  # `..` and symlinks resolved: a link out of a root is outside it
        if self.unconfined:
            return Resolved("local", ref, path=real)
        for root, rpath in self._file_roots():
            if real.is_relative_to(rpath):
                key = real.relative_to(rpath).as_posix()
                return Resolved("local", ref, path=real, root=root, key="" if key == "." else key)
        raise self._refuse(ref, field)


#: Trusted in-process callers only (module docstring): every reference is resolved, none refused.
UNCONFINED = ModelRoots(unconfined=True, setting="(unconfined)")


#: A download directory older than this, under the cache, was left by a process that died mid-download.
STALE_PARTIAL_S = 24 * 3600
#: What a model or adapter directory holds at its top (what `materialize`'s callers load).
DIRECTORY_MARKERS = ("config.json", "adapter_config.json")


def _download(uri: str, cache_dir: Path, s3) -> Path:
    from trace_common.artifacts import open_uri

    path = cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:24]
    if path.is_dir():
        return path
    store, prefix = open_uri(uri.rstrip("/"), s3)
    files = store.list(prefix + "/")
    if not files:
        raise NotFound(f"no objects under {uri}; give the URI of a model or adapter directory")
    if not {info.key[len(prefix) + 1:] for info in files} & set(DIRECTORY_MARKERS):
        # e.g. a store's root: everything under it would be downloaded into the cache
        raise NotFound(f"{uri} holds {len(files)} object(s) but no {' or '.join(DIRECTORY_MARKERS)} at its top; "
                       "give the URI of a model or adapter directory (written by save_pretrained)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    for old in cache_dir.glob(f"{path.name}.partial*"):
        try:
            if time.time() - old.stat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    # a directory of its own: two jobs downloading the same URI at once each write their own copy
    tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f"{path.name}.partial-"))
    try:
        for info in files:
            dest = tmp / info.key[len(prefix) + 1:]
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.get_file(info.key, dest)
        try:
            tmp.rename(path)
        except OSError:  # another download of the same URI was published first: it is used
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def materialize(ref: str, *, allowed: ModelRoots, cache_dir: Path | None = None, s3=None,
                field: str = "model") -> Path:
    """A local directory for `ref` (module docstring): PermissionDenied unless `allowed` accepts it,
    then NotFound / InvalidArgument naming `field`."""
    r = allowed.resolve(_dir_ref(ref) if ref else ref, field)
    if r.kind == "s3":
        return _download(r.uri, cache_dir or DEFAULT_CACHE, s3)
    if r.kind == "local":
        assert r.path is not None
        if not r.path.is_dir():
            raise NotFound(f"{field} {ref!r} is not a directory that exists; was the artifact written?")
        return r.path
    from trace_common.agents import resolve_base_agent

    return Path(resolve_base_agent(r.name))


def check_model_ref(ref: str, field: str = "spec.policy.model", *, allowed: ModelRoots,
                    marker: str | None = "config.json") -> Resolved:
    """Cheap validation at request time (no download, no build): PermissionDenied when `allowed`
    refuses `ref`; for an accepted local directory, NotFound when it has no `marker` file
    (config.json for a model, adapter_config.json for an adapter; None: no look)."""
    r = allowed.resolve(_dir_ref(ref) if ref else ref, field)
    if r.kind == "local" and marker is not None:
        assert r.path is not None
        if not (r.path / marker).is_file():
            raise NotFound(f"{field} {ref!r} has no {marker}; give a directory written by save_pretrained")
    return r


def check_policy_refs(policy, allowed: ModelRoots, prefix: str = "spec.policy") -> None:
    """Request-time check of every reference a `PolicyRefModel` names: `model` (for the in-process
    backend; an HTTP policy's model is a served name, a scripted one a policy name), `adapter_uri`
    and `composition_uri` (whatever the backend). PermissionDenied / NotFound naming the field."""
    if policy.backend == "POLICY_BACKEND_IN_PROCESS":
        check_model_ref(policy.model, f"{prefix}.model", allowed=allowed)
    if policy.adapter_uri:
        check_model_ref(policy.adapter_uri, f"{prefix}.adapter_uri", allowed=allowed, marker="adapter_config.json")
    if policy.composition_uri:
        check_model_ref(policy.composition_uri, f"{prefix}.composition_uri", allowed=allowed, marker=None)


def fetch_file(uri: str, cache_dir: Path, s3=None, *, allowed: ModelRoots, field: str = "gates_uri") -> Path:
    """A local copy of the one artifact `uri` names, read through the store (or model root) it lies in,
    so its sha256 sidecar is verified like every artifact's (a file written outside a store has none:
    NotFound / ArtifactCorrupted). PermissionDenied first when `allowed` refuses `uri`."""
    from trace_common.artifacts import open_store, open_uri

    r = allowed.resolve(uri, field)
    if r.kind == "built_in":
        raise InvalidArgument(field=field, expected="the URI of a file in the artifact store", got=uri)
    if r.root:
        store, key = open_store(r.root, s3), r.key
    else:  # unconfined: the object's own directory / bucket
        store, key = open_uri(r.path.as_uri() if r.path is not None else r.uri, s3)
    # named by where the file resolved to, not by how `uri` spells it: every spelling of one file
    # (`/./`, `//`, a symlink) would otherwise leave its own permanent copy in the cache
    where = r.path.as_posix() if r.path is not None else r.uri
    dest = cache_dir / "files" / hashlib.sha256(where.encode()).hexdigest()[:16] / Path(key).name
    store.get_file(key, dest)
    return dest
