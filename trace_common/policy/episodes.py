"""Play many episodes at once with one `Policy`: each episode runs `run_episode` in a worker
thread, and its policy calls go back to the event loop, where concurrent calls are batched.

    trajs = await play_episodes(lambda: make("store"), policy, [(seed, 0) for seed in seeds],
                                SamplingParams(temperature=1.0, seed=7))

Every episode's sampling is seeded from (`params.seed`, task seed, sample index, turn), so
the same call reproduces the same trajectories with the in-process backend. Malformed
tool calls are recorded per episode in `trajectory.info["parse_errors"]`
(`[{"turn": i, "errors": [...]}]`) next to the environment's own diagnostics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trace_common.env.environment import Environment
from trace_common.env.episode import run_episode
from trace_common.env.trajectory import PolicyInfo, Trajectory
from trace_common.errors import InvalidArgument
from trace_common.policy.base import AssistantTurn, Policy, PolicyRequest, SamplingParams, derive_seed


async def play_episodes(make_env: Callable[[], Environment], policy: Policy, tasks: Sequence[tuple[int, int]],
                        params: SamplingParams, *, concurrency: int = 32, max_turns: int | None = None,
                        deadline_s: float | None = None, env_params: dict[str, Any] | None = None,
                        policy_info: PolicyInfo | None = None) -> list[Trajectory]:
    """Play `(task seed, sample index)` pairs; results in the order of `tasks`."""
    if concurrency < 1:
        raise InvalidArgument(field="concurrency", expected="an integer >= 1", got=concurrency)
    loop = asyncio.get_running_loop()
    info = policy_info or PolicyInfo(model=policy.name, adapter=policy.adapter)

    def play(seed: int, sample_index: int) -> Trajectory:
        parse_errors: list[dict[str, Any]] = []

        def record(request: PolicyRequest, turn: AssistantTurn) -> None:
            if turn.parse_errors:
                parse_errors.append({"turn": request.turn_index, "errors": list(turn.parse_errors)})

        episode_seed = None if params.seed is None else derive_seed(params.seed, seed, sample_index)
        policy_fn = policy.policy_fn(loop, params, seed=episode_seed, on_turn=record)
        traj = run_episode(make_env(), policy_fn, seed, max_turns, policy=info, env_params=env_params,
                           deadline_s=deadline_s, sample_index=sample_index)
        traj.info["parse_errors"] = parse_errors
        return traj

    executor = ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(tasks))),
                                  thread_name_prefix="episode")
    try:
        futures = [loop.run_in_executor(executor, play, seed, idx) for seed, idx in tasks]
        return list(await asyncio.gather(*futures))
    finally:
        executor.shutdown(wait=False)
