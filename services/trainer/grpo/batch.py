"""From played groups to padded training tensors: which tokens are trained, with which advantage
and which behaviour logprob.

Each assistant turn of an episode is a (prompt ids, completion ids, sampler logprobs)
record. Turns are merged into one sequence when the next turn's prompt starts with the
previous sequence (the chat template renders the conversation incrementally and the
generated ids survived re-rendering), so a k-turn episode usually costs one forward pass
over its final length instead of k passes over growing prefixes; otherwise a turn starts a
new sequence. Either way every completion token is scored in exactly the context it was
generated in -- never a re-tokenisation of its text.

Guided episodes were sampled with an `<expert_guidance>` block at the end of the system prompt
(their instance's guidance, or the config's override: guidance.py), but the policy must learn to
act without it: their turns are re-rendered from the trajectory's conversation, which never
contains the block (`PromptRenderer`), so they are trained on the plain prompt and no block token
reaches the training tensors, with the sampler's (guided) logprobs kept as the behaviour logprobs
for importance weighting (see `loss.guided_importance_weights`). A trajectory whose environment
messages (system, user, tool) hold the block is refused (`episode_turns`): the block would then
be part of the plain prompt the loss sees.

Semantics (one micro-batch of B sequences padded on the right to T):
    input_ids [B, T], attention_mask [B, T]
    target_mask [B, T]: completion tokens (never position 0)
    behaviour_logp [B, T]: the sampler's logprob of each completion token (0 elsewhere)
    advantage [B, T]: the episode's advantage on its completion tokens
    guided [B, T]: the token comes from a guided episode
    off_policy [B, T]: the token comes from an episode of an earlier policy (an initial batch's
        calibration episode, initial_batches.py): its behaviour logprob is pi_old in the loss
    weight [B, T]: the loss normalisation (loss.py)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trace_common.env import Message, Trajectory
from trace_common.env.guidance import has_guidance_block
from trace_common.errors import FailedPrecondition

#: (messages so far, tool schemas) -> prompt token ids with the assistant header appended.
PromptRenderer = Callable[[list[Message], list[dict[str, Any]]], list[int]]


@dataclass
class TurnTokens:
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logp: list[float] | None


@dataclass
class TrainEpisode:
    """One episode of a kept group, with its advantage."""

    group: int
    index: int
    seed: int
    reward: float
    advantage: float
    guided: bool
    turns: list[TurnTokens]
    off_policy: bool = False          # sampled by an earlier policy (initial_batches.py)

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)


@dataclass
class TrainSequence:
    episode: int                     # index into the batch's episode list
    input_ids: list[int] = field(default_factory=list)
    target: list[bool] = field(default_factory=list)
    behaviour_logp: list[float] = field(default_factory=list)
    has_behaviour: bool = True

    def __len__(self) -> int:
        return len(self.input_ids)


def episode_turns(traj: Trajectory, *, guided: bool, render: PromptRenderer | None) -> list[TurnTokens]:
    """The token records of a trajectory's assistant turns, plain (re-rendered) prompts for guided
    episodes. FailedPrecondition when a non-assistant message holds an `<expert_guidance>` block."""
    if has_guidance_block([m for m in traj.messages if m.role != "assistant"]):
        raise FailedPrecondition(
            f"episode {traj.task_id}/{traj.sample_index}: its conversation holds an <expert_guidance> block, so the "
            "prompt trained on would show the guidance; an environment gives guidance as Observation.guidance "
            "(the trainer shows it only to the guided share of a group), never in its messages")
    out: list[TurnTokens] = []
    for rec in traj.turns:
        if rec.completion_token_ids is None:
            raise FailedPrecondition(
                f"episode {traj.task_id}/{traj.sample_index}: turn {rec.message_index} has no completion token "
                "ids; GRPO needs a backend that returns them (in-process always does; for vLLM request "
                "return_tokens_as_token_ids)")
        prompt = rec.prompt_token_ids
        if guided or prompt is None:
            if render is None:
                raise FailedPrecondition("a prompt must be re-rendered (guided episode or missing prompt ids) "
                                         "but no PromptRenderer was given")
            prompt = render(traj.messages[:rec.message_index], traj.tools)
        out.append(TurnTokens(prompt_ids=list(prompt), completion_ids=list(rec.completion_token_ids),
                              behaviour_logp=list(rec.logprobs) if rec.logprobs is not None else None))
    return out


def build_sequences(episodes: Sequence[TrainEpisode]) -> list[TrainSequence]:
    """Merge each episode's turns into as few sequences as possible (module docstring)."""
    seqs: list[TrainSequence] = []
    for e_idx, ep in enumerate(episodes):
        current: TrainSequence | None = None
        for turn in ep.turns:
            if not turn.completion_ids:
                continue
            n = len(current.input_ids) if current is not None else 0
            if current is not None and len(turn.prompt_ids) >= n and turn.prompt_ids[:n] == current.input_ids:
                extra = turn.prompt_ids[n:]
            else:
                current = TrainSequence(episode=e_idx)
                seqs.append(current)
                extra = turn.prompt_ids
            current.input_ids += extra
            current.target += [False] * len(extra)
            current.behaviour_logp += [0.0] * len(extra)
            current.input_ids += turn.completion_ids
            current.target += [True] * len(turn.completion_ids)
            if turn.behaviour_logp is None:
                current.has_behaviour = False
                current.behaviour_logp += [0.0] * len(turn.completion_ids)
            else:
                current.behaviour_logp += turn.behaviour_logp
    for s in seqs:
        if s.target and s.target[0]:
            raise FailedPrecondition("a completion starts at position 0 (empty prompt); every turn needs a prompt")
    return seqs


@dataclass
class MicroBatch:
    input_ids: torch.Tensor       # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    target_mask: torch.Tensor     # [B, T] bool
    behaviour_logp: torch.Tensor  # [B, T] float
    has_behaviour: torch.Tensor   # [B, T] bool
    advantage: torch.Tensor       # [B, T] float
    guided: torch.Tensor          # [B, T] bool
    weight: torch.Tensor          # [B, T] float
    off_policy: torch.Tensor      # [B, T] bool
    sequence_ids: list[int]       # which batch sequences (for per-pass caches)

    def selected(self, t: torch.Tensor) -> torch.Tensor:
        """Values of a [B, T] tensor at the target positions, in `selected_logprobs` order ([N])."""
        return t[:, 1:][self.target_mask[:, 1:]]


def token_weights(episodes: Sequence[TrainEpisode], seqs: Sequence[TrainSequence], in_loss: Sequence[bool],
                  loss_type: str, total_override: float | None = None) -> list[float]:
    """Per-sequence weight of each trained token (loss.py): 1/N_tokens (dapo) or
    1/(tokens of its episode * episodes) (grpo). `in_loss[e]` says whether episode e's tokens
    count; `total_override` replaces the local count (DDP: the global count)."""
    if loss_type == "dapo":
        total = sum(sum(s.target) for s in seqs if in_loss[s.episode])
        total = total_override if total_override is not None else total
        return [1.0 / total if total and in_loss[s.episode] else 0.0 for s in seqs]
    per_ep: dict[int, int] = {}
    for s in seqs:
        if in_loss[s.episode]:
            per_ep[s.episode] = per_ep.get(s.episode, 0) + sum(s.target)
    n_eps = total_override if total_override is not None else len(per_ep)
    return [1.0 / (per_ep[s.episode] * n_eps) if in_loss[s.episode] and per_ep.get(s.episode) and n_eps else 0.0
            for s in seqs]


def collate(episodes: Sequence[TrainEpisode], seqs: Sequence[TrainSequence], ids: Sequence[int],
            weights: Sequence[float], in_loss: Sequence[bool], pad_id: int) -> MicroBatch:
    """Pad the sequences `ids` on the right into one micro-batch."""
    width = max(len(seqs[i]) for i in ids)
    b = len(ids)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    target = torch.zeros((b, width), dtype=torch.bool)
    blogp = torch.zeros((b, width), dtype=torch.float32)
    has_b = torch.zeros((b, width), dtype=torch.bool)
    adv = torch.zeros((b, width), dtype=torch.float32)
    guided = torch.zeros((b, width), dtype=torch.bool)
    weight = torch.zeros((b, width), dtype=torch.float32)
    off = torch.zeros((b, width), dtype=torch.bool)
    for row, i in enumerate(ids):
        s = seqs[i]
        ep = episodes[s.episode]
        n = len(s)
        input_ids[row, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attention[row, :n] = 1
        tmask = torch.tensor(s.target, dtype=torch.bool)
        target[row, :n] = tmask if in_loss[s.episode] else torch.zeros_like(tmask)
        blogp[row, :n] = torch.tensor(s.behaviour_logp, dtype=torch.float32)
        has_b[row, :n] = s.has_behaviour
        adv[row, :n] = ep.advantage
        guided[row, :n] = ep.guided
        weight[row, :n] = weights[i]
        off[row, :n] = ep.off_policy
    return MicroBatch(input_ids=input_ids, attention_mask=attention, target_mask=target, behaviour_logp=blogp,
                      has_behaviour=has_b, advantage=adv, guided=guided, weight=weight, sequence_ids=list(ids),
                      off_policy=off)


def micro_batches(seqs: Sequence[TrainSequence], n_chunks: int) -> list[list[int]]:
    """Split sequence indices into `n_chunks` micro-batches of similar length (length-sorted,
    then dealt out in contiguous runs: little padding, deterministic)."""
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i))
    n_chunks = max(1, min(n_chunks, len(order)))
    size, rem = divmod(len(order), n_chunks)
    out, start = [], 0
    for c in range(n_chunks):
        end = start + size + (1 if c < rem else 0)
        if end > start:
            out.append(order[start:end])
        start = end
    return out
