"""A shipped base-agent artifact's files and build record: where it lives in the repository, how
its record is read, how its files are verified (sha256 and size of each) and how it is installed
into a cache entry.

    trace_common/agents/shipped/<kind>/
        config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json, ...
        build_record.json

`cache.cached_build` installs an artifact from here (`install_if_matching`) and explains from
its record why one is not used; `shipped.py` makes and checks artifacts. This module imports
neither, so the cache does not depend on the code that builds and checks agents.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from trace_common.agents.progress import BuildEvent, BuildProgress
from trace_common.errors import ArtifactCorrupted

SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"
RECORD_NAME = "build_record.json"
RECORD_FORMAT = 1
#: The one command that (re)builds a shipped artifact from the current code.
REBUILD_COMMAND = {"micro": ".venv/bin/tracectl agents ship micro"}


def shipped_dir(kind: str, root: Path = SHIPPED_ROOT) -> Path:
    return root / kind


def read_record(artifact: Path) -> dict[str, Any] | None:
    path = artifact / RECORD_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ArtifactCorrupted(f"{path} is not valid JSON ({exc}); rebuild the artifact") from exc


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_files(artifact: Path, record: dict[str, Any]) -> None:
    """Every file the record lists exists with its recorded sha256 and size, and no other file is there."""
    kind = record.get("kind", artifact.name)
    fix = f"rebuild it with: {REBUILD_COMMAND.get(kind, 'tracectl agents ship ' + kind)}"
    files: dict[str, dict[str, Any]] = record.get("files") or {}
    if not files:
        raise ArtifactCorrupted(f"{artifact / RECORD_NAME} lists no files; {fix}")
    present = {p.name for p in artifact.iterdir() if p.is_file()} - {RECORD_NAME}
    if present - set(files):
        raise ArtifactCorrupted(f"{artifact} holds files its build record does not list: "
                                f"{sorted(present - set(files))}; {fix}")
    for name, want in sorted(files.items()):
        path = artifact / name
        if not path.is_file():
            raise ArtifactCorrupted(f"{path} is missing; {fix}")
        got = sha256_file(path)
        if got != want["sha256"] or path.stat().st_size != want["size"]:
            raise ArtifactCorrupted(f"{path}: sha256 {got[:16]}... ({path.stat().st_size} bytes), the build record "
                                    f"says {want['sha256'][:16]}... ({want['size']} bytes); {fix}")


def install_if_matching(artifact: Path, kind: str, key: str, dest: Path,
                        progress: BuildProgress | None = None) -> dict[str, Any] | None:
    """Copy the shipped artifact of `kind` into `dest` (verified) when its record has cache key `key`;
    return the record's metrics, or None when there is no artifact or it has another key."""
    record = read_record(artifact)
    if record is None or record.get("kind") != kind or record.get("key") != key:
        return None
    if progress is not None:
        progress(BuildEvent(agent=kind, phase="installing",
                            message=f"installing the shipped {kind} agent from {artifact} (sha256 verified)"))
    verify_files(artifact, record)
    for name in record["files"]:
        shutil.copyfile(artifact / name, dest / name)
    verify_files_in(dest, record)  # what was copied is what was verified
    return {**record.get("metrics", {}), "shipped_build_seconds": record.get("build_seconds"),
            "shipped_built_at": record.get("built_at")}


def verify_files_in(directory: Path, record: dict[str, Any]) -> None:
    for name, want in record["files"].items():
        if sha256_file(directory / name) != want["sha256"]:
            raise ArtifactCorrupted(f"{directory / name} changed while it was copied; try again")
