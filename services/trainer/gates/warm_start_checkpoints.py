"""Where the gate warm start keeps its checkpoints in the artifact store, and how they are checked.

Layout, under `<prefix>/gates-ckpt/` (the gates job's GRPO phase keeps its own, `grpo/checkpoint.py`):
    ckpt-<step>/gates.safetensors   the served gates W_l (`composition_io.save_gates`)
    ckpt-<step>/optimizer.pt        AdamW state and the trained V_l
    ckpt-<step>/state.json          step, losses, config digest
    ckpt-<step>/checkpoint.json     written LAST: step, config digest, every file's sha256 and size

A checkpoint exists only once its checkpoint.json does, so one whose writing died is never listed.
Reading one refuses a checkpoint written with another warm-start config (FailedPrecondition; the
digest leaves out max_steps and save_steps, `GateTrainingConfig.digest`) and a file whose bytes
differ from the manifest's sha256 (ArtifactCorrupted). What the files hold, and how a resumed run
continues exactly as an uninterrupted one would, is the trainer's (`warm_start.py`).
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from trace_common.artifacts import ArtifactStore
from trace_common.errors import ArtifactCorrupted, FailedPrecondition, NotFound
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import GATES_FILE, read_gates, save_gates

CKPT_DIR = "gates-ckpt"
CKPT_MANIFEST = "checkpoint.json"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "state.json"
_CKPT_RE = re.compile(r"/ckpt-(\d+)/checkpoint\.json$")


def list_gate_checkpoints(store: ArtifactStore, prefix: str) -> list[tuple[int, str]]:
    """(step, key of checkpoint.json) of every complete gate checkpoint under `prefix`, oldest first."""
    found = []
    for info in store.list(f"{prefix}/{CKPT_DIR}/ckpt-"):
        m = _CKPT_RE.search("/" + info.key)
        if m:
            found.append((int(m.group(1)), info.key))
    return sorted(found)


def write_gate_checkpoint(store: ArtifactStore, prefix: str, step: int, config_digest: str,
                          parts: Mapping[str, bytes]) -> str:
    """Write `parts` (file name -> bytes) as the checkpoint of `step`, its manifest last; its URI."""
    base = f"{prefix}/{CKPT_DIR}/ckpt-{step}"
    files = {}
    for name, data in parts.items():
        info = store.put_bytes(f"{base}/{name}", data)
        files[name] = {"sha256": info.sha256, "size": info.size}
    manifest = {"step": step, "config_digest": config_digest, "files": files}
    info = store.put_bytes(f"{base}/{CKPT_MANIFEST}", json.dumps(manifest, sort_keys=True).encode())
    return info.uri


def read_gate_checkpoint(store: ArtifactStore, manifest_key: str, config_digest: str) -> dict[str, bytes]:
    """The files (name -> bytes) of the checkpoint whose checkpoint.json is `manifest_key`, each
    checked against the manifest's sha256; refused when it was written under another config digest."""
    try:
        manifest = json.loads(store.get_bytes(manifest_key))
    except NotFound:
        raise NotFound(f"no gate checkpoint at {manifest_key}; list them with list_gate_checkpoints") from None
    if manifest.get("config_digest") != config_digest:
        raise FailedPrecondition(f"checkpoint {manifest_key} was written with another gate-training config; "
                                 "resume with the same config (max_steps and save_steps may change) or start "
                                 "under a new prefix")
    base = manifest_key.rsplit("/", 1)[0]
    data = {}
    for name, rec in manifest["files"].items():
        blob = store.get_bytes(f"{base}/{name}")
        if hashlib.sha256(blob).hexdigest() != rec["sha256"]:
            raise ArtifactCorrupted(f"{base}/{name} does not match the sha256 in its checkpoint manifest")
        data[name] = blob
    return data


def gates_file_bytes(model: ComposedMoEModel) -> bytes:
    """The bytes of `model`'s gates file (gates.safetensors), as a checkpoint stores it."""
    with tempfile.TemporaryDirectory(prefix="trace-gate-ckpt-") as tmp:
        return save_gates(model, Path(tmp) / GATES_FILE).read_bytes()


def gates_file_tensors(data: bytes) -> dict[str, torch.Tensor]:
    """The gate tensors of a gates file's bytes (`gates_file_bytes`' inverse)."""
    with tempfile.TemporaryDirectory(prefix="trace-gate-ckpt-") as tmp:
        path = Path(tmp) / GATES_FILE
        path.write_bytes(data)
        tensors, _meta = read_gates(path)
    return tensors
