"""A training job's process: GRPO for one capability (or, for TRAINING_KIND_GATES, the MoE gates:
gates/job.py), reporting events (jobspec.py).

Launch (what the executors run):
    python -m services.trainer.worker --spec-file spec.json                     # local child process
    torchrun --nproc_per_node=<gpus> -m services.trainer.worker                 # Kubernetes Job pod
        (spec JSON in TRACE_TRAINER_JOB_SPEC; S3 secret in TRACE_TRAINER_S3_SECRET_KEY)

With WORLD_SIZE > 1 (torchrun) every rank plays its share of the groups and gradients are
summed across ranks (services.trainer.grpo.distributed); only rank 0 writes checkpoints, the
adapter and events. SIGTERM asks for a stop after the current iteration: the worker then
writes a checkpoint and exits, so a cancelled or preempted job can resume. The process
exits 0 after a `result` event and 1 after an `error` event.

Rank 0 also feeds every event to the job's experiment trackers (`config.report_to`,
grpo/trackers.py): TensorBoard event files beside the checkpoints and, when asked, a W&B run in
the operator's `wandb_mode`; the `result` event then lists them among its outputs (kinds
`tensorboard`, `wandb`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trace_common.errors import FailedPrecondition, TraceError
from trace_common.malloc import limit_arenas_or_exit

from .jobspec import EVENT_PREFIX, SPEC_ENV, WorkerSpec, adapter_lineage, encode_event, worker_model_roots
from .jobspec import env_factory as resolve_env

log = logging.getLogger("trace.trainer.worker")


class EventSink:
    """Events to stdout (local executor) and, when `events_key` is set, to the artifact store
    (the last `keep_iterations` iteration events, the latest `phase` event, and every other event;
    rewritten at most every `min_interval_s` for iterations and phases, always for the others)."""

    def __init__(self, store: Any = None, key: str = "", enabled: bool = True, keep_iterations: int = 200,
                 min_interval_s: float = 2.0):
        self.store, self.key, self.enabled = store, key, enabled
        self.keep, self.min_interval = keep_iterations, min_interval_s
        self.events: list[dict[str, Any]] = []
        self._last_write: float | None = None  # the first write always goes through
        self._lock = threading.Lock()

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self._lock:
            line = encode_event(kind, payload)
            sys.stdout.write(EVENT_PREFIX + line + "\n")
            sys.stdout.flush()
            if not (self.store is not None and self.key):
                return
            if kind == "phase":  # only the current phase matters to a reader
                self.events = [e for e in self.events if e["event"] != "phase"]
            self.events.append(json.loads(line))
            its = [e for e in self.events if e["event"] == "iteration"]
            if len(its) > self.keep:
                drop = {id(e) for e in its[: len(its) - self.keep]}
                self.events = [e for e in self.events if id(e) not in drop]
            now = time.monotonic()
            if (kind in ("iteration", "phase") and self._last_write is not None
                    and now - self._last_write < self.min_interval):
                return
            self._flush()
            self._last_write = now

    def _flush(self) -> None:
        data = "".join(json.dumps(e, sort_keys=True) + "\n" for e in self.events).encode()
        try:
            self.store.put_bytes(self.key, data)
        except TraceError as exc:  # progress reporting must not kill training; checkpoints will fail loudly
            log.warning("could not write events to %s: %s", self.key, exc)


def load_spec(args: argparse.Namespace) -> WorkerSpec:
    if args.spec_file:
        return WorkerSpec.model_validate_json(Path(args.spec_file).read_text())
    raw = os.environ.get(SPEC_ENV)
    if not raw:
        raise FailedPrecondition(f"no job spec: pass --spec-file or set {SPEC_ENV}")
    return WorkerSpec.model_validate_json(raw)


def built_in_key(model: str) -> str:
    """The cache key of a built-in base agent (`micro`, `smollm2`) under this code: part of the job's
    identity its checkpoints record, since a rebuilt agent keeps its name. "" for any other model."""
    from trace_common.agents.resolve import CONFIGS, base_agent_key

    return (base_agent_key(model) or "") if model in CONFIGS else ""


def run(spec: WorkerSpec, sink_factory=EventSink) -> int:
    import torch
    from pydantic import SecretStr

    from services.trainer.grpo.config import GRPOConfig, parse_config
    from services.trainer.grpo.distributed import Dist
    from services.trainer.grpo.models import load_base
    from services.trainer.grpo.session import make_trainer
    from services.trainer.grpo.trackers import Trackers
    from services.trainer.grpo.trainer import seed_everything
    from trace_common.artifacts import S3Settings, open_store

    dist = Dist()
    sink = sink_factory(enabled=False)
    emit = sink.emit
    trackers: Trackers | None = None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        dist.init()
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        s3 = None
        if spec.artifact_root.startswith("s3://"):
            s3 = S3Settings(endpoint=spec.s3_endpoint or "", access_key=spec.s3_access_key or "",
                            secret_key=SecretStr(os.environ.get("TRACE_TRAINER_S3_SECRET_KEY", "")),
                            region=spec.s3_region, secure=spec.s3_secure)
        store = open_store(spec.artifact_root, s3)
        sink = sink_factory(store=store, key=spec.events_key, enabled=dist.is_main)
        emit = sink.emit
        for module in spec.env_modules:
            importlib.import_module(module)
        gates = spec.kind == "TRAINING_KIND_GATES"
        if gates:
            from .gates.config import GateGRPOConfig
        config = parse_config(spec.config, GateGRPOConfig if gates else GRPOConfig)
        if dist.is_main:
            trackers = Trackers(config.report_to, store, spec.prefix, name=spec.capability, group=spec.run_id,
                                config=config.model_dump(mode="json"), wandb_mode=spec.wandb_mode)
            emit = trackers.wrap(sink.emit)
        if gates:
            from .gates.job import run_gates

            if dist.world > 1:
                raise FailedPrecondition("gate training runs in one process; start it without torchrun")
            return run_gates(spec, store, s3=s3, emit=emit, should_stop=stop.is_set,
                             cache=Path(spec.cache_dir or tempfile.gettempdir()) / "trace-models", device=dist.device)
        seed_everything(config.seed)
        env_factory = resolve_env(spec.environment, spec.environment_target)

        cache = Path(spec.cache_dir or tempfile.gettempdir()) / "trace-models"
        device = dist.device
        base, tokenizer, label = load_base(spec.policy["model"], adapter_ref=spec.policy.get("adapter_uri", ""),
                                           cache_dir=cache, s3=s3, dtype=config.dtype, device=device,
                                           allowed=worker_model_roots(spec))
        trainer = make_trainer(config, base, tokenizer, env_factory, store=store, prefix=spec.prefix,
                               capability=spec.capability, on_event=emit, should_stop=stop.is_set, dist=dist,
                               model_label=label, lineage=adapter_lineage(spec.prefix),
                               policy_model=spec.policy["model"], policy_adapter=spec.policy.get("adapter_uri", ""),
                               environment=(spec.environment.get("name", ""), spec.environment.get("version", "")),
                               environment_params=spec.environment.get("params") or {},
                               model_key=built_in_key(spec.policy["model"]))
        result = trainer.train(resume=spec.resume_from or True, write_adapter=False)
        if stop.is_set() and result.stop_reason == "stop requested":
            emit("error", {"code": "CANCELLED", "message": f"stopped on request after iteration "
                           f"{result.iterations}; the last checkpoint is kept for resuming"})
            return 1
        if result.stopped_early and result.policy_version == 0:
            raise FailedPrecondition(result.stop_reason + "; no adapter was written (the policy never changed)")
        if dist.is_main:
            trainer.write_final_adapter(result)
        emit("result", {"iterations": result.iterations, "policy_version": result.policy_version,
                        "stop_reason": result.stop_reason, "adapter_uri": result.adapter_uri,
                        "outputs": result.outputs})
        return 0
    except TraceError as exc:
        log.error("training failed: %s", exc.reason)
        emit("error", {"code": exc.code, "message": exc.reason})
        return 1
    except Exception as exc:  # noqa: BLE001 - reported as the job's failure reason
        log.exception("training crashed")
        emit("error", {"code": "INTERNAL", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        if trackers is not None:
            trackers.close()   # idempotent: a result or error event closed them already
        dist.close()


def _stop_with_parent() -> None:
    """Linux: get SIGTERM when the process that started this worker dies (the trainer service,
    or torchrun in a Job pod), so a killed service leaves no orphan writing checkpoints; the
    SIGTERM handler then stops after the current iteration with a checkpoint, as on cancel."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    _stop_with_parent()
    limit_arenas_or_exit("training worker")  # before torch's and the generation backend's threads
    parser = argparse.ArgumentParser(prog="python -m services.trainer.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--spec-file", default="", help=f"job spec JSON (default: ${SPEC_ENV})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("TRACE_TRAINER_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = load_spec(args)
    except (TraceError, ValueError) as exc:
        sys.stdout.write(EVENT_PREFIX + encode_event("error", {"code": "INVALID_ARGUMENT",
                                                               "message": f"bad job spec: {exc}"}) + "\n")
        return 1
    return run(spec)


if __name__ == "__main__":
    sys.exit(main())
