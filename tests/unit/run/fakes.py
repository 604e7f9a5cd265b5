"""Stand-ins for the services behind the evaluation stage, over a real artifact store.

`FakeEvalPipeline` is a real `Pipeline` (units, manifest, threads) whose two service calls are
replaced: `rollout` writes real trajectory files whose outcomes are a fixed function of (policy,
task) -- greedy decoding is deterministic, and so is this -- and `train` writes a real metrics
file and checkpoint list for the budget curve's GRPO run. `stage_records` fills the stages before
the evaluation with synthetic records (base trajectories, validation reports, job metrics)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from types import SimpleNamespace
from typing import Any

from trace_common.domains.store.task_model import CAPABILITIES
from trace_common.env import EnvInfo, Message, PolicyInfo, Termination, Trajectory, dumps_jsonl
from trace_common.env.trajectory import TurnRecord
from trace_common.grpc.client import messages
from trace_common.stats import wilson_interval
from tracectl.run.jobs import StageFailed
from tracectl.run.manifest import Manifest
from tracectl.run.pipeline import Pipeline
from tracectl.run.results import Rollout

T = messages("trainer")

CAPS = tuple(sorted(CAPABILITIES))
PROBES = ("record_selection", "multi_request", "precondition_check", "argument_format")
SPLITS = {"test": (1_000_000, 600), "dev": (500_000, 300), "train": (0, 100_000)}


class Boom(RuntimeError):
    """A kill in the middle of the evaluation."""


def trajectory(seed: int, success: bool, *, info: dict[str, Any] | None = None,
               turns: list[tuple[int, int]] = ((20, 5),)) -> Trajectory:
    msgs = [Message.system("policy"), Message.user("hi")]
    records = []
    for prompt, completion in turns:
        records.append(TurnRecord(message_index=len(msgs), prompt_token_ids=[0] * prompt,
                                  completion_token_ids=[1] * completion))
        msgs.append(Message.assistant("ok"))
    return Trajectory(task_id=str(seed), seed=seed, env=EnvInfo(name="store", version="2.0.0"),
                      policy=PolicyInfo(model="fake"), messages=msgs, reward=1.0 if success else 0.0, success=success,
                      termination=Termination.DONE, turns=records,
                      info=info or {"task_type": "compound", "capabilities": [CAPS[seed % 4], CAPS[(seed + 1) % 4]]})


def rollout_stage_records(store, m: Manifest, trajs: list[Trajectory]) -> None:
    info = store.put_bytes(f"runs/{m.run_id}/rollouts/base.jsonl", dumps_jsonl(trajs))
    m.stages["rollout"].outputs = {"trajectories": info.uri}
    m.stages["rollout"].result = {"episodes": len(trajs), "max_completion_length": {"tokens": 96, "source": "config"}}


def report(calibration: list[list[float]] | None, attempts: list[list[str]] | None = None, groups=16, size=8,
           counted: list[int | None] | None = None) -> dict:
    """A validation report as the environment service writes it (the parts the budget reads).
    `counted`: each attempt's recorded calibration_episodes (None: an attempt record without it)."""
    checks = [{"name": "oracle", "passed": True}]
    if calibration is not None:
        checks.append({"name": "calibration", "passed": True, "details": {"rewards": calibration}})
    rows = [{"index": i + 1, "reasons": r} for i, r in enumerate(attempts or [[]])]
    for row, n in zip(rows, counted or [], strict=False):
        if n is not None:
            row["calibration_episodes"] = n
    return {"status": "ACCEPTED", "checks": checks, "config": {"groups": groups, "group_size": size},
            "attempts": rows}


def stage_records(store, run_id: str = "b", *, adapter_metrics: dict | None = None,
                  gates_metrics: dict | None = None, reports: dict | None = None) -> Manifest:
    """A manifest whose stages before the evaluation are done: 6 base episodes of 2 turns (10 + 3
    tokens each turn), two environments (8 calibration episodes in all), two adapters (40 + 48
    episodes) and the gates (22, 6 of them provenance): 124 episodes."""
    m = Manifest(run_id=run_id)
    rollout_stage_records(store, m, [trajectory(s, s % 2 == 0, turns=[(10, 3), (10, 3)]) for s in range(6)])
    envs = []
    for cap, rep in (reports or {CAPS[0]: report([[0.0, 1.0]] * 4), CAPS[1]: report(None)}).items():
        info = store.put_bytes(f"runs/{run_id}/environments/{cap}/validation.json", json.dumps(rep).encode())
        envs.append({"capability": cap, "name": cap, "status": "VALIDATION_STATUS_ACCEPTED",
                     "validation_report": {"uri": info.uri}})
    m.stages["environments"].result = {"environments": envs}
    m.stages["adapters"].outputs = {cap: f"{store.root_uri}/runs/{run_id}/adapters/{cap}/v1/adapter_model.safetensors"
                                    for cap in CAPS[:2]}
    m.stages["adapters"].result = {"metrics": adapter_metrics if adapter_metrics is not None else {
        CAPS[0]: {"rollouts_total": 40.0, "prompt_tokens_total": 4000.0, "completion_tokens_total": 400.0},
        CAPS[1]: {"rollouts_total": 48.0, "prompt_tokens_total": 5000.0, "completion_tokens_total": 500.0}}}
    m.stages["gates"].result = {"metrics": gates_metrics if gates_metrics is not None else {
        "rollouts_total": 22.0, "warm_start_rollouts": 6.0, "prompt_tokens_total": 900.0,
        "completion_tokens_total": 90.0}}
    m.stages["gates"].outputs = {"composition": f"{store.root_uri}/runs/{run_id}/moe/composition.json"}
    return m


def _quality(policy) -> float:
    """The fake pass probability of a policy: the composition above the rest, GRPO improving with
    its checkpoint's iteration."""
    if policy.composition_uri:
        return {"token": 0.6, "per_request": 0.5, "soft_trajectory": 0.45}[policy.routing or "token"]
    if "ckpt-" in policy.adapter_uri:
        return min(0.55, 0.3 + 0.01 * int(policy.adapter_uri.split("ckpt-")[1].split("/")[0]))
    if policy.adapter_uri:
        name = policy.adapter_uri.split("/")[-3]
        return 0.5 if name == "target_grpo" else 0.35 + 0.05 * CAPS.index(name)
    return 0.3


def _key(policy) -> str:
    return f"{policy.adapter_uri}|{policy.composition_uri}|{policy.routing}"


class FakeEvalPipeline(Pipeline):
    """Pipeline with the rollout and trainer calls replaced (module docstring)."""

    def setup(self, *, fail_on: set[str] = frozenset(), soft_unsupported: bool = False,
              delay_s: float = 0.0) -> FakeEvalPipeline:
        self.calls: list[str] = []
        self.fail_on = set(fail_on)
        self.dead = False   # after the kill every later call fails too, as in a killed process
        self.soft_unsupported = soft_unsupported
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self._count = threading.Lock()
        self.checkpoints: dict[str, list[int]] = {}
        self.runner = SimpleNamespace(conn=SimpleNamespace(stub=self._stub))
        return self

    def parsed_config(self, kind, field, config):
        """As the trainer parses it: the trainer's own config models, in this process."""
        from services.trainer.configs import validate_training_config

        name = "TRAINING_KIND_GATES" if kind == T.TRAINING_KIND_GATES else "TRAINING_KIND_ADAPTER"
        return validate_training_config(name, config, field).model_dump(mode="json")

    def _stub(self, service: str):
        if service == "inference":
            return SimpleNamespace()   # the tests replace routing.routing_usage, its only user
        assert service == "trainer", service
        return SimpleNamespace(ListCheckpoints=lambda req: SimpleNamespace(checkpoints=[
            SimpleNamespace(iteration=k, artifact=SimpleNamespace(
                uri=f"{self.store.root_uri}/runs/{self.cfg.run_id}/adapters/target_grpo/ckpt-{k}/checkpoint.json"))
            for k in self.checkpoints[req.job_id]]))

    def _enter(self, label: str) -> None:
        with self._count:
            self.calls.append(label)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay_s)
        if label in self.fail_on:
            # The kill lands once some unit is recorded: with parallel arms a kill in the first call could
            # otherwise beat every other unit (CI saw it), leaving nothing for the resume to keep.
            deadline = time.monotonic() + 10.0
            while not self.manifest.stages["evaluation"].partial and time.monotonic() < deadline:
                time.sleep(0.01)
        if label in self.fail_on or self.dead:
            self.fail_on.discard(label)
            self.dead = True
            with self._count:
                self.in_flight -= 1
            raise Boom(f"killed during {label}")

    def _leave(self) -> None:
        with self._count:
            self.in_flight -= 1

    def rollout(self, policy, split, limit, samples, temperature, label, seed=0, *, env_params=None,
                system_prompt="", max_tokens=None, task_ids=None, labels=None):
        self._enter(label)
        try:
            if policy.routing == "soft_trajectory" and self.soft_unsupported:
                raise StageFailed("rollout job j-soft FAILED: INVALID_ARGUMENT policy.routing: 'soft_trajectory' "
                                  "is not one of 'token', 'per_request', 'merged'")
            start, size = SPLITS[split]
            seeds = range(start, start + (min(limit, size) if limit else size))
            probes = (env_params or {}).get("task_types") == "probes"
            q = _quality(policy)
            trajs = []
            for s in seeds:
                key = _key(policy).replace(self.store.root_uri, "")   # the same draws in any store
                info = ({"task_type": PROBES[s % 4], "capability": CAPS[s % 4], "capabilities": [CAPS[s % 4]]}
                        if probes else None)
                for j in range(samples):   # trial j > 0 draws anew; the first keeps the one-trial draws
                    draw = int(hashlib.sha256(f"{key}:{s}{f':{j}' if j else ''}".encode()).hexdigest()[:8], 16) / 2**32
                    trajs.append(trajectory(s, draw < q, info=info).model_copy(update={"sample_index": j}))
            trajs.reverse()   # the service's file order is not the task order
            uri = self.store.put_bytes(f"runs/{self.cfg.run_id}/eval/{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.jsonl",
                                       dumps_jsonl(trajs)).uri
            k = sum(tr.success for tr in trajs)
            lo, hi = wilson_interval(k, len(trajs))
            return Rollout(job=f"job-{label}", uri=uri, episodes=len(trajs), successes=k, pass_rate=k / len(trajs),
                           ci=[lo, hi], reward_mean=k / len(trajs), wall_seconds=0.0)
        finally:
            self._leave()

    def train(self, kind, capability, envs, config, label, adapter_uris=None):
        self._enter(label)
        try:
            per = config["groups_per_batch"] * config["num_generations"]
            steps = config["max_steps"]
            prefix = f"runs/{self.cfg.run_id}/adapters/{capability}"
            rows = [{"iteration": it, "rollouts_total": float(it * per), "prompt_tokens_total": float(it * per * 25),
                     "completion_tokens_total": float(it * per * 5)} for it in range(1, steps + 1)]
            metrics = self.store.put_bytes(f"{prefix}/v1/metrics.jsonl",
                                           "".join(json.dumps(r) + "\n" for r in rows).encode())
            job = f"train-{capability}"
            save = config.get("save_steps", 10)
            self.checkpoints[job] = sorted({*config.get("checkpoint_at", []), steps,
                                            *(range(save, steps, save) if save else [])})
            outputs = [SimpleNamespace(kind="adapter", uri=f"{self.store.root_uri}/{prefix}/v1/adapter_model.safetensors"),
                       SimpleNamespace(kind="training_metrics", uri=metrics.uri)]
            return SimpleNamespace(job=SimpleNamespace(job_id=job, outputs=outputs, metrics=dict(rows[-1])))
        finally:
            self._leave()
