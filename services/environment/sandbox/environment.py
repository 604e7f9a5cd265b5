"""`SandboxEnvironment`: an `Environment` whose code runs in a sandbox worker.

The validation, calibration and episode-serving code drive candidate environments through
this class, so they use the SDK's episode loop (`run_episode`, `run_episode_async`)
unchanged while every line of environment code executes in the worker process. Several
instances may share one worker (each has its own `instance` key there); calls on one
worker are serialised by the worker's lock.

Reward, breakdown, failure reason and diagnostics come from one `result` round trip,
cached until the next step.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from trace_common.env import Action, Environment, Message, Observation, StepResult, Termination
from trace_common.errors import FailedPrecondition

from .parent import SandboxWorker

_ids = itertools.count()


def decode_splits(data: dict[str, Any]) -> dict[str, Sequence[int]]:
    """Inverse of the worker's split encoding ({"range": [start, stop, step]} or a list)."""
    out: dict[str, Sequence[int]] = {}
    for name, value in data.items():
        if isinstance(value, dict) and "range" in value:
            out[name] = range(*value["range"])
        else:
            out[name] = [int(s) for s in value]
    return out


class LoadedModule:
    """What `load` told about a module in a worker (shared by the instances on it)."""

    def __init__(self, info: dict[str, Any]):
        self.info = info
        self.name: str = str(info.get("name") or "")
        self.version: str = str(info.get("version") or "")
        self.tool_schemas: list[dict[str, Any]] = list(info.get("tool_schemas") or [])
        self.splits: dict[str, Sequence[int]] = decode_splits(info.get("splits") or {})
        self.default_max_turns: int = int(info.get("default_max_turns") or 20)
        self.has_solve: bool = bool(info.get("has_solve"))
        self.has_solve_unskilled: bool = bool(info.get("has_solve_unskilled"))


def load_module(worker: SandboxWorker, source: str, params: dict[str, Any] | None = None) -> LoadedModule:
    return LoadedModule(worker.call("load", source=source, params=params or {}))


class SandboxEnvironment(Environment):
    """One environment instance living in `worker` (which has the module loaded)."""

    name = "sandboxed"
    version = "0"

    def __init__(self, worker: SandboxWorker, module: LoadedModule, instance: str | None = None):
        self.worker = worker
        self.module = module
        self.name = module.name or "sandboxed"  # instance attributes shadow the ClassVars
        self.version = module.version or "0"
        self.default_max_turns = module.default_max_turns
        self.instance = instance or f"i{next(_ids)}"
        self._obs: Observation | None = None
        self._done = False
        self._result: dict[str, Any] | None = None

    # -- contract ---------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        seed = self.check_seed(seed)
        data = self.worker.call("reset", instance=self.instance, seed=seed)
        self._obs = Observation(messages=[Message.from_dict(m) for m in data["messages"]], task_id=str(data["task_id"]),
                                seed=int(data["seed"]), tools=list(data.get("tools") or []),
                                info=dict(data.get("info") or {}), guidance=data.get("guidance") or None)
        self._done, self._result = False, None
        return self._obs

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self.module.tool_schemas]

    def step(self, action: Action) -> StepResult:
        if self._obs is None:
            raise FailedPrecondition("step() before reset(): call reset(seed) first")
        data = self.worker.call("step", instance=self.instance, action=action.to_dict())
        self._done, self._result = bool(data["done"]), None
        return StepResult(observation=[Message.from_dict(m) for m in data["observation"]], done=self._done,
                          info=dict(data.get("info") or {}))

    @property
    def done(self) -> bool:
        return self._done

    def result(self) -> dict[str, Any]:
        """reward, breakdown, failure_reason, diagnostics, done, termination (one round trip)."""
        if self._obs is None:
            raise FailedPrecondition("reward() before reset(): call reset(seed) first")
        if self._result is None:
            self._result = self.worker.call("result", instance=self.instance)
        return self._result

    def reward(self) -> float:
        return float(self.result()["reward"])

    def reward_breakdown(self) -> dict[str, float]:
        return dict(self.result().get("breakdown") or {})

    def failure_reason(self) -> str | None:
        return self.result().get("failure_reason")

    def diagnostics(self) -> list[dict[str, Any]]:
        return list(self.result().get("diagnostics") or [])

    @property
    def termination(self) -> Termination:
        try:
            return Termination(self.result().get("termination", "done"))
        except ValueError:
            return Termination.DONE

    def splits(self) -> dict[str, Sequence[int]]:
        return dict(self.module.splits)

    @property
    def task_id(self) -> str:
        if self._obs is None:
            raise FailedPrecondition("no task yet: call reset(seed) first")
        return self._obs.task_id

    # -- module extras ------------------------------------------------------------------------
    def solve(self, seed: int) -> list[dict[str, Any]]:
        """The module's oracle actions for `seed`."""
        return list(self.worker.call("solve", seed=seed))

    def solve_unskilled(self, seed: int) -> list[dict[str, Any]] | None:
        """The module's skill-less attempt for `seed`, or None when it defines none."""
        if not self.module.has_solve_unskilled:
            return None
        return list(self.worker.call("solve_unskilled", seed=seed))

    def close(self) -> None:
        """Free the instance in the worker (the worker itself stays up)."""
        if self.worker.alive:
            self.worker.call("close", instance=self.instance)
