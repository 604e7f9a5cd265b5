"""An adapter's first GRPO batches taken from its environment's calibration episodes (issue 31).

`GRPOConfig.initial_batches_uri` names a calibration-batches manifest in this trainer's
artifact store (trace_common/env/calibration_batches.py: the environment service writes one for
every accepted environment). Its episodes were played by the base policy while the environment
was calibrated; an adapter whose LoRA B matrices start at zero *is* that policy, so they are
samples of the adapter's first iteration, and the trainer trains on them instead of playing the
same kind of episodes again (docs/design.md "GRPO": every episode TRACE counts is one it trains on or
evaluates with).

They are refused (FailedPrecondition, before anything is trained) unless they were played as
this job would play its own first iteration -- training on them otherwise would be off-policy
without saying so:
  * the artifact lies in this trainer's store and both of its files verify (sha256);
  * the environment is the one this job trains on (registry name, and version: the job must name
    the version, since "latest" may be another one);
  * the policy is this job's base model (PolicyRef.model, and its adapter if any);
  * every turn was sampled with this config's temperature, top_p and top_k, and capped at its
    max_completion_length; episodes had the same turn budget (max_turns, or the environment's
    default when 0) and their seeds come from train_split;
  * every assistant turn carries its token ids and logprobs (the loss scores those very tokens);
  * each seed's samples split into whole groups: group_size is a multiple of num_generations.

Semantics (B = groups_per_batch, G = num_generations, seeds in the order calibration played them):
    groups = [(seed, samples[j*G:(j+1)*G]) for seed in seeds for j in range(group_size // G)]
    iteration i (0-based) < n_initial trains on groups[i*B:(i+1)*B] (the last batch may be smaller),
    n_initial = ceil(len(groups) / B); advantages, informative-group filtering and resampling
    (fresh on-policy seeds, counted as played) are the loop's usual ones
    the seed schedule of the later, on-policy iterations never draws a calibration seed (seeds.py)
The batches' episodes are samples of the policy as it was at iteration 0; from the second
initial iteration on the policy has moved, so their loss uses the sampler's recorded logprobs as
pi_old in the clipped ratio (PPO's treatment of samples from an earlier policy; at iteration 1
the two coincide up to float rounding), never the current policy's (batch.py `off_policy`).
Nothing of the artifact is kept in checkpoints: it is re-read (and re-verified) on resume, and
the iteration counter says which batch comes next, so resume stays exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trace_common.env import Trajectory
from trace_common.env.calibration_batches import CalibrationBatches, read_calibration_batches
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound

from .config import GRPOConfig

FIELD = "config.initial_batches_uri"


@dataclass(frozen=True)
class InitialBatches:
    """The calibration episodes grouped for training (module docstring)."""

    manifest: CalibrationBatches
    manifest_sha256: str
    groups: list[tuple[int, list[Trajectory]]]      # (seed, its G samples, sample_index 0..G-1)
    groups_per_batch: int

    @property
    def iterations(self) -> int:
        return math.ceil(len(self.groups) / self.groups_per_batch)

    @property
    def seeds(self) -> frozenset[int]:
        return frozenset(self.manifest.seeds)

    def batch(self, iteration: int) -> list[tuple[int, list[Trajectory]]]:
        """The groups of 0-based `iteration` (empty past the last initial iteration)."""
        b = self.groups_per_batch
        return self.groups[iteration * b:(iteration + 1) * b]

    def describe(self) -> dict[str, object]:
        """What training.json records about them."""
        m = self.manifest
        return {"uri": m.trajectories.uri, "manifest_sha256": self.manifest_sha256, "environment": m.environment,
                "version": m.version, "episodes": m.episodes, "groups": len(self.groups),
                "iterations": self.iterations, "seeds": list(m.seeds)}


def _key(store, uri: str) -> str:
    root = store.root_uri.rstrip("/") + "/"
    if not uri.startswith(root):
        raise InvalidArgument(field=FIELD, expected=f"a calibration-batches artifact in this trainer's store "
                              f"({store.root_uri})", got=uri,
                              fix="pass the calibration_batches URI the environment's validation report names")
    key = uri[len(root):]
    try:
        store.stat(key)
    except NotFound:
        raise InvalidArgument(field=FIELD, expected="an existing calibration_batches.json", got=uri,
                              fix="pass the calibration_batches URI the environment's validation report names") \
            from None
    return key


def _refuse(what: str, theirs: object, ours: object, fix: str) -> FailedPrecondition:
    return FailedPrecondition(f"{FIELD}: the calibration episodes were played with {what} {theirs!r}, this job "
                              f"trains with {ours!r}; training on them would be off-policy. {fix}")


def load_initial_batches(store, config: GRPOConfig, *, policy_model: str, policy_adapter: str = "",
                         environment: tuple[str, str] | None, split: Sequence[int],
                         default_max_turns: int) -> InitialBatches:
    """Read, check (module docstring) and group the batches `config.initial_batches_uri` names.
    `environment`: (name, version) of the job's environment (None: not known, refused); `split`:
    the seeds of `config.train_split`; `default_max_turns`: the environment's own turn budget."""
    if store is None:
        raise FailedPrecondition(f"{FIELD} needs the trainer's artifact store (the job runs without one)")
    key = _key(store, config.initial_batches_uri)
    manifest, trajectories = read_calibration_batches(store, key)
    sha = store.stat(key).sha256
    if environment is None or not environment[1]:
        raise FailedPrecondition(f"{FIELD}: the job must name its environment's version (the calibration episodes "
                                 f"were played on {manifest.environment} v{manifest.version}); set "
                                 "spec.environments[0].version")
    name, version = environment
    if (manifest.environment, manifest.version) != (name, version):
        raise FailedPrecondition(f"{FIELD}: the calibration episodes were played on {manifest.environment} "
                                 f"v{manifest.version}, this job trains on {name} v{version}; pass the "
                                 "calibration_batches URI of the environment version being trained")
    if (manifest.policy_model, manifest.policy_adapter) != (policy_model, policy_adapter):
        raise _refuse("the policy", f"{manifest.policy_model}{'+' + manifest.policy_adapter if manifest.policy_adapter else ''}",
                      f"{policy_model}{'+' + policy_adapter if policy_adapter else ''}",
                      "Calibrate with the base agent this job trains (spec.calibration_policy = spec.policy).")
    s = manifest.sampling
    for what, theirs, ours in (("temperature", s.temperature, config.temperature), ("top_p", s.top_p, config.top_p),
                               ("top_k", s.top_k, config.top_k),
                               ("a completion cap (max tokens per turn) of", s.max_tokens,
                                config.max_completion_length)):
        if theirs != ours:
            raise _refuse(what, theirs, ours, "Use one completion cap and the training temperature for calibration "
                          "and training (tracectl run passes them to both: spec.calibration_sampling), or drop "
                          "initial_batches_uri.")
    turns = config.max_turns or default_max_turns
    if manifest.max_turns != turns:
        raise _refuse("a turn budget of", manifest.max_turns, turns, "Set max_turns to the calibration's (0: the "
                      "environment's default), or drop initial_batches_uri.")
    if manifest.split != config.train_split:
        raise _refuse("seeds of split", manifest.split, config.train_split, "Calibrate on the training split "
                      "(ValidationConfig.calibration_split) or drop initial_batches_uri.")
    members = split if isinstance(split, range) else set(split)
    outside = [x for x in manifest.seeds if x not in members]
    if outside:
        raise FailedPrecondition(f"{FIELD}: calibration seeds {outside[:5]} are not in split {config.train_split!r}")
    if not manifest.token_ids:
        raise FailedPrecondition(f"{FIELD}: some calibration turns carry no token ids or logprobs "
                                 f"({manifest.policy_backend} backend); GRPO scores the sampled tokens themselves. "
                                 "Calibrate with a backend that records them (in-process; vLLM with "
                                 "return_tokens_as_token_ids), or drop initial_batches_uri")
    G = config.num_generations
    if manifest.group_size % G:
        raise FailedPrecondition(f"{FIELD}: calibration played {manifest.group_size} samples per seed, which does "
                                 f"not split into groups of num_generations={G}; set num_generations to a divisor "
                                 f"of {manifest.group_size}, or drop initial_batches_uri")
    by_seed: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        by_seed.setdefault(t.seed, []).append(t)
    groups: list[tuple[int, list[Trajectory]]] = []
    for seed in manifest.seeds:
        samples = sorted(by_seed.get(seed, []), key=lambda t: t.sample_index)
        if [t.sample_index for t in samples] != list(range(manifest.group_size)):
            raise FailedPrecondition(f"{FIELD}: seed {seed} has samples {[t.sample_index for t in samples]}, "
                                     f"expected 0..{manifest.group_size - 1}; the artifact is incomplete")
        for j in range(manifest.group_size // G):
            groups.append((seed, [t.model_copy(update={"sample_index": i})
                                  for i, t in enumerate(samples[j * G:(j + 1) * G])]))
    return InitialBatches(manifest=manifest, manifest_sha256=sha, groups=groups,
                          groups_per_batch=config.groups_per_batch)
