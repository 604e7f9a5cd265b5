"""The GRPO training loop for multi-turn tool use: one LoRA adapter per capability, base frozen.

Where TRL fits and where it does not. TRL's `GRPOTrainer` generates one completion per
prompt from a dataset and scores it with reward functions; its tool/environment support
only accepts chat templates it recognises (Qwen, Llama-3.x, ...; not SmolLM2's plain ChatML
nor TRACE's own template), and a group of multi-turn episodes on one shared,
seeded environment instance (tool results, a scripted user, a verifier at the end) does not
map onto its single-completion API. So the loop is ours; what we keep from TRL is its
vocabulary and conventions: the config field names (config.py), the loss with clip-higher
and token-mean normalisation (`loss_type="dapo"`), the k3 KL estimator against the
adapter-disabled model, logprobs under temperature-scaled logits, advantages with the sample
std, and `old_logp = logp.detach()` when `num_iterations == 1`. `bench/grpo_step.py`
compares one iteration of this loop with one of TRL's on the same model and batch.

Semantics (one iteration; docs/design.md "GRPO"):
    seeds = schedule[cursor : cursor + groups_per_batch]; cursor += groups_per_batch
    play every seed num_generations times, the first guided_per_group of them with their
    instance's guidance as an <expert_guidance> block in the system prompt (guidance.py; a
    guided episode is trained on the plain prompt, batch.py)
    A = group_advantages(rewards); drop constant groups and groups with a policy error or timeout
    (optionally resample fresh seeds for them)
    rollouts_total += every episode played (resampled groups included); tokens likewise
    if no group is informative: no update; streak += 1; stop after N such iterations
    for pass in range(num_iterations):
        for micro-batch in split(sequences, gradient_accumulation_steps):
            logp = selected_logprobs(policy, micro-batch)       # assistant tokens only
            old = logp.detach() on pass 0 (kept for later passes)
            is = min(C, exp(old - behaviour)) on guided tokens, 1 elsewhere
            loss(micro-batch).backward()                        # normalised by the batch total
        all-reduce grads (DDP); clip; AdamW step; LR scheduler step; publish the new version
    checkpoint every save_steps iterations and at each of checkpoint_at (adapter, optimiser,
    scheduler, RNG, cursor, history)
With `initial_batches_uri` the first iterations train on the environment's calibration episodes
instead of playing (initial_batches.py): their groups take the place of the played ones (nothing is
played, the cursor does not move; resampling still plays fresh seeds), their tokens keep the
sampler's logprobs as pi_old, and the schedule never draws their seeds.

Metrics of an iteration (the "iteration" event's values; `history`; metrics.jsonl). Over the
iteration's first round of groups (the batch the seed schedule drew): reward_mean, reward_std,
pass_rate, informative_group_fraction, guided_episodes, guided_share (guided / all episodes of
the round), guided_reward_mean (only when some episode was guided), unguided_reward_mean,
unguided_pass_rate. Over everything the iteration played, resampled groups included: episodes,
prompt_tokens and generated_tokens (as the backend reported them: every turn's full prompt, and
its completion), and the running totals rollouts_total, prompt_tokens_total,
completion_tokens_total -- episodes this trainer played only: the calibration episodes an
initial iteration trains on are counted where they were played (the environment's calibration),
and reported here as initial_batch_episodes and its running total initial_batch_episodes_total --
carried in the checkpointed history, so a resumed job counts exactly
what an uninterrupted one does. A job resumed with nothing left to run re-reports its last
iteration (`"replayed": true`), so its metrics carry the totals too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from peft import PeftModel

from trace_common.artifacts import ArtifactStore
from trace_common.env import Termination, Trajectory
from trace_common.errors import FailedPrecondition, InvalidArgument, Unavailable
from trace_common.policy.base import SamplingParams, derive_seed

from . import checkpoint as ckpt
from .advantages import GroupAdvantages, group_advantages
from .batch import (
    PromptRenderer,
    TrainEpisode,
    build_sequences,
    collate,
    episode_turns,
    micro_batches,
    token_weights,
)
from .config import GRPOConfig
from .curve import training_curve_png
from .distributed import Dist
from .guidance import check_guidance, is_guided
from .initial_batches import InitialBatches, load_initial_batches
from .logprobs import selected_logprobs, shared_prefix_len
from .lora import save_pretrained_to
from .loss import grpo_token_loss, guided_importance_weights
from .rollouts import EnvFactory, EpisodeSpec, RolloutEngine
from .seeds import SeedSchedule
from .trainable import LoraWeights, TrainableWeights

log = logging.getLogger(__name__)

#: Event callback: (kind, payload) with kind "iteration" ({"iteration", "values"}, plus "replayed": True
#: when a resumed run with nothing left to run re-reports its last iteration), "checkpoint"
#: ({"iteration", "uri", "sha256", "size"}), "adapter" ({"version", "uri", "outputs"}), "stopped", or
#: "phase" ({"iteration", "phase"}: what the iteration in progress is doing, for job progress -- with a
#: real model one iteration's rollouts take minutes).
EventFn = Callable[[str, dict[str, Any]], None]


@dataclass
class TrainResult:
    iterations: int
    policy_version: int
    stop_reason: str                      # "completed" or why it stopped early
    stopped_early: bool
    adapter_prefix: str = ""              # key prefix of the final PEFT adapter (v<N>), if written
    adapter_uri: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # {"uri", "sha256", "size", "kind"}
    history: list[dict[str, float]] = field(default_factory=list)


#: A group kept for training: (its episodes, the advantages of the round it was played in, its row there).
Kept = tuple[list[Trajectory], GroupAdvantages, int]


@dataclass
class Collected:
    """What one iteration collected (`GRPOTrainer._collect`): its first round of groups (the seeds the
    schedule drew, or an initial batch of calibration episodes), the groups kept for training and
    what the re-collection rounds played. Groups and episodes are this rank's; rewards all ranks'."""
    seeds: list[int]                       # the first round's, one group each
    groups: list[list[Trajectory]]         # the first round's (empty for the groups of other ranks)
    rewards: torch.Tensor                  # [len(seeds), G] the first round's rewards
    informative: torch.Tensor              # [len(seeds)] the first round's informative groups
    kept: list[Kept]                       # first round's, then each re-collection round's, in order
    from_initial: bool                     # the first round is an initial batch (nothing of it played)
    off_policy_groups: int                 # the first kept groups that are calibration episodes
    rounds: int                            # re-collection rounds run
    extra_rounds: list[list[Trajectory]]   # the groups they played, in order

    @property
    def first_round(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g]

    @property
    def policy_errors(self) -> list[Trajectory]:
        """The first round's episodes the policy backend failed."""
        return [t for t in self.first_round if t.termination == Termination.POLICY_ERROR]

    @property
    def reused(self) -> int:
        """Calibration episodes trained on instead of played."""
        return len(self.first_round) if self.from_initial else 0

    @property
    def played_episodes(self) -> list[Trajectory]:
        """Every episode this trainer played in the iteration, re-collected groups included."""
        return (self.first_round if not self.from_initial else []) + [t for g in self.extra_rounds for t in g]

    @property
    def played(self) -> int:
        return len(self.first_round) - self.reused + sum(len(g) for g in self.extra_rounds)


def lr_lambda(config: GRPOConfig) -> Callable[[int], float]:
    total, warm = config.max_steps, config.warmup_steps

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if config.lr_scheduler_type == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total - warm))
        if config.lr_scheduler_type == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return f


def all_sum_named(dist: Dist, values: dict[str, float]) -> dict[str, float]:
    """`values` summed over ranks, by name. One collective call for all of them (every rank must make
    the same collective calls in the same order, and one all-reduce beats one per value): they travel
    as one vector in the dict's insertion order, which every rank builds alike."""
    return dict(zip(values, dist.all_sum(list(values.values())), strict=True))


@dataclass
class _Passes:
    """What one iteration's optimisation passes share: per micro-batch, the reference, pi_old and
    importance-weight tensors (fixed before or in the first pass); the sums reported (reduced over
    ranks by name, in this order) and the time spent per part."""

    batches: int
    ref: list[torch.Tensor | None] = field(init=False)
    old: list[torch.Tensor | None] = field(init=False)
    importance: list[torch.Tensor | None] = field(init=False)
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("loss", "clipped", "kl", "weight", "entropy", "ent_n", "is_sum", "is_n"), 0.0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("forward_backward", "logprob", "backward", "ref_logprob", "optimizer"), 0.0))
    grad_norm: float = 0.0

    def __post_init__(self) -> None:
        self.ref, self.old, self.importance = ([None] * self.batches for _ in range(3))


class GRPOTrainer:
    """Trains the LoRA adapter of `model` (a `PeftModel` from `lora.attach_lora`) on one
    environment -- or, given `weights`, whatever those weights are (trainable.py; e.g. the gates
    of an MoE composition, with `model` the module whose forward computes the policy's logits).
    Synchronous: `train()` runs every iteration on a private event loop (the rollout backends
    are asynchronous); run it in a worker process or thread."""

    def __init__(self, config: GRPOConfig, model: PeftModel, env_factory: EnvFactory, engine: RolloutEngine, *,
                 render: PromptRenderer, pad_id: int, store: ArtifactStore | None = None, prefix: str = "",
                 capability: str = "", guidance_text: str | None = None, dist: Dist | None = None,
                 on_event: EventFn | None = None, should_stop: Callable[[], bool] | None = None,
                 model_label: str = "", weights: TrainableWeights | None = None, policy_model: str = "",
                 policy_adapter: str = "", environment: tuple[str, str] | None = None,
                 environment_params: Mapping[str, Any] | None = None, model_key: str = ""):
        """`policy_model`/`policy_adapter` (the job's PolicyRef, default `model_label`) and
        `environment` ((name, version) of the job's environment) identify what initial batches must
        have been played by and on (initial_batches.py). With `environment_params` (the environment's
        params), `model_label` and `model_key` (a built-in base agent's cache key) they are the job's
        identity, recorded in its checkpoints: a job continues only checkpoints of its own (`resume`)."""
        self.config = config
        self.model = model
        self.env_factory = env_factory
        self.engine = engine
        self.render = render
        self.pad_id = pad_id
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.capability = capability or "adapter"
        self.dist = dist or Dist()
        self.on_event = on_event or (lambda kind, payload: None)
        self.should_stop = should_stop or (lambda: False)
        self.model_label = model_label
        self.identity = ckpt.job_identity(model_label=model_label, policy_model=policy_model,
                                          policy_adapter=policy_adapter, environment=environment,
                                          environment_params=environment_params, model_key=model_key)
        probe = env_factory()
        splits = probe.splits()
        if config.train_split not in splits:
            raise InvalidArgument(field="config.train_split", expected=f"one of {sorted(splits)}",
                                  got=config.train_split, fix="pick a split the environment defines")
        self.initial: InitialBatches | None = None
        if config.initial_batches_uri:
            self.initial = load_initial_batches(store, config, policy_model=policy_model or model_label,
                                                policy_adapter=policy_adapter, environment=environment,
                                                split=splits[config.train_split],
                                                default_max_turns=probe.default_max_turns)
        self.schedule = SeedSchedule(splits[config.train_split], config.seed,
                                     exclude=self.initial.seeds if self.initial is not None else ())
        # the override hint ("" = each guided episode shows its own instance's Observation.guidance)
        self.guidance_text = guidance_text if guidance_text is not None else config.guidance_text
        self.n_guided = config.guided_per_group
        check_guidance(config, probe, override=self.guidance_text)  # asked for hints: some must exist
        self.params = SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                                     max_tokens=config.max_completion_length)
        self.weights = weights if weights is not None else LoraWeights(model)
        self.trainable = self.weights.parameters()
        if not self.trainable:
            raise FailedPrecondition("the model has no trainable (LoRA) parameters; wrap it with lora.attach_lora")
        self.optimizer = torch.optim.AdamW([p for _, p in self.trainable], lr=config.learning_rate,
                                           betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon,
                                           weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config))
        self.state = ckpt.TrainerState()
        self.checkpoints: list[ckpt.CheckpointInfo] = []
        self.device = next(model.parameters()).device
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reported = False  # an "iteration" event was sent during this train() call

    # -- resume ------------------------------------------------------------------------------
    def _not_ours(self, record: ckpt.CheckpointRecord) -> str:
        """Why a checkpoint is not of this job's lineage ("" when it is): it continues only one written
        with a resumable config digest for the same identity (model label, policy, environment name,
        version and params). One written before identities were recorded: the same model label."""
        if record.config_digest and record.config_digest not in self.config.resumable_digests():
            return f"it was written with another config ({record.config_digest} != {self.config.resume_digest()})"
        if record.identity is None:
            if record.model != self.model_label:
                return f"it was trained on model {record.model!r}, this job trains {self.model_label!r}"
            return ""
        differ = [f"{k} {record.identity.get(k)!r} != {v!r}" for k, v in self.identity.items()
                  if record.identity.get(k) != v]
        return f"it was written by another job ({'; '.join(differ)})" if differ else ""

    def _continues(self, found: ckpt.CheckpointInfo) -> bool:
        why = self._not_ours(ckpt.read_record(self.store, found.key))
        if why:  # a re-run with a changed config, model or environment is a new training, not a continuation
            log.warning("not continuing checkpoint %s: %s", found.uri, why)
        return not why

    def resume(self, manifest_key: str | None = None) -> bool:
        """Restore the given checkpoint, or the newest complete one under the prefix of this job's
        lineage (`_not_ours`; the others are skipped with a log line). Returns False when there is
        none (fresh start). A given checkpoint is restored even when written with another config or
        environment (with a warning), never one trained on another model (FailedPrecondition)."""
        if self.store is None:
            return False
        explicit = manifest_key is not None
        if manifest_key is None:
            found = ckpt.latest_checkpoint(self.store, self.prefix, accept=self._continues)
            if found is None:
                return False
            manifest_key = found.key
        manifest_key = ckpt.manifest_key_of(manifest_key)
        if explicit:
            record = ckpt.read_record(self.store, manifest_key)
            if record.model is not None and record.model != self.model_label:
                raise FailedPrecondition(
                    f"checkpoint {self.store.uri_for(manifest_key)} was trained on model {record.model!r}, and this "
                    f"job trains model {self.model_label!r}: a LoRA adapter continues only on the model it was "
                    f"trained on. Resume from a checkpoint trained on {self.model_label!r}, or start fresh "
                    "(no resume_from_uri)")
            why = self._not_ours(record)
            if why:
                log.warning("resuming from checkpoint %s although %s", self.store.uri_for(manifest_key), why)
        loaded = ckpt.load_checkpoint(self.store, manifest_key)
        self.weights.load_state_bytes(loaded.adapter)
        self.optimizer.load_state_dict(loaded.optimizer)
        self.scheduler.load_state_dict(loaded.scheduler)
        ckpt.restore_python_numpy_rng(loaded.rng_python_numpy)
        ckpt.restore_torch_rng(loaded.rng_torch)
        self.state = loaded.state
        # this job's lineage only (a stale checkpoint of another one may lie under the prefix)
        self.checkpoints = [c for c in ckpt.list_checkpoints(self.store, self.prefix)
                            if c.key == manifest_key or (c.iteration <= self.state.iteration
                                                         and not self._not_ours(ckpt.read_record(self.store, c.key)))]
        log.info("resumed %s at iteration %d (seed cursor %d)", self.capability, self.state.iteration,
                 self.state.seed_cursor)
        return True

    # -- the loop ---------------------------------------------------------------------------------
    def train(self, *, resume: bool | str = True, write_adapter: bool = True) -> TrainResult:
        """Run iterations up to `max_steps` (or an early stop); write checkpoints and the final adapter.
        `resume`: True = latest checkpoint under the prefix if any; a key = that checkpoint; False = fresh."""
        cfg = self.config
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        if resume:
            self.resume(resume if isinstance(resume, str) else None)
        self._loop = asyncio.new_event_loop()
        stop_reason, early = "completed", False
        self._reported = False
        try:
            self._loop.run_until_complete(self.engine.publish(self.state.policy_version))
            while self.state.iteration < cfg.max_steps:
                # checked before an iteration too: a run resumed after its early stop stays stopped
                # (one more iteration would play episodes the uninterrupted run never played)
                reason = self._uninformative_stop()
                if reason:
                    stop_reason, early = reason, True
                    self.on_event("stopped", {"iteration": self.state.iteration, "reason": stop_reason})
                    break
                if self.should_stop():
                    stop_reason, early = "stop requested", True
                    break
                self.step()
                it = self.state.iteration
                if ckpt.checkpoint_due(it, cfg.save_steps, cfg.checkpoint_at) and it < cfg.max_steps:
                    self.save_checkpoint()
            if not self._reported and self.state.history:
                # resumed with nothing left to run: the job's metrics still carry its totals
                self.on_event("iteration", {"iteration": self.state.iteration,
                                            "values": dict(self.state.history[-1]), "replayed": True})
            if self.store is not None and self.dist.is_main and (not self.checkpoints or
                                                                 self.checkpoints[-1].iteration != self.state.iteration):
                self.save_checkpoint()
            result = TrainResult(iterations=self.state.iteration, policy_version=self.state.policy_version,
                                 stop_reason=stop_reason, stopped_early=early, history=list(self.state.history))
            if write_adapter and self.store is not None and self.dist.is_main:
                self.write_final_adapter(result)
            return result
        finally:
            self._loop.run_until_complete(self.engine.close())
            self._loop.close()
            self._loop = None
            torch.use_deterministic_algorithms(was_deterministic)

    def _uninformative_stop(self) -> str:
        """The early-stop reason once the last `early_stop_uninformative_iterations` iterations had no
        informative group, else ""."""
        n = self.config.early_stop_uninformative_iterations
        if not n or self.state.uninformative_streak < n:
            return ""
        last = self.state.history[-1].get("reward_mean", float("nan")) if self.state.history else float("nan")
        return (f"stopped early: no informative group in the last {n} iterations (every group's episodes got the "
                f"same reward; last mean reward {last:.3f}); raise temperature, add guidance (guidance_fraction "
                "with an environment that supplies hints, or guidance_text) or use an environment with partial "
                "credit")

    # -- one iteration ------------------------------------------------------------------------------
    def _play(self, seeds: list[int], first_group: int) -> list[list[Trajectory]]:
        cfg = self.config
        G = cfg.num_generations
        mine = [k for k in range(len(seeds)) if (first_group + k) % self.dist.world == self.dist.rank]
        specs = [EpisodeSpec(seed=seeds[k], group=first_group + k, index=i, guided=i < self.n_guided,
                             sampling_seed=derive_seed(cfg.seed, self.state.iteration, seeds[k], i))
                 for k in mine for i in range(G)]
        assert self._loop is not None
        trajs = self._loop.run_until_complete(self.engine.play(
            self.env_factory, specs, params=self.params, guidance_text=self.guidance_text,
            max_turns=cfg.max_turns or None,
            deadline_s=cfg.episode_timeout_s))
        groups: list[list[Trajectory]] = [[] for _ in seeds]
        for spec, t in zip(specs, trajs, strict=True):
            groups[spec.group - first_group].append(t)
        return groups

    def _rewards(self, groups: list[list[Trajectory]], n: int) -> torch.Tensor:
        """[n, G] rewards of all groups (each rank knows only its own; summed across ranks)."""
        G = self.config.num_generations
        r = torch.zeros((n, G), dtype=torch.float64)
        for g, trajs in enumerate(groups):
            for i, t in enumerate(trajs):
                r[g, i] = t.reward
        return self.dist.all_sum_tensor(r)

    def _broken(self, groups: list[list[Trajectory]], n: int) -> list[bool]:
        """Groups with an episode cut short by the backend (policy error, timeout): their rewards
        say nothing about the policy, so they are not trained on (summed across ranks)."""
        bad = torch.zeros(n, dtype=torch.float64)
        for g, trajs in enumerate(groups):
            if any(t.termination in (Termination.POLICY_ERROR, Termination.TIMEOUT) for t in trajs):
                bad[g] = 1.0
        return [bool(x > 0) for x in self.dist.all_sum_tensor(bad)]

    def _keep(self, groups: list[list[Trajectory]], n: int) -> tuple[torch.Tensor, GroupAdvantages, list[Kept]]:
        """One round's rewards (all ranks), advantages and the groups worth training on: informative
        (rewards not all equal) and not broken (`_broken`)."""
        cfg = self.config
        rewards = self._rewards(groups, n)
        adv = group_advantages(rewards, cfg.scale_rewards, cfg.advantage_epsilon)
        broken = self._broken(groups, n)
        return rewards, adv, [(groups[g], adv, g) for g in range(n) if bool(adv.informative[g]) and not broken[g]]

    def _draw(self, n: int) -> tuple[list[int], int]:
        """The schedule's next `n` seeds and the cursor they start at; the cursor moves past them."""
        start = self.state.seed_cursor
        seeds = self.schedule.take(start, n)
        self.state.seed_cursor += n
        return seeds, start

    def _collect(self, it: int) -> Collected:
        """The groups of iteration `it` (1-based): the initial batch of calibration episodes, or
        `groups_per_batch` seeds played; then, up to `max_resample_rounds` rounds, fresh seeds played
        in place of the groups dropped (`_keep`) until as many are kept as the first round had.

        Semantics:
            first round: initial batch (the cursor stays) or seeds = next groups_per_batch; play(seeds)
            kept = informative and unbroken groups of the first round
            while rounds < max_resample_rounds and len(kept) < len(seeds):
                seeds' = next (len(seeds) - len(kept)); kept += informative and unbroken groups of play(seeds')
        """
        cfg = self.config
        initial = self.initial.batch(self.state.iteration) if self.initial is not None else []
        if initial:   # calibration episodes of the policy at iteration 0 (initial_batches.py): nothing is played
            seeds = [seed for seed, _ in initial]
            base = self.state.iteration * cfg.groups_per_batch
            groups = [list(trajs) if (base + k) % self.dist.world == self.dist.rank else []
                      for k, (_, trajs) in enumerate(initial)]
            self.on_event("phase", {"iteration": it, "phase": f"training on {len(seeds) * cfg.num_generations} "
                                    f"calibration episodes (initial batch {it} of {self.initial.iterations})"})
        else:
            seeds, first = self._draw(cfg.groups_per_batch)
            self.on_event("phase", {"iteration": it, "phase": f"playing {len(seeds) * cfg.num_generations} episodes"})
            groups = self._play(seeds, first)
        rewards, adv, kept = self._keep(groups, len(seeds))
        off_policy_groups = len(kept) if initial else 0   # the first kept groups are calibration episodes
        # Resample replacements for dropped groups (bounded), fresh seeds from the schedule.
        rounds = 0
        extra_rounds: list[list[Trajectory]] = []
        while cfg.max_resample_rounds and rounds < cfg.max_resample_rounds and len(kept) < len(seeds):
            rounds += 1
            need = len(seeds) - len(kept)
            self.on_event("phase", {"iteration": it, "phase": f"resampling {need} groups (round {rounds})"})
            extra, start = self._draw(need)
            more = self._play(extra, start)
            extra_rounds += more
            kept += self._keep(more, need)[2]
        return Collected(seeds=seeds, groups=groups, rewards=rewards, informative=adv.informative, kept=kept,
                         from_initial=bool(initial), off_policy_groups=off_policy_groups, rounds=rounds,
                         extra_rounds=extra_rounds)

    def _episodes(self, collected: Collected) -> list[TrainEpisode]:
        """The episodes this rank trains on: every kept group's, each with its own round's advantage
        (guided = shown a hint; batch.py re-renders those unguided)."""
        episodes: list[TrainEpisode] = []
        for n_kept, (trajs, a, g) in enumerate(collected.kept):
            for i, t in enumerate(trajs):
                guided = is_guided(t)
                episodes.append(TrainEpisode(group=g, index=i, seed=t.seed, reward=t.reward,
                                             advantage=float(a.advantages[g, t.sample_index]), guided=guided,
                                             turns=episode_turns(t, guided=guided, render=self.render),
                                             off_policy=n_kept < collected.off_policy_groups))
        return episodes

    def step(self) -> dict[str, float]:
        """One iteration (module docstring); returns its metrics."""
        t_start = time.perf_counter()
        self.model.eval()
        it = self.state.iteration + 1
        collected = self._collect(it)
        t_gen = time.perf_counter() - t_start
        first_round, errors = collected.first_round, collected.policy_errors
        if first_round and len(errors) == len(first_round):
            raise Unavailable(f"every rollout of iteration {it} failed in the policy backend: "
                              f"{errors[0].error}")
        episodes = self._episodes(collected)
        if episodes:
            self.on_event("phase", {"iteration": it, "phase": f"updating on {len(episodes)} episodes"})
        train_metrics = self._update(episodes) if self.dist.all_sum([float(len(episodes))])[0] > 0 else {}
        if train_metrics:
            self.state.policy_version += 1
            assert self._loop is not None
            self._loop.run_until_complete(self.engine.publish(self.state.policy_version))
            self.state.uninformative_streak = 0
        else:
            self.state.uninformative_streak += 1
        self.state.iteration += 1
        step_s = time.perf_counter() - t_start
        metrics = self._iteration_metrics(collected, train_metrics, generate_s=t_gen, step_s=step_s)
        self.state.history.append(metrics)
        self._reported = True
        self.on_event("iteration", {"iteration": self.state.iteration, "values": dict(metrics)})
        return metrics

    def _iteration_metrics(self, collected: Collected, train_metrics: dict[str, float], *, generate_s: float,
                           step_s: float) -> dict[str, float]:
        """The metrics of the iteration just run (module docstring), summed over ranks; called after the
        state has moved on (iteration, policy version, learning rate)."""
        first_round = collected.first_round
        flat = collected.rewards.flatten()
        guided_eps = [t for t in first_round if is_guided(t)]
        unguided_eps = [t for t in first_round if not is_guided(t)]
        everything = collected.played_episodes
        sums = all_sum_named(self.dist, {
            "successes": float(sum(t.success for t in first_round)),
            "first_round": float(len(first_round)),
            "guided_reward": float(sum(t.reward for t in guided_eps)),
            "guided": float(len(guided_eps)),
            "unguided_successes": float(sum(t.success for t in unguided_eps)),
            "unguided_reward": float(sum(t.reward for t in unguided_eps)),
            "unguided": float(len(unguided_eps)),
            "policy_errors": float(len(collected.policy_errors)),
            "played": float(collected.played),
            "prompt_tokens": float(sum(len(r.prompt_token_ids or []) for t in everything for r in t.turns)),
            "generated_tokens": float(sum(len(r.completion_token_ids or []) for t in everything for r in t.turns)),
            "context_exhausted": float(sum(t.termination == Termination.CONTEXT_EXHAUSTED for t in everything)),
            "reused": float(collected.reused),
        })
        # Semantics: "successes", "first_round", "guided*", "unguided*", "policy_errors": over the first round;
        # "played", the token counts, "context_exhausted": over everything this trainer played;
        # "reused": the calibration episodes of an initial batch.
        n_eps, g_n, u_n = sums["first_round"], sums["guided"], sums["unguided"]
        played, gen_tokens, reused = sums["played"], sums["generated_tokens"], sums["reused"]
        last = self.state.history[-1] if self.state.history else {}
        metrics: dict[str, float] = {
            "iteration": float(self.state.iteration),
            "reward_mean": float(flat.mean()),
            "reward_std": float(flat.std()) if flat.numel() > 1 else 0.0,
            "pass_rate": sums["successes"] / n_eps if n_eps else 0.0,
            "informative_group_fraction": float(collected.informative.float().mean()),
            "groups": float(len(collected.seeds)),
            "groups_trained": float(self.dist.all_sum([float(len(collected.kept))])[0]),
            "resample_rounds": float(collected.rounds),
            "policy_errors": sums["policy_errors"],
            # episodes whose conversation outgrew the model's context (trained on, scored as reached)
            "context_exhausted": sums["context_exhausted"],
            "guided_episodes": g_n,
            "guided_share": g_n / n_eps if n_eps else 0.0,
            "unguided_reward_mean": sums["unguided_reward"] / u_n if u_n else 0.0,
            "unguided_pass_rate": sums["unguided_successes"] / u_n if u_n else 0.0,
            "step_seconds": step_s,
            "generate_seconds": generate_s,
            "episodes": played,
            "prompt_tokens": sums["prompt_tokens"],
            "generated_tokens": gen_tokens,
            "tokens_per_second": gen_tokens / step_s if step_s > 0 else 0.0,
            "learning_rate": float(self.scheduler.get_last_lr()[0]),
            "policy_version": float(self.state.policy_version),
            "rollouts_total": last.get("rollouts_total", 0.0) + played,
            # calibration episodes trained on instead of played (counted where they were played)
            "initial_batch_episodes": reused,
            "initial_batch_episodes_total": (last.get("initial_batch_episodes_total") or 0.0) + reused,
            "prompt_tokens_total": last.get("prompt_tokens_total", 0.0) + sums["prompt_tokens"],
            "completion_tokens_total": last.get("completion_tokens_total", 0.0) + gen_tokens,
        }
        if g_n:
            metrics["guided_reward_mean"] = sums["guided_reward"] / g_n
        metrics.update(train_metrics)
        metrics.update(self.weights.iteration_metrics())
        return metrics

    def _update(self, episodes: list[TrainEpisode]) -> dict[str, float]:
        """The optimisation passes over this iteration's episodes (module docstring: `num_iterations`
        passes over the micro-batches, one optimizer step each); {} when nothing was trained."""
        cfg = self.config
        t0 = time.perf_counter()
        in_loss = [not (e.guided and cfg.guidance_mode == "exclude") for e in episodes]
        seqs = build_sequences(episodes)
        if cfg.guidance_mode == "importance_weighted":
            for s in seqs:  # guided tokens without sampler logprobs cannot be weighted: leave them out
                if episodes[s.episode].guided and not s.has_behaviour:
                    in_loss[s.episode] = False
        local_tokens = float(sum(sum(s.target) for s in seqs if in_loss[s.episode]))
        local_eps = float(len({s.episode for s in seqs if in_loss[s.episode] and any(s.target)}))
        g_tokens, g_eps = self.dist.all_sum([local_tokens, local_eps])
        if g_tokens == 0:
            return {}
        override = g_tokens if cfg.loss_type == "dapo" else g_eps
        weights = token_weights(episodes, seqs, in_loss, cfg.loss_type, total_override=override)
        chunks = micro_batches(seqs, cfg.gradient_accumulation_steps) if seqs else []
        batches = [collate(episodes, seqs, ids, weights, in_loss, self.pad_id) for ids in chunks]
        # the shared system prompt + tools prefix of each micro-batch runs once (logprobs.py)
        prefixes = [shared_prefix_len(mb.input_ids, mb.attention_mask, mb.target_mask) for mb in batches]
        passes = _Passes(len(batches))
        self._reference_logprobs(batches, prefixes, passes)
        self.model.train()
        for p in range(cfg.num_iterations):
            self._optimisation_pass(p, batches, prefixes, passes)
        self.model.eval()
        sums = all_sum_named(self.dist, passes.sums)
        wsum = sums["weight"]
        out = {
            "loss": sums["loss"],
            "clip_fraction": sums["clipped"] / wsum if wsum else 0.0,
            "entropy": sums["entropy"] / sums["ent_n"] if sums["ent_n"] else 0.0,
            "grad_norm": passes.grad_norm,
            "trained_tokens": g_tokens,
            "trained_episodes": g_eps,
            "train_seconds": time.perf_counter() - t0,
            **{f"{k}_seconds": v for k, v in passes.seconds.items()},
        }
        if cfg.beta > 0:
            out["kl"] = sums["kl"] / wsum if wsum else 0.0
        if sums["is_n"]:
            out["importance_weight_mean"] = sums["is_sum"] / sums["is_n"]
        return out

    def _reference_logprobs(self, batches: list[Any], prefixes: list[int], passes: _Passes) -> None:
        """The KL reference's logprobs of every micro-batch (beta > 0 only), once per iteration."""
        cfg = self.config
        if cfg.beta <= 0:
            return
        tr = time.perf_counter()
        dev = self.device
        self.model.eval()
        with torch.no_grad(), self.weights.reference():
            for k, mb in enumerate(batches):
                ref, _ = selected_logprobs(self.model, mb.input_ids.to(dev), mb.attention_mask.to(dev),
                                           mb.target_mask.to(dev), temperature=cfg.temperature,
                                           with_entropy=False, prefix_len=prefixes[k])
                passes.ref[k] = ref.detach()
        passes.seconds["ref_logprob"] = time.perf_counter() - tr

    def _optimisation_pass(self, p: int, batches: list[Any], prefixes: list[int], passes: _Passes) -> None:
        """Pass `p`: forward and backward over every micro-batch, then one optimizer step. The first
        pass fixes pi_old and the guided tokens' importance weights; the last one's losses are reported."""
        cfg = self.config
        dev = self.device
        sums, seconds = passes.sums, passes.seconds
        tb = time.perf_counter()
        for k, mb in enumerate(batches):
            tf = time.perf_counter()
            ids, att, tmask = mb.input_ids.to(dev), mb.attention_mask.to(dev), mb.target_mask.to(dev)
            logp, entropy = selected_logprobs(self.model, ids, att, tmask, temperature=cfg.temperature,
                                              with_entropy=(p == 0), prefix_len=prefixes[k])
            if p == 0:
                guided = mb.selected(mb.guided).to(dev)
                behaviour = mb.selected(mb.behaviour_logp).to(dev)
                # pi_old: the current policy's logprob, or the sampler's for episodes of an earlier
                # policy (initial batches of calibration episodes, initial_batches.py)
                passes.old[k] = torch.where(mb.selected(mb.off_policy).to(dev), behaviour, logp.detach())
                w = torch.ones_like(logp)
                if self.n_guided and cfg.guidance_mode == "importance_weighted" and bool(guided.any()):
                    iw = guided_importance_weights(logp.detach(), behaviour, cfg.guidance_importance_cap)
                    w = torch.where(guided, iw, w)
                    sums["is_sum"] += float(iw[guided].sum())
                    sums["is_n"] += float(guided.sum())
                passes.importance[k] = w
                if entropy is not None:
                    sums["entropy"] += float(entropy.sum())
                    sums["ent_n"] += float(entropy.numel())
            terms = grpo_token_loss(logp, passes.old[k], mb.selected(mb.advantage).to(dev),
                                    mb.selected(mb.weight).to(dev), epsilon=cfg.epsilon,
                                    epsilon_high=cfg.epsilon_high, beta=cfg.beta, ref_logp=passes.ref[k],
                                    is_weights=passes.importance[k])
            aux = self.weights.aux_loss()
            loss = terms.loss if aux is None else terms.loss + aux / len(batches)
            tk = time.perf_counter()
            seconds["logprob"] += tk - tf
            loss.backward()
            seconds["backward"] += time.perf_counter() - tk
            if p == cfg.num_iterations - 1:
                sums["loss"] += float(loss.detach())
                sums["clipped"] += terms.clipped_tokens
                sums["kl"] += terms.kl_sum
                sums["weight"] += terms.weight_sum
        seconds["forward_backward"] += time.perf_counter() - tb
        to = time.perf_counter()
        params = [q for _, q in self.trainable]
        self.dist.sync_grads(params)
        if cfg.max_grad_norm > 0:
            passes.grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        else:
            passes.grad_norm = float(torch.norm(torch.stack([q.grad.norm() for q in params if q.grad is not None])))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        seconds["optimizer"] += time.perf_counter() - to

    # -- artifacts ------------------------------------------------------------------------------------
    def save_checkpoint(self) -> ckpt.CheckpointInfo | None:
        if self.store is None or not self.dist.is_main:
            return None
        info = ckpt.save_checkpoint(self.store, self.prefix, state=self.state, adapter=self.weights.state_bytes(),
                                    adapter_config=self.weights.config_bytes(),
                                    weights_file=self.weights.weights_file, config_file=self.weights.config_file,
                                    optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(),
                                    config_digest=self.config.resume_digest(),
                                    extra={"capability": self.capability, "model": self.model_label},
                                    identity=self.identity)
        self.checkpoints.append(info)
        self.on_event("checkpoint", {"iteration": info.iteration, "uri": info.uri, "sha256": info.sha256,
                                     "size": info.size})
        return info

    def next_version(self) -> int:
        assert self.store is not None
        versions = [0]
        for info in self.store.list(f"{self.prefix}/v"):
            head = info.key[len(self.prefix) + 2:].split("/", 1)[0]
            if head.isdigit():
                versions.append(int(head))
        return max(versions) + 1

    def write_final_adapter(self, result: TrainResult) -> None:
        """PEFT adapter (+ training curve, metrics, config) under `<prefix>/v<N>/`."""
        assert self.store is not None
        version = self.next_version()
        vprefix = f"{self.prefix}/v{version}"
        outputs: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory(prefix="trace-adapter-") as tmp:
            files = [f for f in save_pretrained_to(self.model, tmp) if f.name != "README.md"]  # no model card
            for path in files:
                info = self.store.put_file(f"{vprefix}/{path.name}", path)
                kind = "adapter" if path.name == "adapter_model.safetensors" else "adapter_config"
                outputs.append({"uri": info.uri, "sha256": info.sha256, "size": info.size, "kind": kind})
        extras = {
            "training_curve.png": (training_curve_png(self.state.history, title=f"GRPO {self.capability}"),
                                   "training_curve"),
            "metrics.jsonl": ("".join(json.dumps(h, sort_keys=True) + "\n" for h in self.state.history).encode(),
                              "training_metrics"),
            "training.json": (json.dumps({"capability": self.capability, "model": self.model_label,
                                          "config": self.config.model_dump(mode="json"),
                                          "config_digest": self.config.digest(), "iterations": result.iterations,
                                          "policy_version": result.policy_version,
                                          "stop_reason": result.stop_reason,
                                          "guidance": {"guided_per_group": self.n_guided,
                                                       "source": ("none" if not self.n_guided else
                                                                  "config.guidance_text" if self.guidance_text
                                                                  else "environment (per instance)"),
                                                       "override_text": self.guidance_text},
                                          "initial_batches": self.initial.describe() if self.initial else None},
                                         indent=1, sort_keys=True).encode(),
                              "training_summary"),
        }
        for name, (data, kind) in extras.items():
            info = self.store.put_bytes(f"{vprefix}/{name}", data)
            outputs.append({"uri": info.uri, "sha256": info.sha256, "size": info.size, "kind": kind})
        result.adapter_prefix = vprefix
        result.adapter_uri = self.store.uri_for(f"{vprefix}/adapter_model.safetensors").rsplit("/", 1)[0]
        result.outputs = outputs
        self.on_event("adapter", {"version": version, "uri": result.adapter_uri, "outputs": outputs})


def seed_everything(seed: int) -> None:
    """Global RNGs (only LoRA init and dropout use them; sampling has its own seeded generators)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def configure_threads(deterministic: bool) -> None:
    """Pin the intra-op thread count when determinism is asked for (TORCH_NUM_THREADS or 1 per
    process), so repeated runs reduce in the same order."""
    if deterministic:
        n = int(os.environ.get("TRACE_TORCH_THREADS", "0") or 0)
        if n > 0:
            torch.set_num_threads(n)

