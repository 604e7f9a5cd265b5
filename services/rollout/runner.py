"""A rollout job: tasks x samples of one environment played by one policy, concurrently.

Semantics:
    tasks    = spec.tasks.task_ids or env.splits()[spec.tasks.split][:limit]
    episodes = [(t, k) for t in tasks for k in range(samples_per_task)]   # env seed = task seed
    sampling seed of (t, k) = hash(spec.seed, t, k)                       # reproducible sampling
    len(episodes) <= TRACE_ROLLOUT_MAX_EPISODES_PER_JOB                  # refused at CreateRolloutJob
    `concurrency` workers take episodes in that order from one lazy queue; trajectories kept in that order
    publish trajectories.jsonl then summary.json (atomic, sha256) under the output prefix

Outbound endpoints (trace_common/endpoints.py): `plan` decides the HTTP policy's endpoint and the
user simulator's from the service's endpoint profiles and refuses environment parameters that would
choose a URL or key, so a bad request fails before a job exists and nothing is sent. The user
simulator's key reaches the environment factory as `user_api_key` and is never recorded: the
trajectories' `env.params` are `PlannedRollout.recorded_params`.

Outcomes: every episode ends in a trajectory (policy failures are failed episodes with
their reason). The job fails -- and publishes nothing -- when every episode ended in a
policy error (the backend is unusable), when an episode raises (an environment bug, such as
a reset that fails: the other episodes are cancelled, and have ended, before the job does) or
on cancel; otherwise the file holds every episode, never a truncated set.

Memory: a job holds at most `concurrency` episodes in play (one task each) and, per played
episode, its serialised JSONL line and a small outcome record, until it publishes; the cap on
episodes per job bounds the total. A tau2 task id past the environment's task list is refused
by `plan` (the seed indexes tasks.json).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_common.artifacts import ArtifactStore
from trace_common.data_roots import confine, own_data_hidden
from trace_common.endpoints import Endpoints, ResolvedEndpoint, read_api_key, refuse_outbound_params
from trace_common.env import (
    Environment,
    EnvSpec,
    Message,
    Termination,
    Trajectory,
    get_spec,
    run_episode_async,
    to_json_line_bytes,
)
from trace_common.errors import InvalidArgument, NotFound, Unavailable
from trace_common.jobs import JobContext, Output
from trace_common.model_refs import ModelRoots, check_policy_refs
from trace_common.stats import wilson_interval

from . import metrics as m
from .policies import PolicyFactory, check_scripted, make_factory
from .specs import RolloutSpecModel


@dataclass(frozen=True, slots=True)
class EpisodeOutcome:
    """What a job keeps of a played episode besides its JSONL line: the summary's inputs."""

    success: bool
    reward: float
    termination: Termination
    #: The policy backend's error (POLICY_ERROR episodes only: the job's error names the first).
    error: str | None = None

    @classmethod
    def of(cls, traj: Trajectory) -> EpisodeOutcome:
        return cls(traj.success, traj.reward, traj.termination,
                   traj.error if traj.termination == Termination.POLICY_ERROR else None)


@dataclass
class RolloutSummary:
    episodes: int
    successes: int
    pass_rate: float
    pass_rate_ci_low: float
    pass_rate_ci_high: float
    reward_mean: float
    errored_episodes: int
    terminations: dict[str, int] = field(default_factory=dict)
    trajectories_uri: str = ""
    wall_seconds: float = 0.0

    @classmethod
    def of(cls, trajs: Sequence[Trajectory | EpisodeOutcome], uri: str = "", wall: float = 0.0) -> RolloutSummary:
        n = len(trajs)
        s = sum(t.success for t in trajs)
        lo, hi = wilson_interval(s, n)
        errored = sum(t.termination in (Termination.POLICY_ERROR, Termination.AGENT_ERROR) for t in trajs)
        return cls(episodes=n, successes=s, pass_rate=s / n if n else 0.0, pass_rate_ci_low=lo, pass_rate_ci_high=hi,
                   reward_mean=sum(t.reward for t in trajs) / n if n else 0.0, errored_episodes=errored,
                   terminations=dict(Counter(str(t.termination) for t in trajs)), trajectories_uri=uri,
                   wall_seconds=wall)


#: Environment parameters that carry a credential: given to the factory, never written to a trajectory.
SECRET_PARAMS = frozenset({"user_api_key"})
#: The setting listing the directories a request may name data under (RolloutSettings.data_roots).
DATA_ROOTS_SETTING = "TRACE_ROLLOUT_DATA_ROOTS"
#: The setting capping the episodes of one job (RolloutSettings.max_episodes_per_job).
MAX_EPISODES_SETTING = "TRACE_ROLLOUT_MAX_EPISODES_PER_JOB"


@dataclass
class PlannedRollout:
    """A validated spec resolved against the registry and the endpoint profiles, ready to run
    (`spec.policy` is the checked ref)."""

    spec: RolloutSpecModel
    env_spec: EnvSpec
    seeds: list[int]
    samples: int
    #: The environment factory's parameters (a user simulator's key included).
    params: dict = field(default_factory=dict)

    @property
    def recorded_params(self) -> dict:
        """What trajectories record as `env.params`: `params` without credentials."""
        return {k: v for k, v in self.params.items() if k not in SECRET_PARAMS}

    @property
    def episodes(self) -> int:
        return len(self.seeds) * self.samples


def _env_params(spec: RolloutSpecModel, env_spec: EnvSpec, user: ResolvedEndpoint | None = None,
                data_roots: Sequence[Path] = ()) -> dict:
    """The factory's parameters; `user` is spec.user_simulator as the endpoint profiles resolved it.
    A data directory the request names (tau2: `environment.params['data']`, else `environment.uri`)
    must lie under `data_roots` (trace_common/data_roots.py: PermissionDenied otherwise); the factory
    gets it resolved."""
    params = dict(spec.environment.params)
    if params.get("data"):
        params["data"] = confine(params["data"], data_roots, field="spec.environment.params['data']",
                                 setting=DATA_ROOTS_SETTING)
    elif spec.environment.uri:  # environments backed by a data directory (tau2) take it as `data`
        params["data"] = confine(spec.environment.uri, data_roots, field="spec.environment.uri",
                                 setting=DATA_ROOTS_SETTING)
    if user is not None and spec.user_simulator is not None:  # environments with an LLM user (tau2)
        params["user_base_url"] = user.base_url
        params["user_model"] = user.model
        if user.api_key_env:
            params["user_api_key"] = read_api_key(user.api_key_env, f"endpoint profile {user.profile!r} api_key_env")
        if spec.user_simulator.timeout_seconds:
            params.setdefault("user_timeout", str(spec.user_simulator.timeout_seconds))
    unknown = set(params) - set(env_spec.params)
    if unknown:
        raise InvalidArgument(field="spec.environment.params", expected=f"parameters of {env_spec.name!r}: "
                              f"{sorted(env_spec.params) or 'none'}", got=sorted(unknown))
    return params


def check_episodes(tasks: int, samples: int, max_episodes: int | None, tasks_field: str) -> None:
    """InvalidArgument, naming the fields and the setting, when `tasks` x `samples` episodes exceed
    `max_episodes` (the service's TRACE_ROLLOUT_MAX_EPISODES_PER_JOB; None: no cap)."""
    if max_episodes is not None and tasks * samples > max_episodes:
        raise InvalidArgument(f"{tasks} tasks x {samples} samples each", field=f"{tasks_field} x spec.samples_per_task",
                              expected=f"at most {max_episodes} episodes per job (the operator's "
                              f"{MAX_EPISODES_SETTING})", got=tasks * samples,
                              fix=f"Split the tasks over several jobs or ask for fewer samples_per_task (or have the "
                                  f"operator raise {MAX_EPISODES_SETTING})")


def task_count(env: Environment) -> int | None:
    """How many tasks an environment's seeds index, where its seeds name a fixed task list: a tau2
    environment's seed is a task's index in its tasks.json. None for procedural environments (every
    non-negative seed is a task). The Environment API has no such count, so this knows tau2 by its
    class, as `check_scripted` knows the store domain by name."""
    from trace_common.domains.tau2.environment import Tau2Environment

    return len(env.domain.tasks) if isinstance(env, Tau2Environment) else None


def plan(spec: RolloutSpecModel, endpoints: Endpoints | None = None,
         data_roots: Sequence[Path] = (), *, allowed: ModelRoots | None = None,
         max_episodes: int | None = None) -> PlannedRollout:
    """Resolve endpoints, environment and tasks now, so a bad request fails before a job exists.
    `endpoints`: the service's profiles (None: none, so no HTTP policy or LLM user is allowed);
    `data_roots`: the directories a request may name data under (none: it may name none);
    `allowed`: where the policy's model, adapter and composition may lie (trace_common/model_refs.py;
    None: built-in agents only); `max_episodes`: the most episodes (tasks x samples) a job may ask
    for (TRACE_ROLLOUT_MAX_EPISODES_PER_JOB; None: no cap)."""
    endpoints = endpoints or Endpoints(setting="TRACE_ROLLOUT_ENDPOINTS")
    refuse_outbound_params(spec.environment.params, "spec.environment.params")
    user = endpoints.llm(spec.user_simulator, "spec.user_simulator") if spec.user_simulator is not None else None
    spec = spec.model_copy(update={"policy": endpoints.policy(spec.policy, "spec.policy")})
    env_spec = get_spec(spec.environment.name, spec.environment.version or None)
    params = _env_params(spec, env_spec, user, data_roots)
    # the service's own data missing: a NotFound without its path (it may lie under HOME)
    with own_data_hidden(env_spec.name, env_spec.version, params, setting=DATA_ROOTS_SETTING):
        env = env_spec.factory(**params)
    samples = spec.samples_per_task or 1
    if spec.tasks.task_ids:
        try:
            seeds = [int(t) for t in spec.tasks.task_ids]
        except ValueError:
            raise InvalidArgument(field="spec.tasks.task_ids", expected="task ids of this environment (decimal "
                                  "seeds for procedural domains)", got=spec.tasks.task_ids[:3]) from None
        check_episodes(len(seeds), samples, max_episodes, "spec.tasks.task_ids")
    else:
        splits = env.splits()
        split = spec.tasks.split or "test"
        if split not in splits:
            raise NotFound(f"environment {env_spec.name!r} has no split {split!r}; splits: {sorted(splits)}")
        rng = splits[split]
        chosen = rng[: spec.tasks.limit] if spec.tasks.limit else rng  # (a range stays a range: nothing built yet)
        if not spec.tasks.limit and len(chosen) > 10_000:
            raise InvalidArgument(field="spec.tasks.limit", expected=f"a limit: split {split!r} has {len(chosen)} "
                                  "tasks", fix="set spec.tasks.limit")
        check_episodes(len(chosen), samples, max_episodes, "spec.tasks.limit" if spec.tasks.limit else "spec.tasks.split")
        seeds = list(chosen)
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise InvalidArgument(field="spec.tasks.task_ids", expected="non-negative task seeds", got=s)
    if not seeds:
        raise InvalidArgument(field="spec.tasks", expected="at least one task", got=0)
    count = task_count(env)
    if count is not None and (past := [s for s in seeds if s >= count]):
        raise InvalidArgument(field="spec.tasks.task_ids", expected=f"task seeds of {env_spec.name!r}: 0 to "
                              f"{count - 1} (the index of one of its {count} tasks)", got=past[:3],
                              fix="Use seeds from its splits (ListRolloutEnvironments lists their sizes).")
    if spec.policy.backend == "POLICY_BACKEND_SCRIPTED":
        check_scripted(spec.policy.model, env_spec.name)
    check_policy_refs(spec.policy, allowed or ModelRoots(), "spec.policy")
    return PlannedRollout(spec, env_spec, seeds, samples, params)


def with_system_prompt(policy, prompt: str):
    """The policy sees `prompt` instead of the environment's system message (the environment,
    its verifier and the stored trajectory keep the original, so rewards are comparable)."""
    async def wrapped(messages, tools):
        if messages and messages[0].role == "system":
            messages = [Message.system(prompt), *messages[1:]]
        return await policy(messages, tools)
    return wrapped


#: Shortest time between two progress updates of a rollout job (seconds).
PROGRESS_INTERVAL_S = 0.2


def sampling_seed(base: int, task_seed: int, k: int) -> int:
    digest = hashlib.sha256(f"{base}:{task_seed}:{k}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


async def run_all(coros: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run `coros` as tasks until all end. The first to raise cancels the others and, once they have
    all ended (none outlives this call), its exception is raised as is (not in an ExceptionGroup: the
    job reports its status code). A cancel of the caller cancels them all too."""
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None


async def run(ctx: JobContext, p: PlannedRollout, store: ArtifactStore, key_prefix: str,
              default_concurrency: int, s3=None, *, allowed: ModelRoots) -> RolloutSummary:
    spec = p.spec
    env_name = p.env_spec.name
    ctx.progress(stage="loading policy", message=f"{spec.policy.backend} {spec.policy.model}")
    factory: PolicyFactory = await make_factory(spec.policy, spec.sampling, env_name, s3, allowed=allowed)
    params, recorded = p.params, p.recorded_params
    done = 0
    ctx.progress(completed=0, total=p.episodes, stage="playing", message=f"{p.episodes} episodes of {env_name}")
    started = last_progress = time.perf_counter()
    # Metric children bound once per job, not looked up by label per episode.
    episodes_by_outcome = {o: m.EPISODES.labels(env_name, o) for o in ("success", "failure", "error")}
    steps, rewards, durations = (m.STEPS.labels(env_name), m.EPISODE_REWARD.labels(env_name),
                                 m.EPISODE_DURATION.labels(env_name))
    # What the job keeps of each episode until it publishes: its JSONL line and its outcome, in the
    # order of `queue` (never the Trajectory objects, several times the size of their lines).
    lines: list[bytes] = [b""] * p.episodes
    outcomes: list[EpisodeOutcome | None] = [None] * p.episodes
    # The episodes to play, in publishing order, made one at a time as workers take them: a fixed
    # number of workers each play the next episode when the last one ends, so a job has at most
    # `concurrency` episodes (and tasks) at once, however many it plays.
    queue = enumerate((s, k) for s in p.seeds for k in range(p.samples))

    async def play(task_seed: int, k: int) -> Trajectory:
        env: Environment = p.env_spec.factory(**params)
        policy = factory.for_episode(env, task_seed, k, sampling_seed(spec.seed, task_seed, k))
        if spec.system_prompt:
            policy = with_system_prompt(policy, spec.system_prompt)
        m.EPISODES_ACTIVE.inc()
        try:
            return await run_episode_async(env, policy, task_seed, spec.max_turns or None,
                                           policy=factory.info, env_params=recorded, sample_index=k)
        finally:
            m.EPISODES_ACTIVE.dec()

    async def worker() -> None:
        nonlocal done, last_progress
        for i, (task_seed, k) in queue:
            traj = await play(task_seed, k)
            outcome = "error" if traj.termination in (Termination.POLICY_ERROR, Termination.AGENT_ERROR) else (
                "success" if traj.success else "failure")
            episodes_by_outcome[outcome].inc()
            steps.inc(traj.assistant_turns())
            rewards.observe(traj.reward)
            durations.observe(traj.timings.get("total", 0.0))
            if traj.error and traj.termination == Termination.POLICY_ERROR:
                m.POLICY_ERRORS.labels(traj.error.split(":", 1)[0][:40]).inc()
            # Serialised now, while the record is fresh in cache: publishing then only joins lines.
            lines[i], outcomes[i] = to_json_line_bytes(traj), EpisodeOutcome.of(traj)
            del traj
            done += 1
            # Watchers get every job change, each a gRPC message: at hundreds of episodes per second,
            # one update per episode would be hundreds of messages per second per watcher, all on the
            # loop that plays the episodes. So the count is sent at most every PROGRESS_INTERVAL_S,
            # and always for the last episode.
            now = time.perf_counter()
            if now - last_progress >= PROGRESS_INTERVAL_S or done == p.episodes:
                last_progress = now
                ctx.progress(completed=done)

    try:
        # An episode that raises (an environment that fails to reset) fails the job: the other
        # workers are cancelled, and have ended, before the job does (and before the backend closes).
        await run_all(worker() for _ in range(min(spec.concurrency or default_concurrency, p.episodes)))
    finally:
        await factory.close()
    wall = time.perf_counter() - started
    played = [o for o in outcomes if o is not None]  # (all of them: every worker ran its share to the end)
    policy_errors = [o for o in played if o.termination == Termination.POLICY_ERROR]
    if len(policy_errors) == len(played):
        raise Unavailable(f"all {len(played)} episodes failed in the policy backend; first error: "
                          f"{policy_errors[0].error}")
    ctx.progress(stage="publishing", message="writing trajectories")
    info = await asyncio.to_thread(store.put_bytes, f"{key_prefix}/trajectories.jsonl", b"".join(lines))
    del lines[:]
    ctx.add_output(Output(info.uri, info.sha256, info.size, "trajectories"))
    summary = RolloutSummary.of(played, info.uri, wall)
    sinfo = await asyncio.to_thread(store.put_bytes, f"{key_prefix}/summary.json",
                                    json.dumps(asdict(summary), indent=2).encode())
    ctx.add_output(Output(sinfo.uri, sinfo.sha256, sinfo.size, "rollout-summary"))
    ctx.set_metrics({"pass_rate": summary.pass_rate, "reward_mean": summary.reward_mean,
                     "episodes": summary.episodes, "errored_episodes": summary.errored_episodes})
    ctx.progress(stage="done", message=f"pass rate {summary.pass_rate:.3f} "
                 f"[{summary.pass_rate_ci_low:.3f}, {summary.pass_rate_ci_high:.3f}]")
    return summary
