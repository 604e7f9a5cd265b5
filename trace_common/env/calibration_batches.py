"""The calibration-batches artifact: an accepted environment's calibration episodes, kept so that
they become the first GRPO batches of the adapter trained on it (docs/design.md "GRPO").

Calibration (services/environment/calibration.py) plays `groups` seeds x `group_size` samples
with the base policy. An adapter whose LoRA starts at zero *is* that policy, so those episodes
are on-policy samples of its first iteration: thrown away, they would be counted in TRACE's
budget without training anything. The environment service therefore writes, beside the
registered environment (`runs/<run>/environments/<cap>/v<N>/`, in the environment registry):

    calibration.jsonl          the played episodes as Trajectory JSON Lines, groups in seed order
                               and each group's samples in order, with the token ids and logprobs
                               of every assistant turn as the policy backend recorded them
    calibration_batches.json   `CalibrationBatches`: what they were played on and with (environment
                               name and version, the module's sha256, the policy, its sampling
                               parameters, the turn budget, the split and seeds) and the JSONL's
                               URI, size and sha256; written last

The trainer reads both with `read_calibration_batches` (the store verifies each object's own
sha256; the JSONL's is also compared with the one the manifest recorded) and refuses them unless
they were played as its own first iteration would play them (services/trainer/grpo/initial_batches.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trace_common.env.trajectory import Trajectory, dumps_jsonl, loads_jsonl
from trace_common.errors import ArtifactCorrupted

SCHEMA_VERSION = 1
TRAJECTORIES_FILE = "calibration.jsonl"
MANIFEST_FILE = "calibration_batches.json"


class ArtifactPointer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str
    key: str
    sha256: str
    size: int = Field(ge=0)


class BatchSampling(BaseModel):
    """How every calibration turn was sampled (the policy request's parameters, seed aside)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(ge=0.0)
    top_p: float = Field(gt=0.0, le=1.0)
    top_k: int = Field(ge=0)
    max_tokens: int = Field(ge=1, description="Most tokens of one assistant turn (the completion cap).")


class CalibrationBatches(BaseModel):
    """The manifest `calibration_batches.json` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    kind: Literal["calibration-batches"] = "calibration-batches"
    environment: str = Field(description="Registry name of the environment (its capability).")
    version: str = Field(description="Registry version of the environment the episodes were played on.")
    code_sha256: str = Field(description="sha256 of the environment module that played them.")
    policy_model: str = Field(description="The calibration policy's model (PolicyRef.model).")
    policy_adapter: str = Field("", description="Its adapter or composition, if any.")
    policy_backend: str = Field(description="POLICY_BACKEND_IN_PROCESS / _OPENAI_HTTP / _SCRIPTED.")
    sampling: BatchSampling
    max_turns: int = Field(ge=1, description="Assistant turns each episode was allowed (the environment's default "
                           "when validation set none).")
    split: str = Field(description="The environment split the seeds were drawn from.")
    seeds: list[int] = Field(description="The groups' seeds, in play order (one group per seed).")
    group_size: int = Field(ge=1, description="Samples per seed.")
    episodes: int = Field(ge=0, description="Episodes in the JSONL (= len(seeds) x group_size).")
    token_ids: bool = Field(description="Every assistant turn carries completion token ids and logprobs.")
    sampling_seeds: str = Field(description="How each episode's sampler seed was derived (for reproduction).")
    trajectories: ArtifactPointer


def has_token_ids(trajectories: Sequence[Trajectory]) -> bool:
    """Every assistant turn of every trajectory recorded its completion ids and logprobs."""
    for traj in trajectories:
        turns = {r.message_index: r for r in traj.turns}
        for i, m in enumerate(traj.messages):
            if m.role != "assistant":
                continue
            rec = turns.get(i)
            if rec is None or rec.completion_token_ids is None or rec.logprobs is None:
                return False
    return True


def write_calibration_batches(store: Any, prefix: str, trajectories: Sequence[Trajectory],
                              **fields: Any) -> tuple[Any, CalibrationBatches]:
    """Write the JSONL, then the manifest, under `prefix`; returns (the manifest's ArtifactInfo, the
    manifest). `fields`: every CalibrationBatches field but `trajectories`, `episodes`, `token_ids`."""
    data = dumps_jsonl(trajectories)
    info = store.put_bytes(f"{prefix}/{TRAJECTORIES_FILE}", data)
    manifest = CalibrationBatches(
        **fields, episodes=len(trajectories), token_ids=has_token_ids(trajectories),
        trajectories=ArtifactPointer(uri=info.uri, key=info.key, sha256=info.sha256, size=info.size))
    body = json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True).encode()
    return store.put_bytes(f"{prefix}/{MANIFEST_FILE}", body), manifest


#: Largest manifest and episodes file a reader loads: a request names the manifest, so an object of
#: the store that is not one (a model's weights) is refused from its size, before it is read. The
#: demo's manifests are ~2 KB and its episodes ~3 MB (64 episodes); 16 x 8 tau2 episodes stay far below.
MAX_MANIFEST_BYTES = 1 << 20
MAX_EPISODES_BYTES = 256 << 20


def read_calibration_batches(store: Any, key: str) -> tuple[CalibrationBatches, list[Trajectory]]:
    """(manifest, trajectories) of the artifact whose manifest is `key`. ArtifactCorrupted when the
    manifest does not parse, is larger than MAX_MANIFEST_BYTES, names episodes outside its own
    directory or larger than MAX_EPISODES_BYTES, or the JSONL's bytes are not the ones it recorded
    (each size and digest is checked on the stored object before its bytes are read)."""
    size = store.stat(key).size
    if size > MAX_MANIFEST_BYTES:
        raise ArtifactCorrupted(f"{key}: {size} bytes, more than a calibration-batches manifest holds "
                                f"({MAX_MANIFEST_BYTES}): not one")
    raw = store.get_bytes(key)
    try:
        manifest = CalibrationBatches.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ArtifactCorrupted(f"{key}: not a calibration-batches manifest ({first[:300]})") from None
    pointer = manifest.trajectories
    home = key.rsplit("/", 1)[0] if "/" in key else ""
    if pointer.key.rsplit("/", 1)[0] != home or pointer.key.rsplit("/", 1)[-1] != TRAJECTORIES_FILE:
        raise ArtifactCorrupted(f"{key}: its episodes ({pointer.key}) are not {TRAJECTORIES_FILE} beside it, where "
                                "a calibration writes them")
    info = store.stat(pointer.key)
    if info.sha256 != pointer.sha256:
        raise ArtifactCorrupted(f"{pointer.uri}: sha256 {info.sha256} differs from the {pointer.sha256} its manifest "
                                f"{key} recorded (the episodes were replaced after the manifest was written)")
    if info.size > MAX_EPISODES_BYTES:
        raise ArtifactCorrupted(f"{pointer.uri}: {info.size} bytes, more than {MAX_EPISODES_BYTES} of calibration "
                                "episodes")
    data = store.get_bytes(pointer.key)
    trajectories = loads_jsonl(data, source=pointer.uri)
    if len(trajectories) != manifest.episodes:
        raise ArtifactCorrupted(f"{pointer.uri}: {len(trajectories)} episodes, its manifest says {manifest.episodes}")
    return manifest, trajectories
