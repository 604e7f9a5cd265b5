"""Model references -> local directories: the one place every service resolves a base model, an
adapter or a composition part it is given by name.

A reference is one of:

| form                                   | resolves to                                                   |
|----------------------------------------|---------------------------------------------------------------|
| `file:///dir`, `/abs/dir`, `./rel/dir` | that directory (it must exist)                                 |
| `s3://bucket/prefix`                   | a copy under the cache dir, downloaded once per URI; every object sha256-verified by the store; published by renaming a complete `.partial` copy, so a killed download is never used |
| any of the above naming a file in an artifact directory (`.../adapter_model.safetensors`, what training jobs output) | that file's directory |
| a built-in base agent (`micro`, `smollm2`, `smollm2-base`) | its built (or shipped, or cached) model directory (`trace_common.agents`) |

`check_model_ref` is the cheap form for request validation: no download, no build.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from trace_common.errors import InvalidArgument, NotFound

#: Files that identify a model / adapter directory when a URI names one of them.
ARTIFACT_DIR_FILES = frozenset({"adapter_model.safetensors", "adapter_config.json", "model.safetensors",
                                "config.json"})
DEFAULT_CACHE = Path.home() / ".cache" / "trace" / "artifacts"


def _dir_ref(ref: str) -> str:
    return ref.rsplit("/", 1)[0] if ref.rsplit("/", 1)[-1] in ARTIFACT_DIR_FILES else ref


def local_dir(ref: str) -> Path | None:
    """The directory a reference names on this machine, or None for s3:// URIs and built-in names."""
    ref = _dir_ref(ref)
    if ref.startswith("file://"):
        return Path(ref.removeprefix("file://"))
    if ref.startswith(("/", "./", "../", "~")):
        return Path(ref).expanduser()
    if "/" in ref and not ref.startswith("s3://") and Path(ref).is_dir():
        return Path(ref)
    return None


def _download(uri: str, cache_dir: Path, s3) -> Path:
    from trace_common.artifacts import open_uri

    path = cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:24]
    if path.is_dir():
        return path
    store, prefix = open_uri(uri.rstrip("/"), s3)
    files = store.list(prefix + "/")
    if not files:
        raise NotFound(f"no objects under {uri}; give the URI of a model or adapter directory")
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # a download an earlier process did not finish
    for info in files:
        dest = tmp / info.key[len(prefix) + 1:]
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(info.key, dest)
    try:
        tmp.rename(path)
    except OSError:  # another process published the same URI first
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def materialize(ref: str, *, cache_dir: Path | None = None, s3=None, field: str = "model") -> Path:
    """A local directory for `ref` (module docstring). NotFound / InvalidArgument name `field`."""
    if not ref:
        raise InvalidArgument(field=field, expected="a model directory, an artifact URI or a built-in agent name")
    ref = _dir_ref(ref)
    if ref.startswith("s3://"):
        return _download(ref, cache_dir or DEFAULT_CACHE, s3)
    path = local_dir(ref)
    if path is not None:
        if not path.is_dir():
            raise NotFound(f"{field} {ref!r} is not a directory that exists; was the artifact written?")
        return path
    from trace_common.agents import BUILT_IN, resolve_base_agent

    if ref in BUILT_IN:
        return Path(resolve_base_agent(ref))
    raise NotFound(f"{field} {ref!r} is neither a model directory, an artifact URI, nor a built-in base agent "
                   f"({', '.join(BUILT_IN)}); give a directory written by save_pretrained or s3://bucket/path")


def check_model_ref(ref: str, field: str = "spec.policy.model") -> None:
    """Cheap validation at request time (no download, no build): InvalidArgument / NotFound naming `field`."""
    if not ref:
        raise InvalidArgument(field=field, expected="a model directory, URI or built-in agent name")
    if ref.startswith("s3://"):
        return
    path = local_dir(ref)
    if path is not None:
        if not (path / "config.json").is_file():
            raise NotFound(f"{field} {ref!r} has no config.json; give a directory written by save_pretrained")
        return
    from trace_common.agents import BUILT_IN

    if ref not in BUILT_IN:
        raise NotFound(f"{field} {ref!r} is not a built-in base agent ({', '.join(BUILT_IN)}), a model "
                       "directory or an artifact URI")
