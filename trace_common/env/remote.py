"""`RemoteEnvironment`: a registered environment played through the EnvironmentService's gRPC API.

This is how another process (the trainer, the rollout service in a cluster) drives a
generated environment without running its code: `reset` is ResetEpisode (the service
starts or reuses a sandbox worker), `step` is StepEpisode, `close` is CloseEpisode. It is
an ordinary `Environment`, so `run_episode` / `run_episode_async` work unchanged:

    env = RemoteEnvironment(stub, "precondition_verification")     # latest accepted version
    traj = run_episode(env, policy, seed=500_123)
    env.close()

It depends only on trace_common (generated protos and the env SDK) so the integrator can
move it into trace_common for the trainer and the rollout service; it lives here with the
service whose API it wraps. Splits are the library's (train / dev / test seed ranges);
reward is known once the episode is done (StepEpisode reports it), before that 0. The instance's
hint (`Observation.guidance`, for guided GRPO rollouts) comes back with ResetEpisode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_common.env import Action, Environment, Message, MessageAction, Observation, StepResult, ToolAction
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.proto.trace.v1 import environment_service_pb2 as pb
from trace_common.proto.trace.v1 import types_pb2 as t

DEFAULT_SPLITS: dict[str, range] = {"train": range(0, 100_000), "dev": range(500_000, 500_500),
                                    "test": range(1_000_000, 1_000_500)}


def message_from_proto(msg: t.ChatMessage) -> Message:
    calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json or "{}"}}
             for c in msg.tool_calls]
    data: dict[str, Any] = {"role": msg.role, "content": msg.content if msg.content or not calls else None}
    if calls:
        data["tool_calls"] = calls
    if msg.tool_call_id:
        data["tool_call_id"] = msg.tool_call_id
    if msg.name:
        data["name"] = msg.name
    return Message.from_dict(data)


class RemoteEnvironment(Environment):
    """One remote episode at a time (see module docstring)."""

    name = "remote"
    version = "0"

    def __init__(self, stub: Any, name: str, version: str = "", *, splits: dict[str, Sequence[int]] | None = None,
                 timeout_s: float = 60.0, record: Any = None):
        """`record`: a GetEnvironmentResponse already fetched for this name and version (a factory
        making one instance per episode fetches it once); otherwise it is fetched here."""
        self.stub, self.timeout_s = stub, timeout_s
        if record is None:
            record = stub.GetEnvironment(pb.GetEnvironmentRequest(name=name, version=version), timeout=timeout_s)
        self.record = record
        self.name, self.version = record.environment.name, record.environment.version
        self._tools = [json.loads(s.json) for s in record.tools]
        self._splits = dict(splits or DEFAULT_SPLITS)
        self.episode_id = ""
        self._seed: int | None = None
        self._done = False
        self._reward = 0.0
        self._diagnostics: list[dict[str, Any]] = []

    def reset(self, seed: int) -> Observation:
        seed = self.check_seed(seed)
        self.close()
        resp = self.stub.ResetEpisode(pb.ResetEpisodeRequest(
            environment=t.EnvironmentRef(name=self.name, version=self.version), seed=seed), timeout=self.timeout_s)
        self.episode_id, self._seed, self._done, self._reward, self._diagnostics = resp.episode_id, seed, False, 0.0, []
        return Observation(messages=[message_from_proto(m) for m in resp.messages], task_id=str(seed), seed=seed,
                           tools=self.tool_schemas(), guidance=resp.guidance or None)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(self._tools))

    def step(self, action: Action) -> StepResult:
        if not self.episode_id:
            raise FailedPrecondition("step() before reset(): call reset(seed) first")
        if isinstance(action, ToolAction):
            raw = action.raw_arguments if action.raw_arguments is not None else json.dumps(action.arguments)
            req = pb.StepEpisodeRequest(episode_id=self.episode_id,
                                        tool_call=t.ToolCall(id=action.call_id, name=action.name, arguments_json=raw))
        elif isinstance(action, MessageAction):
            req = pb.StepEpisodeRequest(episode_id=self.episode_id, message=action.content)
        else:
            raise InvalidArgument(field="action", expected="a ToolAction or MessageAction", got=type(action).__name__)
        resp = self.stub.StepEpisode(req, timeout=self.timeout_s)
        self._done = resp.done
        if resp.done:
            self._reward = resp.reward
            self._diagnostics = [json.loads(d) for d in resp.diagnostics_json]
        obs = [message_from_proto(resp.observation)] if resp.observation.role else []
        return StepResult(observation=obs, done=resp.done)

    @property
    def done(self) -> bool:
        return self._done

    def reward(self) -> float:
        return self._reward

    def diagnostics(self) -> list[dict[str, Any]]:
        return list(self._diagnostics)

    def splits(self) -> dict[str, Sequence[int]]:
        return dict(self._splits)

    @property
    def task_id(self) -> str:
        if self._seed is None:
            raise FailedPrecondition("no task yet: call reset(seed) first")
        return str(self._seed)

    def episode_finished(self) -> None:
        """The driver has read the final state (reward, diagnostics are kept here): free the
        remote episode now instead of leaving it to the service's idle timeout."""
        self.close()

    def close(self) -> None:
        """Close the open episode (frees its sandbox worker)."""
        if self.episode_id:
            self.stub.CloseEpisode(pb.CloseEpisodeRequest(episode_id=self.episode_id), timeout=self.timeout_s)
            self.episode_id = ""


_STUBS: dict[tuple[str, str | None, str | None], Any] = {}


def remote_factory(target: str, name: str, version: str = "", *, token: str | None = None,
                   tls_ca_file: str | Path | None = None):
    """A zero-argument factory of `RemoteEnvironment`s for `name` served by the EnvironmentService at
    `target` (host:port), over TLS trusting the PEM file `tls_ca_file` when one is given. One channel
    per (target, token, CA) per process, shared by every environment it makes; the environment's
    existence is checked now (NotFound with the reason otherwise)."""
    import grpc

    from trace_common.errors import NotFound, Unavailable
    from trace_common.grpc.client import Endpoint, open_channel, stub

    ca = Path(tls_ca_file) if tls_ca_file else None
    if ca is not None and not ca.is_file():
        raise FailedPrecondition(f"the environment service's TLS CA file {ca} does not exist: mount it, or fix "
                                 "TRACE_TRAINER_ENVIRONMENT_TLS_CA_FILE (the chart: tls.caKey of tls.existingSecret)")
    key = (target, token, str(ca) if ca else None)
    if key not in _STUBS:
        _STUBS[key] = stub("environment", open_channel(Endpoint(target, token, ca)))
    env_stub = _STUBS[key]

    try:
        first = RemoteEnvironment(env_stub, name, version)   # GetEnvironment: fails fast when unknown
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            raise NotFound(f"environment {name!r}{' version ' + version if version else ''} is not registered: "
                           f"neither built in nor in the environment service at {target} ({err.details()})") from None
        raise Unavailable(f"environment service at {target}: {err.code().name}: {err.details()}") from None
    def factory() -> RemoteEnvironment:  # the version pinned and its record fetched once, above
        return RemoteEnvironment(env_stub, name, first.version, record=first.record)
    return factory
