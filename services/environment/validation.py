"""Validation of one candidate environment module; the result is a JSON validation report.

Checks, in order (a failed check that leaves nothing to run stops the sequence; every
other check still runs so the generation agent gets all reasons at once):

| check         | passes when                                                                                  |
|---------------|----------------------------------------------------------------------------------------------|
| static        | the module parses; none of the patterns `sandbox/static_check.py` lists (imports outside ALLOWED_IMPORTS, eval/exec/open/__import__, `__builtins__`, dunder walks, module aliases ...); has a module docstring of >= 200 characters (why skill transfers) and a module-level `solve(seed)`. Advisory: the sandbox's kernel layers (or pod) contain the code, not this check |
| loads         | the module loads in a sandbox worker and yields exactly one Environment class                 |
| surface       | the candidate keeps the target's surface (`targets.TargetInfo`, from the SDK's `describe_target`): its tool schemas equal ALL of the target's, in the target's order; on a reset, its system prompt starts with the target's system prompt verbatim, followed by at most `max_addendum_chars` of capability addendum; its second message is the target's greeting when the target has one (and no assistant message otherwise) |
| deterministic | for each sampled seed, a second worker with a different PYTHONHASHSEED gives the same oracle actions, the same observations for them (tool outputs, user replies) and the same reward; distinct seeds give distinct instances |
| oracle        | `solve(seed)` reaches reward 1 on every sampled seed                                          |
| noop          | a policy that only says it cannot help scores mean <= noop_max_mean, success <= trivial_max_success |
| random        | `policies.RandomPolicy` scores mean <= random_max_mean, success <= trivial_max_success         |
| calibration   | the base policy's mean reward is inside the band and >= min_informative of groups are informative (see calibration.py), on `groups` seeds of `calibration_split` (the adapter's training split: an accepted level's episodes become its first GRPO batches), stopped early by `calibration_stop` once the verdict is settled (calibration_stop.py: only played groups are reported and counted) |

The report names the calibration policy (`calibration_policy_info`: backend, model, adapter,
endpoint, and `scripted_stand_in`, True when the scripted skill-mixture played instead of a
model). A calibration policy whose backend fails (`CalibrationPolicyFailed`) or whose episodes
run past their deadline (`CalibrationTimedOut`) is not the candidate's fault: it propagates and
fails the job instead of rejecting the candidate.

The report keeps the calibration's played episodes out of its JSON (`calibration_run()`: the
`CalibrationResult`, trajectories included), so the service can store an accepted candidate's
episodes as its calibration-batches artifact (registry.py) and name it in the report.

The final status is ACCEPTED when every check passed, else REJECTED with one reason line
per failed check. A sandbox violation or an exception in the module fails the check
during which it happened (reason names the violation kind); it never escapes.
"""

from __future__ import annotations

import ast
import asyncio
import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from trace_common import pyast
from trace_common.env import run_episode
from trace_common.errors import Cancelled, TraceError

from .baseline_policies import ActionScript, RandomPolicy, noop_policy
from .calibration import CalibrationPolicyFailed, CalibrationResult, CalibrationTimedOut, calibrate
from .calibration_stop import StopRule
from .sandbox.environment import LoadedModule, SandboxEnvironment, load_module
from .sandbox.parent import SandboxConfig, SandboxRefused, SandboxViolation, SandboxWorker
from .sandbox.static_check import ADVISORY_NOTE, findings
from .sandbox.worker import ALLOWED_IMPORTS
from .targets import TargetInfo


class ValidationConfig(BaseModel):
    """Thresholds of the checks (service settings provide defaults; a job may set the band)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: int = Field(8, ge=2, le=500, description="Seeds sampled for the determinism and oracle checks.")
    trivial_episodes: int = Field(16, ge=1, le=1000, description="Episodes each for the no-op and random policies.")
    noop_max_mean: float = Field(0.1, ge=0, le=1, description="Highest mean reward allowed to the no-op policy.")
    random_max_mean: float = Field(0.25, ge=0, le=1, description="Highest mean reward allowed to the random policy.")
    trivial_max_success: float = Field(0.1, ge=0, le=1, description="Highest success rate of either trivial policy.")
    band: tuple[float, float] = Field((0.2, 0.6), description="Calibration mean-reward band.")
    groups: int = Field(16, ge=1, le=1000, description="Calibration groups (seeds).")
    group_size: int = Field(8, ge=2, le=256, description="Calibration samples per seed.")
    min_informative: float = Field(0.5, ge=0, le=1, description="Lowest informative-group fraction.")
    max_addendum_chars: int = Field(600, ge=0, le=20_000, description="Longest capability addendum a candidate's "
                                    "system prompt may add after the target's system prompt.")
    max_turns: int = Field(0, ge=0, le=1000, description="Turn budget per episode (0: the env's default).")
    episode_deadline_s: float = Field(3600.0, gt=0, le=3600, description="Wall-clock limit of one calibration episode "
                                      "(waiting for a shared model included).")
    calibration_concurrency: int = Field(32, ge=1, le=4096, description="Calibration episodes in flight at once "
                                         "(across groups; a model backend batches them). Groups are played in "
                                         "waves of max(1, concurrency // group_size) (calibration.py).")
    calibration_split: str = Field("train", min_length=1, description="Split the calibration seeds come from when "
                                   "the candidate has it (else the determinism seeds' split): the adapter's "
                                   "training split, because an accepted level's calibration episodes become its "
                                   "first GRPO batches.")
    calibration_stop: StopRule = Field("predictive", description="Sequential stop rule (calibration_stop.py): "
                                       "'predictive' (exact bounds, plus a one-sided 95 % prediction bound once "
                                       "calibration_stop_min_groups groups are played), 'exact' (only when the band "
                                       "is out of arithmetic reach), 'none' (every group).")
    calibration_stop_min_groups: int = Field(4, ge=2, le=1000, description="Groups played before the predictive "
                                             "bound may stop a calibration.")
    seed: int = Field(0, description="Seed of the seed sampling and the random policy.")

    @model_validator(mode="after")
    def _check(self) -> ValidationConfig:
        lo, hi = self.band
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"band {self.band} must satisfy 0 <= low < high <= 1, e.g. (0.2, 0.6)")
        return self


class Check(BaseModel):
    name: str
    passed: bool
    reason: str = ""
    details: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0


class ValidationReport(BaseModel):
    """The validation report artifact (validation.json)."""

    status: Literal["ACCEPTED", "REJECTED"]
    reasons: list[str]
    checks: list[Check]
    numbers: dict[str, float] = Field(default_factory=dict)
    candidate: dict[str, Any] = Field(default_factory=dict)
    target: dict[str, Any] = Field(default_factory=dict)
    isolation: dict[str, Any] = Field(default_factory=dict)
    static_check_advisory: bool = Field(
        True, description="Always true: the static check is pattern-based and bypassable; what contained the "
        "candidate are the layers `isolation` names (held / missing), not the static check.")
    config: dict[str, Any] = Field(default_factory=dict)
    calibration_policy: str = ""
    calibration_policy_info: dict[str, Any] = Field(
        default_factory=dict, description="Which policy calibrated: backend, model (adapter, endpoint when set) and "
        "scripted_stand_in (True when the scripted skill-mixture stood in for the base model).")
    seconds: float = 0.0
    mode: str = Field("", description="How the candidate was obtained (GENERATION_MODE_LIBRARY / _LLM).")
    attempts: list[dict[str, Any]] = Field(default_factory=list, description="Every generation attempt.")
    calibration_batches: dict[str, Any] = Field(
        default_factory=dict, description="ACCEPTED candidates: the artifact holding the calibration episodes (uri, "
        "key, sha256, size of calibration_batches.json; trace_common/env/calibration_batches.py), which a trainer "
        "takes as the adapter's first GRPO batches (GRPOConfig.initial_batches_uri). Empty otherwise.")
    _calibration: CalibrationResult | None = PrivateAttr(default=None)

    def calibration_run(self) -> CalibrationResult | None:
        """The calibration check's result with its played episodes (None when it did not run); not in
        the report's JSON."""
        return self._calibration

    def to_json(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True).encode()

    def calibration_episodes(self) -> int:
        """Episodes the calibration check played (0 when validation stopped before it)."""
        return sum(len(group) for c in self.checks if c.name == "calibration"
                   for group in (c.details or {}).get("rewards", []))

    def summary(self) -> str:
        n = self.numbers
        parts = [f"{k}={n[k]:.2f}" for k in ("oracle_mean", "noop_mean", "random_mean", "calibration_mean",
                                              "informative_fraction") if k in n]
        return f"{self.status} ({', '.join(parts)})" + (f": {'; '.join(self.reasons)}" if self.reasons else "")


# -- static checks -------------------------------------------------------------------------------

def static_check(source: str, min_doc: int = 200) -> Check:
    """Parse-level checks (nothing is executed); advisory (sandbox/static_check.py says why)."""
    try:
        tree = pyast.parse(source)
        found = list(findings(source))
    except SyntaxError as exc:
        return Check(name="static", passed=False, reason=f"syntax error at line {exc.lineno}: {exc.msg}")
    problems: list[str] = []
    doc = ast.get_docstring(tree) or ""
    if len(doc) < min_doc:
        problems.append(f"the module docstring has {len(doc)} characters; write >= {min_doc} explaining the task, "
                        "the reward and why skill on it transfers to the target")
    problems += [f"line {line}: {problem}" for line, problem in found]
    if not any(isinstance(n, ast.FunctionDef) and n.name == "solve" for n in tree.body):
        problems.append("no module-level function solve(seed) returning the oracle's actions")
    if any("not allowed" in p for p in problems):
        problems.append(f"allowed imports: {', '.join(ALLOWED_IMPORTS)}")
    return Check(name="static", passed=not problems, reason="; ".join(problems[:12]),
                 details={"docstring_chars": len(doc), "lines": source.count("\n") + 1, "findings": len(found),
                          "advisory": ADVISORY_NOTE})


# -- the target's surface ---------------------------------------------------------------------------

def _schema_key(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True)


def _tool_name(schema: Any) -> str | None:
    fn = schema.get("function") if isinstance(schema, dict) else None
    return fn.get("name") if isinstance(fn, dict) and isinstance(fn.get("name"), str) else None


def surface_check(schemas: Sequence[Any], messages: Sequence[dict[str, Any]], target: TargetInfo,
                  max_addendum_chars: int) -> Check:
    """The candidate's tool schemas and opening messages against the target's surface (module table)."""
    problems: list[str] = []
    names = [_tool_name(s) for s in schemas]
    target_names = target.tool_names()
    missing = [n for n in target_names if n not in names]
    extra = [n or json.dumps(s)[:60] for n, s in zip(names, schemas, strict=True) if n not in target_names]
    if missing:
        problems.append(f"missing the target's tool(s) {', '.join(missing)}: expose all {len(target_names)} of "
                        f"{target.name}'s tools with their schemas unchanged")
    if extra:
        problems.append(f"tool(s) {', '.join(extra)} are not tools of {target.name}")
    if len(set(names)) != len(names):
        problems.append("a tool name appears twice")
    changed = [n for n, s in zip(names, schemas, strict=True)
               if n in target_names and _schema_key(s) != _schema_key(target.schema(n))]
    if changed:
        problems.append(f"the schema of {', '.join(changed)} differs from the target's: copy the target's schemas "
                        "verbatim (names, descriptions, parameters)")
    if not (missing or extra or changed) and names != target_names:
        problems.append("the tools are not in the target's order")
    system = messages[0] if messages else {}
    prompt = system.get("content") if system.get("role") == "system" else None
    addendum = 0
    if not isinstance(prompt, str) or not prompt.startswith(target.system_prompt):
        problems.append(f"the system prompt does not start with {target.name}'s system prompt verbatim "
                        f"({len(target.system_prompt)} characters beginning {target.system_prompt[:40]!r})")
    else:
        addendum = len(prompt) - len(target.system_prompt)
        if addendum > max_addendum_chars:
            problems.append(f"the capability addendum after the target's system prompt has {addendum} characters "
                            f"(at most {max_addendum_chars})")
    second = messages[1] if len(messages) > 1 else {}
    if target.greeting is not None:
        if second.get("role") != "assistant" or second.get("content") != target.greeting:
            problems.append(f"the conversation must open with {target.name}'s greeting {target.greeting!r} "
                            "(an assistant message after the system prompt)")
    elif second.get("role") == "assistant":
        problems.append(f"{target.name} opens with the user's message, not an assistant greeting")
    return Check(name="surface", passed=not problems, reason="; ".join(problems),
                 details={"tools": names, "addendum_chars": addendum})


# -- episodes --------------------------------------------------------------------------------------

def _transcript(env: SandboxEnvironment, seed: int, actions: list[dict[str, Any]], max_turns: int | None) -> dict:
    traj = run_episode(env, ActionScript(actions), seed, max_turns or max(env.default_max_turns, len(actions) + 1))
    return {"messages": [m.to_dict() for m in traj.messages], "reward": traj.reward,
            "breakdown": traj.reward_breakdown, "done": env.done, "failure_reason": traj.failure_reason}


def _first_difference(a: dict, b: dict) -> str:
    for i, (x, y) in enumerate(zip(a["messages"], b["messages"], strict=False)):
        if x != y:
            return f"message {i} ({x.get('role')}): {json.dumps(x.get('content'))[:80]} vs " \
                   f"{json.dumps(y.get('content'))[:80]}"
    if len(a["messages"]) != len(b["messages"]):
        return f"{len(a['messages'])} vs {len(b['messages'])} messages"
    return f"reward {a['reward']} vs {b['reward']}"


def sample_seeds(module: LoadedModule, n: int, rng: random.Random, exclude: Sequence[int] = (),
                 split: str | None = None) -> list[int]:
    """`n` distinct seeds of `split` when the module has it, else of its dev split (else train, else its
    first), none of `exclude`."""
    splits = module.splits
    name = split if split in splits else (
        "dev" if "dev" in splits else ("train" if "train" in splits else next(iter(splits), None)))
    pool = splits[name] if name else range(0, 10_000)
    skip = set(exclude)
    candidates = [s for s in pool if s not in skip] if not isinstance(pool, range) else pool
    k = min(n + len(skip), len(candidates))
    picked = [s for s in rng.sample(candidates, k) if s not in skip][:n]
    return [int(s) for s in picked]


def _describe(policy_factory: Any) -> dict[str, Any]:
    if policy_factory is None:
        return {}
    describe = getattr(policy_factory, "describe", None)
    if describe is not None:
        return dict(describe())
    return {"model": getattr(getattr(policy_factory, "info", None), "model", type(policy_factory).__name__)}


class _Stop(Exception):
    """A check failed in a way that leaves nothing for later checks to run on."""


def validate(source: str, target: TargetInfo, config: ValidationConfig, sandbox: SandboxConfig,
             policy_factory: Any, *, label: str = "candidate", cancel: threading.Event | None = None,
             params: dict[str, Any] | None = None,
             on_calibration_progress: Callable[[int, int], None] | None = None) -> ValidationReport:
    """Run every check on `source` (see module docstring). Never raises for the candidate's faults.

    `on_calibration_progress(done, total)` is `calibrate`'s per-episode callback."""
    started = time.perf_counter()
    checks: list[Check] = []
    numbers: dict[str, float] = {}
    candidate: dict[str, Any] = {"chars": len(source)}
    isolation: dict[str, Any] = {}
    workers: list[SandboxWorker] = []
    rng = random.Random(config.seed)
    calibrated: dict[str, Any] = {}

    def run_check(name: str, fn) -> Any:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"validation of {label} cancelled")
        t0 = time.perf_counter()
        try:
            check, value = fn()
        except SandboxViolation as exc:  # the worker is gone: nothing further can run
            checks.append(Check(name=name, passed=False, reason=str(exc), details={"violation": exc.kind},
                                seconds=round(time.perf_counter() - t0, 3)))
            raise _Stop from None
        except TraceError as exc:
            # not the candidate's fault: fail the job instead of rejecting the candidate
            if isinstance(exc, (Cancelled, CalibrationPolicyFailed, CalibrationTimedOut, SandboxRefused)):
                raise
            check, value = Check(name=name, passed=False, reason=str(exc)), None
        check.seconds = round(time.perf_counter() - t0, 3)
        checks.append(check)
        if not check.passed and name in ("static", "loads", "deterministic", "oracle") and value is None:
            raise _Stop
        return value

    def new_worker(hash_seed: int) -> SandboxWorker:
        worker = SandboxWorker(sandbox.model_copy(update={"hash_seed": hash_seed}), label=label)
        workers.append(worker)
        hello = worker.start()
        isolation.update(hello["isolation"])
        return worker

    try:
        def static():
            check = static_check(source)
            return check, (True if check.passed else None)
        run_check("static", static)

        def loads():
            worker = new_worker(1)
            module = load_module(worker, source, params)
            candidate.update(name=module.name, version=module.version, cls=module.info.get("class"),
                             has_solve=module.has_solve, has_solve_unskilled=module.has_solve_unskilled,
                             tools=[s.get("function", {}).get("name") for s in module.tool_schemas],
                             tool_schemas=module.tool_schemas,
                             splits={k: len(v) for k, v in module.splits.items()})
            problems = []
            if not module.has_solve:
                problems.append("the module has no solve(seed)")
            if not module.splits:
                problems.append("splits() is empty")
            if problems:
                return Check(name="loads", passed=False, reason="; ".join(problems)), None
            return Check(name="loads", passed=True, details={"class": module.info.get("class")}), (worker, module)
        worker, module = run_check("loads", loads)

        seeds = sample_seeds(module, config.seeds, rng)

        def surface():
            env = SandboxEnvironment(worker, module)
            try:
                obs = env.reset(seeds[0])
            finally:
                env.close()
            messages = [m.to_dict() for m in obs.messages]
            return surface_check(module.tool_schemas, messages, target, config.max_addendum_chars), True
        run_check("surface", surface)
        max_turns = config.max_turns or None

        def deterministic():
            other = new_worker(2)
            other_module = load_module(other, source, params)
            transcripts = {}
            problems = []
            for seed in seeds:
                actions = SandboxEnvironment(worker, module).solve(seed)
                env_a, env_b = SandboxEnvironment(worker, module), SandboxEnvironment(other, other_module)
                if env_b.solve(seed) != actions:
                    problems.append(f"seed {seed}: solve() differs between processes")
                    continue
                ta, tb = _transcript(env_a, seed, actions, max_turns), _transcript(env_b, seed, actions, max_turns)
                env_a.close()
                env_b.close()
                if json.dumps(ta, sort_keys=True) != json.dumps(tb, sort_keys=True):
                    problems.append(f"seed {seed}: two instances differ at {_first_difference(ta, tb)}")
                transcripts[seed] = ta
            openings = {json.dumps(t["messages"][:3], sort_keys=True) for t in transcripts.values()}
            if len(transcripts) >= 2 and len(openings) < 2:
                problems.append(f"{len(transcripts)} seeds gave the same instance: reset(seed) ignores the seed")
            other.close()
            check = Check(name="deterministic", passed=not problems, reason="; ".join(problems[:5]),
                          details={"seeds": seeds, "distinct_instances": len(openings)})
            return check, transcripts
        transcripts = run_check("deterministic", deterministic) or {}

        def oracle():
            rewards = {seed: t["reward"] for seed, t in transcripts.items()}
            numbers["oracle_mean"] = statistics.fmean(rewards.values()) if rewards else 0.0
            below = {s: (r, transcripts[s]["failure_reason"]) for s, r in rewards.items() if r < 1.0 - 1e-9}
            reason = "; ".join(f"oracle reached reward {r:.2f} on seed {s} (must be 1): {why}"
                               for s, (r, why) in list(below.items())[:4])
            ok = bool(rewards) and not below
            return Check(name="oracle", passed=ok, reason=reason or ("" if rewards else "no seed was solvable"),
                         details={"rewards": {str(s): r for s, r in rewards.items()}}), True
        run_check("oracle", oracle)

        trivial_seeds = sample_seeds(module, config.trivial_episodes, rng, exclude=seeds)

        def trivial(name: str, make_policy, max_mean: float):
            def run():
                rewards = []
                for i, seed in enumerate(trivial_seeds):
                    env = SandboxEnvironment(worker, module)
                    traj = run_episode(env, make_policy(i), seed, max_turns)
                    env.close()
                    rewards.append(traj.reward)
                mean = statistics.fmean(rewards)
                success = sum(r >= 1.0 for r in rewards) / len(rewards)
                numbers[f"{name}_mean"], numbers[f"{name}_success"] = mean, success
                problems = []
                if mean > max_mean:
                    problems.append(f"{name} policy scores mean {mean:.2f} (max {max_mean:.2f})")
                if success > config.trivial_max_success:
                    problems.append(f"{name} policy succeeds in {success:.0%} of episodes "
                                    f"(max {config.trivial_max_success:.0%})")
                if problems:
                    problems.append("the reward must depend on what the agent does")
                return Check(name=name, passed=not problems, reason="; ".join(problems),
                             details={"rewards": rewards}), True
            return run
        run_check("noop", trivial("noop", lambda i: noop_policy, config.noop_max_mean))
        run_check("random", trivial("random", lambda i: RandomPolicy(config.seed * 7919 + i), config.random_max_mean))

        def calibration():
            if policy_factory is None:
                return Check(name="calibration", passed=False, reason="no calibration policy configured"), True
            split = config.calibration_split if config.calibration_split in module.splits else None
            cal_seeds = sample_seeds(module, config.groups, rng, exclude=[*seeds, *trivial_seeds], split=split)
            result: CalibrationResult = asyncio.run(calibrate(
                lambda: SandboxEnvironment(worker, module), policy_factory, cal_seeds, config.group_size,
                config.band, config.min_informative, base_seed=config.seed, max_turns=max_turns,
                deadline_s=config.episode_deadline_s, cancel=cancel, concurrency=config.calibration_concurrency,
                on_progress=on_calibration_progress, stop=config.calibration_stop,
                min_groups=config.calibration_stop_min_groups))
            calibrated["result"] = result
            calibrated["split"] = split or ""
            calibrated["max_turns"] = max_turns or module.default_max_turns
            numbers["calibration_mean"] = result.mean
            numbers["informative_fraction"] = result.informative_fraction
            problems = []
            if not result.in_band:
                problems.append(f"base policy {result.policy} mean reward {result.mean:.2f} outside the band "
                                f"[{config.band[0]:.2f}, {config.band[1]:.2f}]")
            if not result.informative_ok:
                problems.append(f"only {result.informative_fraction:.0%} of groups informative "
                                f"(need {config.min_informative:.0%})")
            if result.stopped_early:
                problems.append(result.stop_reason)
            problems += result.errors[:3]
            return Check(name="calibration", passed=not problems, reason="; ".join(problems),
                         details={**result.to_dict(), "split": split or "", "max_turns": calibrated["max_turns"]}), True
        run_check("calibration", calibration)
    except _Stop:
        pass
    finally:
        for w in workers:
            w.close()
    reasons = [f"{c.name}: {c.reason}" for c in checks if not c.passed]
    report = ValidationReport(
        status="ACCEPTED" if checks and all(c.passed for c in checks) and len(checks) == 8 else "REJECTED",
        reasons=reasons, checks=checks, numbers={k: round(v, 4) for k, v in numbers.items()},
        candidate=candidate, target=target.summary(), isolation=isolation,
        config=config.model_dump(mode="json"),
        calibration_policy=getattr(getattr(policy_factory, "info", None), "model", "") if policy_factory else "",
        calibration_policy_info=_describe(policy_factory),
        seconds=round(time.perf_counter() - started, 3))
    report._calibration = calibrated.get("result")
    return report
