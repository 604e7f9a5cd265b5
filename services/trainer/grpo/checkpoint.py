"""Checkpoints in the artifact store: adapter + optimizer + scheduler + RNG states + iteration +
seed cursor, so a killed job resumes exactly where the last checkpoint left it.

Layout (docs/design.md "Data contracts"), under `runs/<run_id>/adapters/<cap>/`:
    ckpt-<iteration>/adapter_model.safetensors   LoRA weights (PEFT key names)
    ckpt-<iteration>/adapter_config.json         PEFT config
    ckpt-<iteration>/optimizer.pt                optimizer + LR scheduler state (torch, weights_only)
    ckpt-<iteration>/rng.pt                      torch CPU (and CUDA) generator states
    ckpt-<iteration>/trainer_state.json          iteration, seed cursor, Python/NumPy RNG, history
    ckpt-<iteration>/checkpoint.json             written LAST: every file's sha256 and size

Weights other than a LoRA adapter (e.g. the gates of an MoE composition, `trainable.py`) go under
their own file names (`weights_file`, `config_file`), which the manifest records so loading finds them.

Which iterations get one (`checkpoint_due`): every `save_steps`-th, those `checkpoint_at` lists
(the points of a budget curve), and the last.

Each object is written atomically with its sha256 by the store; a checkpoint exists only once
its `checkpoint.json` does, and loading re-checks every listed file's recorded digest (the
store verifies the bytes on read). A job that dies while writing leaves an incomplete
directory that `latest` skips, so the previous checkpoint stays the one resumed from. Saving
over an existing `ckpt-<iteration>/` (e.g. a stale one of another lineage: another config,
model or environment) removes its `checkpoint.json` first, so a job killed mid-overwrite never
leaves a "complete" checkpoint whose files come from two lineages.

Whose checkpoint it is: the manifest (and trainer_state.json) record the config's resume digest
and the job's identity (`job_identity`: the model label, a built-in agent's cache key, the policy
reference, and the environment's name, version and a digest of its params). A job continues only a checkpoint of
its own lineage (trainer.py `resume`); `read_record` reads both without loading any tensor.
Checkpoints written before identities were recorded have none; their trainer_state.json's
`model` (the model label) is all they say about the job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trace_common.artifacts import ArtifactStore
from trace_common.errors import ArtifactCorrupted, NotFound

from .lora import torch_bytes, torch_load_bytes

log = logging.getLogger(__name__)

MANIFEST = "checkpoint.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_CKPT_RE = re.compile(r"/ckpt-(\d+)/checkpoint\.json$")


def model_label(model: str, adapter: str = "") -> str:
    """The label a job's checkpoints record for the model it trains: its PolicyRef's model, with the
    merged adapter after a '+' (`models.load_base`)."""
    return f"{model}+{adapter}" if adapter else model


def job_identity(*, model_label: str, policy_model: str = "", policy_adapter: str = "",
                 environment: tuple[str, str] | None = None,
                 environment_params: Mapping[str, Any] | None = None, model_key: str = "") -> dict[str, str]:
    """What a checkpoint was trained for, beyond its config (recorded in it; module docstring): the model
    label, the job's PolicyRef (model, default the label; adapter), the built-in base agent's cache key
    (`model_key`: a rebuilt `micro` keeps its name and gets another key), and the environment's (name,
    version) and the sha256 of its params (canonical JSON)."""
    name, version = environment or ("", "")
    params = json.dumps(dict(environment_params or {}), sort_keys=True, separators=(",", ":"), default=str)
    return {"model": model_label, "policy_model": policy_model or model_label, "policy_adapter": policy_adapter,
            "model_key": model_key,
            "environment": name, "environment_version": version,
            "environment_params_sha256": hashlib.sha256(params.encode()).hexdigest()}


@dataclass
class TrainerState:
    """The loop's own state besides model/optimiser tensors."""

    iteration: int = 0                 # iterations completed
    seed_cursor: int = 0               # seeds drawn from the schedule so far
    policy_version: int = 0            # optimiser steps taken
    uninformative_streak: int = 0      # consecutive iterations without an informative group
    history: list[dict[str, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "seed_cursor": self.seed_cursor, "policy_version": self.policy_version,
                "uninformative_streak": self.uninformative_streak, "history": self.history}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrainerState:
        return cls(iteration=int(d["iteration"]), seed_cursor=int(d["seed_cursor"]),
                   policy_version=int(d.get("policy_version", 0)),
                   uninformative_streak=int(d.get("uninformative_streak", 0)), history=list(d.get("history", [])))


@dataclass(frozen=True)
class CheckpointInfo:
    iteration: int
    key: str          # key of checkpoint.json
    uri: str
    sha256: str
    size: int

    @property
    def prefix(self) -> str:
        return self.key.rsplit("/", 1)[0]


def python_numpy_rng() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def restore_python_numpy_rng(d: dict[str, Any]) -> None:
    version, internal, gauss = d["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = d["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def torch_rng() -> dict[str, Any]:
    out: dict[str, Any] = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_torch_rng(d: dict[str, Any]) -> None:
    torch.random.set_rng_state(d["cpu"])
    if "cuda" in d and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(d["cuda"])


def save_checkpoint(store: ArtifactStore, prefix: str, *, state: TrainerState, adapter: bytes,
                    adapter_config: bytes, optimizer: dict[str, Any], scheduler: dict[str, Any],
                    config_digest: str, extra: dict[str, Any] | None = None,
                    weights_file: str = WEIGHTS_FILE, config_file: str = "adapter_config.json",
                    identity: dict[str, str] | None = None) -> CheckpointInfo:
    """Write one checkpoint under `<prefix>/ckpt-<iteration>/` (module docstring): an existing one's
    manifest is removed first, the new manifest is written last. `identity`: `job_identity`'s."""
    base = f"{prefix}/ckpt-{state.iteration}"
    if store.exists(f"{base}/{MANIFEST}"):
        log.info("replacing the checkpoint at %s: its manifest goes first, so no mix of the two is ever "
                 "complete", store.uri_for(base))
        store.delete(f"{base}/{MANIFEST}")
    if identity is not None:
        extra = dict(extra or {}, identity=identity)
    trainer_state = dict(state.to_json(), rng=python_numpy_rng(), config_digest=config_digest, **(extra or {}))
    parts = {
        weights_file: adapter,
        config_file: adapter_config,
        "optimizer.pt": torch_bytes({"optimizer": optimizer, "scheduler": scheduler}),
        "rng.pt": torch_bytes(torch_rng()),
        "trainer_state.json": json.dumps(trainer_state, sort_keys=True).encode(),
    }
    files = {}
    for name, data in parts.items():
        info = store.put_bytes(f"{base}/{name}", data)
        files[name] = {"sha256": info.sha256, "size": info.size}
    manifest: dict[str, Any] = {"iteration": state.iteration, "seed_cursor": state.seed_cursor,
                                "config_digest": config_digest, "files": files}
    if identity is not None:
        manifest["identity"] = identity
    if weights_file != WEIGHTS_FILE:
        manifest["weights_file"] = weights_file
    info = store.put_bytes(f"{base}/{MANIFEST}", json.dumps(manifest, sort_keys=True, indent=1).encode())
    return CheckpointInfo(iteration=state.iteration, key=info.key, uri=info.uri, sha256=info.sha256, size=info.size)


def checkpoint_due(iteration: int, save_steps: int, checkpoint_at: Collection[int] = ()) -> bool:
    """Whether the loop checkpoints after `iteration` (the last iteration is always checkpointed
    by the loop itself, whatever this says).

    Semantics:
        due <=> (save_steps > 0 and iteration % save_steps == 0) or iteration in checkpoint_at
    """
    return (save_steps > 0 and iteration % save_steps == 0) or iteration in checkpoint_at


def list_checkpoints(store: ArtifactStore, prefix: str) -> list[CheckpointInfo]:
    """Complete checkpoints (manifest present, with its digest recorded) under `prefix`, oldest first. A
    manifest the listing flags (no valid digest: copied in by hand, or damaged) is left out with a
    warning: resuming from it would fail, the one before it serves."""
    out = []
    for info in store.list(f"{prefix}/ckpt-"):
        m = _CKPT_RE.search("/" + info.key)
        if m and info.corruption:
            log.warning("checkpoint %s left out: %s", info.uri, info.corruption)
        elif m:
            out.append(CheckpointInfo(iteration=int(m.group(1)), key=info.key, uri=info.uri, sha256=info.sha256,
                                      size=info.size))
    return sorted(out, key=lambda c: c.iteration)


def latest_checkpoint(store: ArtifactStore, prefix: str,
                      accept: Callable[[CheckpointInfo], bool] | None = None) -> CheckpointInfo | None:
    """The complete checkpoint of the highest iteration under `prefix` that `accept` takes (default:
    any), newest first; None when there is none."""
    for found in reversed(list_checkpoints(store, prefix)):
        if accept is None or accept(found):
            return found
    return None


def manifest_key_of(key: str) -> str:
    """The key of a checkpoint's `checkpoint.json`, given it or the checkpoint's directory."""
    return key if key.endswith(f"/{MANIFEST}") else f"{key.rstrip('/')}/{MANIFEST}"


def _read_manifest(store: ArtifactStore, manifest_key: str) -> dict[str, Any]:
    try:
        manifest = json.loads(store.get_bytes(manifest_key))
    except NotFound:
        raise NotFound(f"no complete checkpoint at {store.uri_for(manifest_key)} (its checkpoint.json is missing); "
                       "list the job's checkpoints to pick one") from None
    except json.JSONDecodeError as exc:
        raise ArtifactCorrupted(f"{manifest_key} is not JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ArtifactCorrupted(f"{manifest_key} is not a checkpoint manifest (a JSON object)")
    return manifest


@dataclass(frozen=True)
class CheckpointRecord:
    """Whose a checkpoint is (module docstring), read without loading its tensors."""

    config_digest: str                      # "" when none was recorded
    identity: dict[str, str] | None         # `job_identity`'s; None: written before identities were recorded
    model: str | None                       # the model label recorded (None: none)


def read_record(store: ArtifactStore, manifest_key: str) -> CheckpointRecord:
    """The config digest and job identity a checkpoint recorded: its manifest's, and for a checkpoint
    written before identities were recorded, the model label of its trainer_state.json."""
    manifest_key = manifest_key_of(manifest_key)
    manifest = _read_manifest(store, manifest_key)
    digest = str(manifest.get("config_digest") or "")
    identity = manifest.get("identity")
    if isinstance(identity, dict):
        model = identity.get("model")
        return CheckpointRecord(digest, {str(k): str(v) for k, v in identity.items()},
                                None if model is None else str(model))
    base = manifest_key.rsplit("/", 1)[0]
    try:
        state = json.loads(store.get_bytes(f"{base}/trainer_state.json"))
    except NotFound:
        raise ArtifactCorrupted(f"checkpoint {base} lacks trainer_state.json") from None
    except json.JSONDecodeError as exc:
        raise ArtifactCorrupted(f"{base}/trainer_state.json is not JSON: {exc}") from exc
    model = state.get("model") if isinstance(state, dict) else None
    return CheckpointRecord(digest, None, None if model is None else str(model))


@dataclass
class LoadedCheckpoint:
    state: TrainerState
    adapter: bytes                     # the trained weights' bytes (a LoRA adapter unless weights_file says otherwise)
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng_python_numpy: dict[str, Any]
    rng_torch: dict[str, Any]
    config_digest: str


def load_checkpoint(store: ArtifactStore, manifest_key: str) -> LoadedCheckpoint:
    """Read and verify a checkpoint by the key of its `checkpoint.json`."""
    manifest_key = manifest_key_of(manifest_key)
    base = manifest_key.rsplit("/", 1)[0]
    manifest = _read_manifest(store, manifest_key)
    data: dict[str, bytes] = {}
    for name, rec in manifest.get("files", {}).items():
        blob = store.get_bytes(f"{base}/{name}")
        stat = store.stat(f"{base}/{name}")
        if stat.sha256 != rec["sha256"]:
            raise ArtifactCorrupted(f"{base}/{name} changed after the checkpoint was written (sha256 "
                                    f"{stat.sha256[:12]} != {rec['sha256'][:12]})")
        data[name] = blob
    weights_file = str(manifest.get("weights_file", WEIGHTS_FILE))
    missing = {weights_file, "optimizer.pt", "rng.pt", "trainer_state.json"} - set(data)
    if missing:
        raise ArtifactCorrupted(f"checkpoint {base} lacks {sorted(missing)}")
    ts = json.loads(data["trainer_state.json"])
    opt = torch_load_bytes(data["optimizer.pt"])
    return LoadedCheckpoint(state=TrainerState.from_json(ts), adapter=data[weights_file],
                            optimizer=opt["optimizer"], scheduler=opt["scheduler"], rng_python_numpy=ts["rng"],
                            rng_torch=torch_load_bytes(data["rng.pt"]), config_digest=ts.get("config_digest", ""))
