"""What the evaluation stage needs from the run that hosts it: the contract `tracectl/run/pipeline.py`'s
`Pipeline` fulfils (and the tests' stand-ins, tests/unit/run/fakes.py).

The stage reads the run's config and its earlier stages' records, plays rollout and training jobs,
and records its units; it never reaches into the pipeline's job runner or connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from trace_common.artifacts import ArtifactStore
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.run.config import RunConfig
from tracectl.run.manifest import Manifest
from tracectl.run.results import Rollout


class EvaluationHost(Protocol):
    cfg: RunConfig
    store: ArtifactStore
    #: The run's stage records: the evaluation reads rollout, adapters, environments and gates.
    manifest: Manifest

    def rollout(self, policy: t.PolicyRef, split: str, limit: int, samples: int, temperature: float, label: str,
                seed: int = 0, *, env_params: dict[str, str] | None = None, system_prompt: str = "",
                max_tokens: int | None = None, task_ids: list[str] | None = None,
                labels: dict[str, str] | None = None) -> Rollout:
        """One rollout job on the target (`task_ids` instead of split/limit when given), to its end."""

    def train(self, kind: int, capability: str, envs: list[t.EnvironmentRef], config: dict[str, Any], label: str,
              adapter_uris: dict[str, str] | None = None) -> Any:
        """One training job to its end; its response (`.job`: outputs, metrics)."""

    def unit(self, stage: str, key: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`work()` once per stage attempt chain, recorded as soon as it returns (manifest `partial`)."""

    def parsed_config(self, kind: int, field: str, config: dict[str, Any]) -> dict[str, Any]:
        """`config` as the trainer parses it, every default filled in (ValidateTrainingConfig)."""

    def base_policy(self, **kw: str) -> t.PolicyRef:
        """The base agent, with an adapter or composition when given."""

    def target_ref(self, **params: str) -> t.EnvironmentRef:
        """The target environment, with extra params."""

    def completion_cap(self) -> int:
        """The run's one completion cap, as the rollout stage fixed it."""

    def stub(self, service: str) -> Any:
        """A gRPC stub of `service` (the trainer's ListCheckpoints; the inference service's routing trace)."""
