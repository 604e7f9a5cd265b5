"""Shipped base-agent artifacts: a built agent kept in the repository, so a fresh clone does not
spend a quarter of an hour on the warm start before its first result.

    trace_common/agents/shipped/<kind>/
        config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json, ...
        build_record.json

`build_record.json` says what the files are and how they were made:

* `key` -- the cache key (`cache.config_hash`) of the build: kind, BUILD_VERSION, config and
  provenance (`provenance`: the training data's digest and one digest per build-code file);
* `files` -- sha256 and size of every other file; loading verifies each one;
* `examples_digest`, `loss_trace` (the loss of every optimizer step), the build's metrics
  (held-out teacher-forced accuracy, a greedy pass-rate probe on test tasks), wall time, and
  the library versions and CPU it ran on.

`cached_build` installs the artifact (verified copy into the cache) when the current code and
config produce its key, and builds otherwise, saying which digest differs. Where an artifact
lives, reading its record, verifying and installing its files are `shipped_files.py` (what the
cache needs, without this module's dependence on the builders); this module makes artifacts
(`build_fresh`, `write_artifact`) and checks them. `check` (the CI test
and `tracectl agents verify`) re-derives everything from the current code: file digests, data and
code digests, and a replay of the build's first `steps` optimizer steps whose losses must equal
the recorded ones within `LOSS_TOLERANCE`. Any mismatch names the command that rebuilds it
(`REBUILD_COMMAND`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_common.agents.cache import META_NAME, config_hash
from trace_common.agents.micro import build_micro
from trace_common.agents.progress import BuildProgress
from trace_common.agents.provenance import digest_differences
from trace_common.agents.resolve import CONFIGS, provenance_of, resolve_base_agent
from trace_common.agents.shipped_files import (
    REBUILD_COMMAND,
    RECORD_FORMAT,
    RECORD_NAME,
    read_record,
    sha256_file,
    shipped_dir,
    verify_files,
)
from trace_common.errors import FailedPrecondition, NotFound

#: Replayed losses must satisfy |replayed - recorded| <= abs + rel * |recorded| at every step.
#: Measured here: replays on this machine match the record exactly with the same thread count;
#: 1 thread against 2 differ by at most ~1e-6 over the first 30 steps (summation order in the kernels).
LOSS_TOLERANCE = {"abs": 1e-4, "rel": 1e-4}


def write_artifact(model_dir: Path, meta: dict[str, Any], dest: Path) -> dict[str, Any]:
    """Make `dest` a shipped artifact of the cache entry `model_dir` (its record `meta`, from
    `cache.read_meta`): the model files plus `build_record.json`. Replaces `dest` atomically."""
    metrics = dict(meta.get("metrics") or {})
    files = sorted(p.name for p in model_dir.iterdir() if p.is_file() and p.name != META_NAME)
    tmp = dest.with_name(f".{dest.name}.writing-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in files:
        shutil.copyfile(model_dir / name, tmp / name)
    record = {
        "format": RECORD_FORMAT, "kind": meta["kind"], "key": meta["hash"], "build_version": meta["build_version"],
        "config": meta["config"], "provenance": meta.get("provenance"),
        "files": {name: {"sha256": sha256_file(tmp / name), "size": (tmp / name).stat().st_size} for name in files},
        "examples_digest": metrics.pop("examples_digest", None), "loss_trace": metrics.pop("loss_trace", None),
        "metrics": metrics, "build_seconds": meta.get("build_seconds"), "built_at": meta.get("built_at"),
        "environment": build_environment(), "rebuild": REBUILD_COMMAND.get(meta["kind"]),
    }
    (tmp / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    return record


def build_fresh(kind: str, cache_dir: Path, progress: BuildProgress | None = None) -> Path:
    """Build `kind` with its default config into `cache_dir` from the current code (never
    installing the shipped artifact): what `tracectl agents ship` writes out."""
    return resolve_base_agent(kind, cache_dir, progress=progress, use_shipped=False)


def build_environment() -> dict[str, Any]:
    import tokenizers
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "machine": platform.machine(), "cpu": _cpu_name(),
            "torch_threads": torch.get_num_threads()}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def check(kind: str, *, artifact: Path | None = None, steps: int = 20, require_default: bool = True,
          log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Re-derive the shipped artifact of `kind` from the current code (see the module docstring):
    files, config (today's default unless `require_default=False`), data and code digests, examples
    digest, and the first `steps` losses. Raises FailedPrecondition (or ArtifactCorrupted for bad
    files, NotFound for none) naming what differs and the rebuild command; returns what was compared."""
    artifact = artifact or shipped_dir(kind)
    fix = f"rebuild it with: {REBUILD_COMMAND.get(kind, 'tracectl agents ship ' + kind)}"
    record = read_record(artifact)
    if record is None:
        raise NotFound(f"no shipped {kind} artifact ({artifact / RECORD_NAME} is missing); {fix}")
    if record.get("format") != RECORD_FORMAT:
        raise FailedPrecondition(f"{artifact / RECORD_NAME} has format {record.get('format')}, this code reads "
                                 f"{RECORD_FORMAT}; {fix}")
    say = log or (lambda _s: None)
    verify_files(artifact, record)
    say(f"files: {len(record['files'])} match their sha256")
    config, provenance, trajectories = current_inputs(kind, record, cache_dir=None)  # fresh, never the memo
    if require_default and config != CONFIGS[kind]():
        raise FailedPrecondition(f"the shipped {kind} artifact was built from a config other than today's default "
                                 f"{CONFIGS[kind].__name__}() (what resolve_base_agent({kind!r}) builds), so it is "
                                 f"never used; {fix}")
    key = config_hash(kind, config, provenance)
    if key != record["key"]:
        diffs = digest_differences(record.get("provenance") or {}, provenance) or ["another build version"]
        raise FailedPrecondition(f"the shipped {kind} artifact ({artifact}) was built from {'; '.join(diffs)} "
                                 f"than the current code produces (key {record['key']} vs {key}); {fix}")
    say(f"key {key}: config, data digest and {len(provenance['code'])} code digests match")
    replay = replay_losses(kind, config, steps, trajectories)
    if replay["examples_digest"] != record.get("examples_digest"):
        raise FailedPrecondition(f"the shipped {kind} artifact's tokenized training examples differ from what the "
                                 f"current code makes (tokenizer training or loss masks changed); {fix}")
    recorded = (record.get("loss_trace") or [])[:steps]
    if len(recorded) < steps:
        raise FailedPrecondition(f"the build record holds {len(recorded)} losses, fewer than the {steps} replayed; {fix}")
    worst = max(abs(a - b) - LOSS_TOLERANCE["rel"] * abs(b) for a, b in zip(replay["losses"], recorded, strict=True))
    if worst > LOSS_TOLERANCE["abs"]:
        rows = [f"step {i + 1}: replayed {a:.6f} recorded {b:.6f}"
                for i, (a, b) in enumerate(zip(replay["losses"], recorded, strict=True))
                if abs(a - b) > LOSS_TOLERANCE["abs"] + LOSS_TOLERANCE["rel"] * abs(b)]
        raise FailedPrecondition(f"replaying the first {steps} steps of the {kind} build does not reproduce the "
                                 f"recorded losses ({len(rows)} steps off, first: {rows[0]}; tolerance "
                                 f"{LOSS_TOLERANCE}); {fix}")
    say(f"replay: the first {steps} losses match the record (largest excess over tolerance {worst:.2e})")
    return {"key": key, "files": len(record["files"]), "steps": steps, "losses": replay["losses"],
            "recorded": recorded, "seconds": replay["seconds"]}


def current_inputs(kind: str, record: dict[str, Any], cache_dir: Path | None) -> tuple[Any, dict[str, Any], Any]:
    """(the config the record names, validated by today's model; the provenance of that config under
    the current code; the expert trajectories played to digest the data, None when memoised)."""
    config = CONFIGS[kind].model_validate(record["config"])
    provenance, trajectories = provenance_of(kind, config, cache_dir)
    return config, provenance, trajectories


def replay_losses(kind: str, config: Any, steps: int, trajectories: Any = None) -> dict[str, Any]:
    """The first `steps` losses of a fresh build of `config` (nothing saved)."""
    import tempfile


    if kind != "micro":
        raise FailedPrecondition(f"no replay for base agent {kind!r}; only micro is shipped")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = build_micro(config, Path(tmp), stop_after=steps, probe_episodes=0, trajectories=trajectories)
    return {"losses": out["loss_trace"], "examples_digest": out["examples_digest"],
            "seconds": time.perf_counter() - started}
