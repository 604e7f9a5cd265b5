"""Experiment trackers of a training job (`config.report_to`, TRL's convention): its per-iteration
metrics as TensorBoard event files beside its checkpoints and, when asked, a Weights & Biases run.
Prometheus (services/trainer/metrics.py) stays what it is: the service's health, not training curves.

Where (`<prefix>` is the job's checkpoint prefix: `runs/<run>/adapters/<capability>` or `runs/<run>/moe/<name>`):
    <prefix>/tensorboard/events.out.tfevents.*             iterations; `tensorboard --logdir` this directory
    <prefix>/tensorboard/warm_start/events.out.tfevents.*  the gate job's warm-start steps (a second run in it)
    <prefix>/wandb/<run directory>/...                     the W&B run (`wandb sync` it), copied at the job's end
The job's result lists the newest event file of the logdir as output kind `tensorboard` (its directory is
the logdir) and the W&B run's `.wandb` file as kind `wandb`.

Names. An iteration's values are logged with the `train/` prefix transformers' TensorBoard and W&B
callbacks give TRL's metrics, under TRL GRPOTrainer's name where the quantity is the same
(`TRL_NAMES`, `TRL_DERIVED`), every other value under its own name:

    ours                                          logged as                       why it is the same
    reward_mean                                   train/reward                    mean reward of the iteration's batch
    reward_std                                    train/reward_std                sample std of those rewards (TRL: nanstd)
    1 - informative_group_fraction                train/frac_reward_zero_std      share of groups with one reward
    loss                                          train/loss                      the objective on the batch
    kl                                            train/kl                        k3 KL to the reference, token mean
    entropy                                       train/entropy                   token mean over assistant tokens
    clip_fraction                                 train/clip_ratio/region_mean    tokens whose clip is active
    grad_norm, learning_rate                      train/grad_norm, train/learning_rate
    prompt_tokens_total + completion_tokens_total train/num_tokens                tokens processed so far
    generated_tokens / episodes                   train/completions/mean_length   generated tokens per episode
    any other value v (pass_rate, episodes, guided_reward_mean, ...)   train/v
Where TRL differs in detail: its step is the optimizer step, ours the iteration (the gate job's
iteration 0 is its warm-start summary); kl, clip_ratio are token means under loss_type `dapo` (the
default; `grpo` weighs tokens per episode); under scale_rewards `batch` TRL's frac_reward_zero_std tests
the whole batch, ours always the groups; num_tokens counts every turn's full prompt (multi-turn), and not
the calibration episodes an initial batch trains on (initial_batches.py; counted where they were played).
The gate job's warm-start steps log `warm_start/loss` at their own step.

Resume. Every worker attempt writes its own event file. The first iteration an attempt logs is its
SummaryWriter's `purge_step`: TensorBoard hides what an earlier attempt logged at that step or later,
so a job resumed from a checkpoint shows each iteration once, as an uninterrupted job does. An
iteration a resumed job re-reports (`"replayed": true`) is not logged again.

Uploads. The event file is written in a scratch directory and copied into the artifact store (an
atomic, sha256-recorded put) after an iteration at most every `upload_interval_s`, and at the end; a
failed copy is logged and retried at the next one: once a job runs, tracking never fails it. The W&B run
directory is copied once, after `wandb.finish()`. (A file:// store keeps a `.sha256` sidecar beside each
event file; TensorBoard reads it as an empty event file, a DEBUG line in its log.)

TensorBoard is written with torch's `SummaryWriter` (the `tensorboard` package's event-file writer
underneath, as transformers' TensorBoardCallback uses), for its `purge_step`. W&B is the optional
`wandb` extra, imported only when `report_to` names it; its mode is the operator's (`wandb_mode`,
TRACE_TRAINER_WANDB_MODE, default `offline`: nothing leaves the worker).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trace_common.artifacts import ArtifactStore
from trace_common.errors import FailedPrecondition, TraceError

log = logging.getLogger(__name__)

#: report_to values (TRL's names; "none": no tracker).
REPORT_TO = ("none", "tensorboard", "wandb")
#: W&B modes the operator may choose (TRACE_TRAINER_WANDB_MODE; WANDB_MODE's values).
WANDB_MODES = ("offline", "online", "disabled")
TB_DIR = "tensorboard"
WARM_START_RUN = "warm_start"
WANDB_DIR = "wandb"
EVENT_FILE_PREFIX = "events.out.tfevents."
PREFIX = "train/"

#: Our iteration metric -> TRL GRPOTrainer's name for the same quantity (module docstring).
TRL_NAMES: dict[str, str] = {
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "loss": "loss",
    "kl": "kl",
    "entropy": "entropy",
    "clip_fraction": "clip_ratio/region_mean",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
}

#: TRL names computed from ours: name -> (our metrics it needs, the value; None: not logged).
TRL_DERIVED: dict[str, tuple[tuple[str, ...], Callable[..., float | None]]] = {
    "frac_reward_zero_std": (("informative_group_fraction",), lambda f: 1.0 - f),
    "num_tokens": (("prompt_tokens_total", "completion_tokens_total"), lambda p, c: p + c),
    "completions/mean_length": (("generated_tokens", "episodes"), lambda g, n: g / n if n else None),
}


def logged_values(values: Mapping[str, Any]) -> dict[str, float]:
    """An iteration's values under their logged names (module docstring's table).

    Semantics:
        out[PREFIX + TRL_NAMES.get(k, k)] = v          every numeric value but "iteration" (the step)
        out[PREFIX + d] = f(values[needs])             every TRL_DERIVED d whose inputs are all present
    """
    nums = {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "iteration"}
    out = {PREFIX + TRL_NAMES.get(k, k): v for k, v in nums.items()}
    for name, (needs, f) in TRL_DERIVED.items():
        if all(n in nums for n in needs):
            v = f(*(nums[n] for n in needs))
            if v is not None:
                out[PREFIX + name] = float(v)
    return out


def check_report_to(report_to: Sequence[str]) -> set[str]:
    """The trackers `report_to` asks for ("none" dropped); FailedPrecondition naming the field and what
    to install when one of them is not installed in this worker."""
    wanted = set(report_to) - {"none"}
    packages = {"tensorboard": ("tensorboard", "pip install tensorboard (a dependency of trace-agents)"),
                "wandb": ("wandb", "pip install 'trace-agents[wandb]' (the optional wandb extra)")}
    for tracker in sorted(wanted):
        module, install = packages[tracker]
        try:
            __import__(module)
        except ImportError:
            raise FailedPrecondition(
                f"config.report_to includes {tracker!r}, but the {module} package is not installed in the training "
                f"worker: {install} in the trainer's environment (image), or remove {tracker!r} from "
                "config.report_to") from None
    return wanted


class _TensorBoardRun:
    """One TensorBoard run: a local event file of this attempt, copied to `<key_dir>/<its name>`."""

    def __init__(self, store: ArtifactStore, key_dir: str, scratch: Path):
        self.store, self.key_dir, self.dir = store, key_dir, scratch
        self.writer: Any = None
        self.path: Path | None = None
        self.uri = ""

    def add(self, step: int, scalars: Mapping[str, float], text: Mapping[str, str] | None = None) -> None:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.dir.mkdir(parents=True, exist_ok=True)
            # purge_step: TensorBoard hides an earlier attempt's events from this step on (module docstring)
            self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=step)
            for tag, value in (text or {}).items():
                self.writer.add_text(tag, value, step)
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def upload(self) -> None:
        if self.writer is None:
            return
        self.writer.flush()
        files = sorted(self.dir.glob(EVENT_FILE_PREFIX + "*"))
        if not files:
            return
        self.path = files[-1]
        try:
            self.uri = self.store.put_file(f"{self.key_dir}/{self.path.name}", self.path).uri
        except (TraceError, OSError) as exc:
            log.warning("could not copy the TensorBoard event file to %s: %s (retried at the next upload)",
                        self.store.uri_for(self.key_dir), exc)

    def close(self) -> None:
        if self.writer is not None:
            self.upload()
            self.writer.close()
            self.writer = None


class Trackers:
    """The trackers `report_to` names for one job, fed with its events (`__call__` or `wrap`).

    `store`/`prefix`: where the event files and the W&B run go (module docstring); `name`, `group`,
    `config`: the W&B run's name (the capability), group (the run id) and config, and the text
    `args` of the TensorBoard run (transformers' name for the training arguments)."""

    def __init__(self, report_to: Sequence[str], store: ArtifactStore, prefix: str, *, name: str = "",
                 group: str = "", config: Mapping[str, Any] | None = None, wandb_mode: str = "offline",
                 upload_interval_s: float = 30.0):
        import json

        wanted = check_report_to(report_to)
        if wandb_mode not in WANDB_MODES:
            raise FailedPrecondition(f"wandb_mode {wandb_mode!r}: use one of {', '.join(WANDB_MODES)} "
                                     "(TRACE_TRAINER_WANDB_MODE)")
        self.store, self.prefix = store, prefix.rstrip("/")
        self.interval = upload_interval_s
        self.scratch = Path(tempfile.mkdtemp(prefix="trace-trackers-"))
        self._last_upload: float | None = None
        self._outputs: list[dict[str, Any]] | None = None
        self._args = {"args": json.dumps(dict(config or {}), sort_keys=True, indent=1)}
        self.tb: dict[str, _TensorBoardRun] = {}
        if "tensorboard" in wanted:
            self.tb = {run: _TensorBoardRun(store, f"{self.prefix}/{TB_DIR}" + (f"/{run}" if run else ""),
                                            self.scratch / TB_DIR / run)
                       for run in ("", WARM_START_RUN)}
        self.wandb: Any = None
        if "wandb" in wanted:
            self.wandb = _open_wandb(self.scratch / WANDB_DIR, name=name, group=group, config=config or {},
                                     mode=wandb_mode)

    @property
    def enabled(self) -> bool:
        return bool(self.tb) or self.wandb is not None

    def __call__(self, kind: str, payload: Mapping[str, Any]) -> None:
        """Log one job event: "iteration" (unless replayed) and "warm_start" ({step, loss})."""
        if self._outputs is not None:
            return
        if kind == "iteration" and not payload.get("replayed"):
            step = int(payload["iteration"])
            values = logged_values(payload.get("values") or {})
            if self.tb:
                self.tb[""].add(step, values, self._args)
            if self.wandb is not None:
                self.wandb.log({**values, PREFIX + "iteration": step})
            self._maybe_upload()
        elif kind == "warm_start" and isinstance(payload.get("loss"), int | float):
            step, loss = int(payload.get("step") or 0), float(payload["loss"])
            if self.tb:
                self.tb[WARM_START_RUN].add(step, {"warm_start/loss": loss})
            if self.wandb is not None:
                self.wandb.log({"warm_start/loss": loss, "warm_start/step": step})

    def _maybe_upload(self) -> None:
        now = time.monotonic()
        if self._last_upload is not None and now - self._last_upload < self.interval:
            return
        self._last_upload = now
        for run in self.tb.values():
            run.upload()

    def wrap(self, emit: Callable[[str, dict[str, Any]], None]) -> Callable[[str, dict[str, Any]], None]:
        """`emit` with every event logged first; a `result` event leaves with the trackers closed and their
        outputs added to its `outputs`, an `error` event with them closed (what was logged is kept)."""
        def wrapped(kind: str, payload: dict[str, Any]) -> None:
            self(kind, payload)
            if kind == "result":
                payload = dict(payload, outputs=[*payload.get("outputs", []), *self.close()])
            elif kind == "error":
                self.close()
            emit(kind, payload)
        return wrapped

    def close(self) -> list[dict[str, Any]]:
        """Finish every tracker, copy what is left into the store, remove the scratch directory; the
        outputs ({"uri", "sha256", "size", "kind"}) the job's result lists. Idempotent."""
        if self._outputs is not None:
            return self._outputs
        outputs: list[dict[str, Any]] = []
        try:
            for run in self.tb.values():
                run.close()
            if self.tb:
                newest = self._newest_event_file()
                if newest is not None:
                    outputs.append({"uri": newest.uri, "sha256": newest.sha256, "size": newest.size,
                                    "kind": "tensorboard"})
            if self.wandb is not None:
                outputs += self._close_wandb()
        finally:
            self._outputs = outputs
            shutil.rmtree(self.scratch, ignore_errors=True)
        return outputs

    def _newest_event_file(self) -> Any:
        """The newest event file directly in the logdir (this attempt's, or an earlier one's when this
        attempt logged nothing: a resumed job with nothing left to run)."""
        root = f"{self.prefix}/{TB_DIR}/"
        try:
            found = [i for i in self.store.list(root)
                     if "/" not in i.key[len(root):] and i.key[len(root):].startswith(EVENT_FILE_PREFIX)
                     and not i.corruption]   # an output names its digest: one without is none to hand out
        except TraceError as exc:
            log.warning("could not list the TensorBoard event files under %s: %s", root, exc)
            return None
        mine = self.tb[""].path.name if self.tb[""].path is not None else None
        chosen = [i for i in found if i.key.rsplit("/", 1)[1] == mine] or found
        return chosen[-1] if chosen else None

    def _close_wandb(self) -> list[dict[str, Any]]:
        run, self.wandb = self.wandb, None
        run_dir, sync_file = Path(str(run.settings.sync_dir)), Path(str(run.settings.sync_file))
        run.finish()
        if not run_dir.is_dir():   # mode "disabled": nothing was written
            return []
        out: list[dict[str, Any]] = []
        base = f"{self.prefix}/{WANDB_DIR}/{run_dir.name}"
        try:
            for path in sorted(run_dir.rglob("*")):
                if path.is_symlink() or not path.is_file():
                    continue
                info = self.store.put_file(f"{base}/{path.relative_to(run_dir).as_posix()}", path)
                if path == sync_file:
                    out.append({"uri": info.uri, "sha256": info.sha256, "size": info.size, "kind": "wandb"})
        except (TraceError, OSError) as exc:
            log.warning("could not copy the W&B run directory to %s: %s", self.store.uri_for(base), exc)
            return []
        return out


def _open_wandb(directory: Path, *, name: str, group: str, config: Mapping[str, Any], mode: str) -> Any:
    """A W&B run in `mode` (the operator's; WANDB_MODE is set to it too, so nothing in the worker's
    environment overrides it), with the iteration and the warm-start step as its step metrics."""
    import wandb

    os.environ["WANDB_MODE"] = mode
    directory.mkdir(parents=True, exist_ok=True)
    try:
        # console="off": the worker's stdout is its event channel (jobspec.py), not a log to capture
        run = wandb.init(dir=str(directory), mode=mode, project=os.environ.get("WANDB_PROJECT") or "trace",
                         name=name or None, group=group or None, config=dict(config),
                         settings=wandb.Settings(console="off"))
    except Exception as exc:  # noqa: BLE001 - wandb raises its own error types; the job fails with the reason
        raise FailedPrecondition(f"config.report_to includes 'wandb', but wandb.init (mode {mode!r}, "
                                 f"TRACE_TRAINER_WANDB_MODE) failed: {type(exc).__name__}: {exc}; use mode "
                                 "offline, or remove 'wandb' from config.report_to") from None
    run.define_metric(PREFIX + "iteration")
    run.define_metric(PREFIX + "*", step_metric=PREFIX + "iteration")
    run.define_metric("warm_start/step")
    run.define_metric("warm_start/*", step_metric="warm_start/step")
    return run


__all__ = ["PREFIX", "REPORT_TO", "TB_DIR", "TRL_DERIVED", "TRL_NAMES", "WANDB_MODES", "WARM_START_RUN", "Trackers",
           "check_report_to", "logged_values"]
