"""An environment served by the environment service, played through `RemoteEnvironment`: each
instance's hint (`Observation.guidance`) travels from the sandboxed environment's reset through
the episode table, the servicer's ResetEpisodeResponse and back into the remote Observation,
never into its messages.

Real components: the environment service's domain (registry in a file store, episode table,
sandbox worker processes) and its gRPC servicer; only the transport is replaced by direct calls
on a private event loop (unit tests open no sockets).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.environment.service import Environments
from services.environment.servicer import EnvironmentServicer
from services.environment.settings import EnvironmentSettings
from trace_common.env import Message, MessageAction, run_episode
from trace_common.env.remote import RemoteEnvironment

#: A generated-style environment module: a hint on even seeds, none on odd ones.
SOURCE = '''"""Say done: reward 1 when the agent says "done"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from trace_common.env import Environment, Message, MessageAction, Observation, StepResult


class HintEnv(Environment):
    name: ClassVar[str] = "hint_env"
    version: ClassVar[str] = "1.0.0"

    def __init__(self) -> None:
        self._seed = None
        self._done = False
        self._said = ""

    def reset(self, seed: int) -> Observation:
        self._seed, self._done, self._said = self.check_seed(seed), False, ""
        hint = f"Hint for task {seed}: say done." if seed % 2 == 0 else None
        return Observation(messages=[Message.system("Be brief."), Message.user(f"Task {seed}: say done.")],
                           task_id=str(seed), seed=seed, guidance=hint)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def step(self, action) -> StepResult:
        self._said = action.content if isinstance(action, MessageAction) else ""
        self._done = True
        return StepResult(observation=[Message.user("ok")], done=True)

    @property
    def done(self) -> bool:
        return self._done

    def reward(self) -> float:
        return 1.0 if self._said == "done" else 0.0

    def splits(self) -> dict[str, Sequence[int]]:
        return {"train": range(0, 100), "dev": range(500_000, 500_100), "test": range(1_000_000, 1_000_100)}

    @property
    def task_id(self) -> str:
        return str(self._seed)


def solve(seed: int) -> list[dict[str, Any]]:
    return [{"message": "done"}]
'''


class DirectStub:
    """The EnvironmentService stub's calls, answered by the servicer on a loop thread."""

    def __init__(self, servicer: EnvironmentServicer):
        self.servicer = servicer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _call(self, name: str, request, timeout=None):
        coro = getattr(self.servicer, name)(request, None)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __getattr__(self, name: str):
        if name[:1].isupper():
            return lambda request, timeout=None: self._call(name, request, timeout)
        raise AttributeError(name)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def served(tmp_path):
    domain = Environments(EnvironmentSettings(artifact_root=tmp_path.as_uri(), sandbox_call_timeout_s=20.0))
    domain.registry.register(run_id="r1", capability="hint_env", mode="GENERATION_MODE_LIBRARY", source=SOURCE,
                             report={"status": "ACCEPTED", "reasons": [], "isolation": {"network": "netns"},
                                     "numbers": {"calibration_mean": 0.4, "informative_fraction": 0.9}},
                             target={"name": "store"}, tool_schemas=[])
    stub = DirectStub(EnvironmentServicer(domain))
    try:
        yield stub
    finally:
        asyncio.run_coroutine_threadsafe(asyncio.to_thread(domain.episodes.shutdown), stub.loop).result(30)
        stub.close()


@pytest.mark.parametrize("seed, hint", [
    (4, "Hint for task 4: say done."),   # the instance's own hint
    (6, "Hint for task 6: say done."),   # another instance, another hint
    (5, None),                           # an instance without one: None, not ""
])
def test_reset_carries_the_instance_hint_apart_from_the_messages(served, seed, hint):
    env = RemoteEnvironment(served, "hint_env")
    obs = env.reset(seed)
    assert obs.guidance == hint
    assert [m.content for m in obs.messages] == ["Be brief.", f"Task {seed}: say done."]
    assert "Hint" not in "".join(m.content or "" for m in obs.messages)
    result = env.step(MessageAction(content="done"))
    assert result.done and env.reward() == 1.0
    env.close()


def test_an_episode_played_remotely_records_no_hint(served):
    env = RemoteEnvironment(served, "hint_env")
    traj = run_episode(env, lambda messages, tools: Message.assistant("done"), seed=8)
    assert traj.reward == 1.0 and not env.episode_id  # released by the driver
    assert "Hint" not in traj.model_dump_json()
