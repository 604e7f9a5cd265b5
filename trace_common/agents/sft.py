"""Supervised warm start: teach a causal LM to imitate trajectories, loss on assistant tokens only.

Each trajectory is rendered once with the model's chat template (`ChatFormat`), exactly as
the in-process policy renders prompts at rollout time, and the loss covers the tokens of
each assistant reply up to and including its end-of-turn marker -- what the policy must
generate -- and nothing else (not the system prompt, the user, or tool results).

All trajectories of one environment start with the same system prompt (policy + tools),
often two thirds of the tokens. A batch therefore runs that shared prefix once, expands
its KV states to the batch (the expansion is differentiable, so its gradient is the sum
over the batch, exactly as if each sequence had run it), and runs only the suffixes:

Semantics (one step, batch of B token sequences x_b with loss masks w_b):
    P = min(common prefix of all x_b, first loss position of any x_b) - 1   (>= 0)
    kv = forward(x[:P])                      # [1, heads, P, d] per layer, with grad
    kv_B = expand(kv, B)                      # [B, heads, P, d]
    logits = forward(x_b[P:], past=kv_B)      # [B, S, V], right-padded suffixes
    loss = sum_{b,t} w_b[t+1] * CE(logits[b, t-P], x_b[t+1]) / sum w

Guided trajectories (an `<expert_guidance>` block at the end of the system prompt, before the
tool list the template renders after it) share only the policy text with the others, so
batches never mix them (`SFTExample.group`): a mixed batch would run the tool list once per row.
"""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import DynamicCache

from trace_common.agents.threads import MIN_STEPS as MIN_TUNED_STEPS
from trace_common.agents.threads import ThreadTuner
from trace_common.env.guidance import has_guidance_block
from trace_common.env.trajectory import Trajectory
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.policy.chat import ChatFormat


class SFTConfig(BaseModel):
    """Optimisation settings of a warm start."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(300, ge=1, description="Optimizer steps.")
    batch_size: int = Field(16, ge=1, description="Sequences per step.")
    learning_rate: float = Field(3e-3, gt=0, le=1.0, description="Peak learning rate (AdamW).")
    warmup_ratio: float = Field(0.05, ge=0, lt=1, description="Fraction of steps with linear warmup.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine decay floor, as a fraction of the peak.")
    weight_decay: float = Field(0.01, ge=0, le=1)
    max_grad_norm: float = Field(1.0, gt=0)
    max_seq_len: int = Field(2048, ge=16, description="Longer trajectories are skipped (counted).")
    seed: int = Field(0, ge=0, description="Seeds the data order.")
    copy_steps: int = Field(
        0, ge=0, description="Steps of a synthetic copying curriculum run before imitation (see `copy_batches`); "
                             "helps a model trained from scratch to learn to copy ids. 0 for pretrained models.")
    copy_batch_size: int = Field(32, ge=1, description="Sequences per copying step (short: ~60 tokens each).")


@dataclass
class SFTExample:
    input_ids: list[int]
    loss_mask: list[bool]  # True where the token is an assistant token (a training target)
    group: int = 0  # batches hold one group only: 1 = a guided trajectory (guidance block in its prompt), else 0

    @property
    def first_target(self) -> int:
        return self.loss_mask.index(True)


@dataclass
class SFTResult:
    steps: int
    seconds: float
    tokens_seen: int
    target_tokens: int
    final_loss: float
    losses: list[float]
    skipped_long: int
    copy_steps: int = 0
    #: ThreadTuner decisions: (step, phase, threads chosen, {threads: seconds per 1k tokens}).
    thread_decisions: list = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_seen / self.seconds if self.seconds else 0.0

    @property
    def copy_final_loss(self) -> float | None:
        """Mean loss of the last 20 copying steps (None without a copying phase). Measured here:
        ~0.07-0.09 once induction has formed; a value well above that means the model will
        mis-copy ids in every episode."""
        if not self.copy_steps:
            return None
        tail = self.losses[max(0, self.copy_steps - 20):self.copy_steps]
        return sum(tail) / len(tail)


def build_examples(tokenizer: Any, trajectories: Sequence[Trajectory], *, chat: ChatFormat | None = None
                   ) -> list[SFTExample]:
    """Tokenize trajectories with the chat template; mark assistant tokens."""
    chat = chat or ChatFormat(tokenizer)
    out = []
    for traj in trajectories:
        text, spans = chat.assistant_spans(traj.messages, traj.tools)
        if not spans:
            continue
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = _inside_spans(enc["offset_mapping"], spans)
        if not any(mask):
            raise FailedPrecondition("no token falls inside an assistant span: the tokenizer's offsets do not "
                                     "match the rendered text (a fast tokenizer is required)")
        out.append(SFTExample(list(enc["input_ids"]), mask, group=int(has_guidance_block(traj.messages))))
    return out


def _inside_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each token's character range, whether it is non-empty and lies inside one of `spans`
    (disjoint character ranges).

    Semantics: [end > start and any(s <= start and end <= e for s, e in spans) for start, end in offsets].
    A token can only lie in the first span ending at or after its end (the spans are disjoint), found
    by bisection: the direct form costs tokens x spans (about a minute for the micro agent's 2,000
    conversations of ~1,400 tokens and ~10 replies each)."""
    ordered = sorted(spans)
    ends = [e for _, e in ordered]
    out = []
    for start, end in offsets:
        i = bisect.bisect_left(ends, end)
        out.append(end > start and i < len(ordered) and ordered[i][0] <= start)
    return out


def _batches(examples: Sequence[SFTExample], batch_size: int, rng: random.Random):
    """Endless length-bucketed batches of one group each: shuffle; per group (in the shuffled
    order), sort chunks of 8 batches by length and cut them into batches; shuffle the batches.
    With one group this is exactly the ungrouped scheme. A group's last short batch is dropped
    unless the group has fewer than `batch_size` examples."""
    order = list(range(len(examples)))
    groups = sorted({e.group for e in examples})
    while True:
        rng.shuffle(order)
        chunk = batch_size * 8
        batches = []
        for g in groups:
            members = [j for j in order if examples[j].group == g] if len(groups) > 1 else order
            for i in range(0, len(members), chunk):
                part = sorted(members[i:i + chunk], key=lambda j: len(examples[j].input_ids))
                batches += [(part[k:k + batch_size], len(members) < batch_size)
                            for k in range(0, len(part), batch_size)]
        rng.shuffle(batches)
        for b, small_group in batches:
            if len(b) == batch_size or small_group:
                yield [examples[j] for j in b]


def copy_batches(examples: Sequence[SFTExample], batch_size: int, rng: random.Random):
    """Endless batches of a copying task built from the domain's own token stream.

    Semantics (one sequence):
        W = a window of 6..24 tokens of some example (after its system prompt)
        F = a window of 4..48 tokens of another example
        x = W ++ F ++ W;  targets = the second W, except its first token (unpredictable)

    A model trained from scratch copies ids (emails, order and item ids) only once it has
    formed induction heads; on these short sequences they form within a few hundred cheap
    steps, which the imitation phase then reuses (every copied id is a target there).
    """
    longest = max(len(e.input_ids) - e.first_target for e in examples)  # tokens after the prompt
    if longest < 8:
        raise InvalidArgument(field="examples", expected="an example with at least 8 tokens after its prompt "
                              "for the copying curriculum", got=longest, fix="Set copy_steps=0 for such short data.")

    def window(length: int) -> list[int]:
        length = min(length, longest - 1)  # some example always fits, so the draw below ends
        while True:
            e = examples[rng.randrange(len(examples))]
            lo, hi = e.first_target - 1, len(e.input_ids) - length
            if hi > lo:
                start = rng.randrange(lo, hi)
                return e.input_ids[start:start + length]

    while True:
        batch = []
        for _ in range(batch_size):
            w, f = window(rng.randint(6, 24)), window(rng.randint(4, 48))
            ids = w + f + w
            mask = [False] * (len(w) + len(f) + 1) + [True] * (len(w) - 1)
            batch.append(SFTExample(ids, mask))
        yield batch


def _lr_lambda(cfg: SFTConfig) -> Callable[[int], float]:
    total = cfg.steps + cfg.copy_steps
    warm = max(1, int(total * cfg.warmup_ratio))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total - warm)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def _shared_prefix(batch: Sequence[SFTExample]) -> int:
    first = batch[0].input_ids
    p = min(e.first_target for e in batch) - 1
    for e in batch[1:]:
        n = 0
        limit = min(p, len(e.input_ids))
        while n < limit and e.input_ids[n] == first[n]:
            n += 1
        p = n
    return max(p, 0)


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body and the output projection of a causal LM (through a PEFT wrapper)."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = getattr(lm, "model", None), getattr(lm, "lm_head", None)
    if decoder is None or head is None:
        raise InvalidArgument(field="model", expected="a Hugging Face causal LM with .model and .lm_head "
                              "(Qwen3ForCausalLM, LlamaForCausalLM, or a PEFT model over one)",
                              got=type(lm).__name__)
    return decoder, head


def batch_loss(model: torch.nn.Module, batch: Sequence[SFTExample], pad_id: int, *, share_prefix: bool = True
               ) -> tuple[torch.Tensor, int, int]:
    """(mean CE over target tokens, tokens run through the model, target tokens).

    Rows are right-padded and run without an attention mask: in a causal model no real token
    attends to a later (padding) position, so the targets' logits are those of the unpadded rows,
    and transformers can hand SDPA a plain causal mask instead of a padded one. Only the target
    positions go through the output projection (about 1 token in 9 of an imitation row, 1 in 4
    of a copying row): the loss is the same, without the [B, S, V] logits of the other positions."""
    device = next(model.parameters()).device
    decoder, head = _decoder_and_head(model)
    b = len(batch)
    p = _shared_prefix(batch) if share_prefix and b > 1 else 0
    cache = None
    if p >= 16:
        cache = DynamicCache(config=model.config)
        prefix = torch.tensor([batch[0].input_ids[:p]], dtype=torch.long, device=device)  # [1, P]
        decoder(input_ids=prefix, cache=cache, use_cache=True)
        for layer in cache.layers:
            layer.keys = layer.keys.expand(b, -1, -1, -1)      # [B, heads, P, d]
            layer.values = layer.values.expand(b, -1, -1, -1)
    else:
        p = 0
    width = max(len(e.input_ids) for e in batch) - p
    ids = torch.full((b, width), pad_id, dtype=torch.long)           # [B, S]
    targets = torch.full((b, width), -100, dtype=torch.long)         # [B, S]: the token after each position
    n_real = 0
    for row, e in enumerate(batch):
        seq = e.input_ids[p:]
        ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        n_real += len(seq)
        tgt = [t if m else -100 for t, m in zip(e.input_ids[p + 1:], e.loss_mask[p + 1:], strict=True)]
        targets[row, :len(tgt)] = torch.tensor(tgt, dtype=torch.long)
    ids, targets = ids.to(device), targets.to(device)
    kwargs: dict[str, Any] = {}
    if cache is not None:
        kwargs = {"cache": cache, "use_cache": True,
                  "position_ids": (p + torch.arange(width, device=device))[None].expand(b, -1)}
    hidden = decoder(input_ids=ids, **kwargs).last_hidden_state      # [B, S, H]
    keep = targets != -100                                            # [B, S]
    logits = head(hidden[keep]).float()                               # [N, V]
    n_targets = int(keep.sum())
    loss = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="sum") / max(1, n_targets)
    return loss, p + n_real, n_targets


#: `on_step(step, total, loss, phase)`: after every optimizer step (1-based over both phases;
#: phase "copying" or "imitation").
StepCallback = Callable[[int, int, float, str], None]


def train(model: torch.nn.Module, examples: Sequence[SFTExample], cfg: SFTConfig, pad_id: int, *,
          log: Callable[[str], None] | None = None, log_every: int = 25, on_step: StepCallback | None = None,
          stop_after: int | None = None, tune_threads: bool = True) -> SFTResult:
    """Run `cfg.copy_steps` copying steps, then `cfg.steps` imitation steps on `examples`
    (AdamW on all trainable parameters of `model`).

    `stop_after=N` runs only the first N steps of that schedule (same data order and learning
    rates: what a replay of a recorded build's first losses needs). `tune_threads` lets a
    `ThreadTuner` pick torch's thread count as it goes in runs of at least `threads.MIN_STEPS`
    steps (threads.py: on a shared 2-core machine one thread can be 7x faster than two); the
    count in force before is restored at the end."""
    kept = [e for e in examples if len(e.input_ids) <= cfg.max_seq_len]
    skipped = len(examples) - len(kept)
    if not kept:
        raise InvalidArgument(field="examples", expected=f"at least one sequence of <= {cfg.max_seq_len} tokens",
                              fix="Raise max_seq_len or use shorter trajectories.")
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.learning_rate, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    rng = random.Random(f"sft:{cfg.seed}")
    batches = _batches(kept, cfg.batch_size, rng)
    copies = copy_batches(kept, cfg.copy_batch_size, random.Random(f"sft-copy:{cfg.seed}"))
    model.train()
    losses: list[float] = []
    seen = targets = 0
    started = time.perf_counter()
    total = cfg.copy_steps + cfg.steps
    run = total if stop_after is None else min(total, stop_after)
    threads_before = torch.get_num_threads()
    tuner = ThreadTuner() if tune_threads and run >= MIN_TUNED_STEPS else None
    try:
        for step in range(run):
            phase = "copying" if step < cfg.copy_steps else "imitation"
            batch = next(copies) if step < cfg.copy_steps else next(batches)
            if tuner is not None:
                tuner.before(step, phase)
            t0 = time.perf_counter()
            loss, n_tok, n_tgt = batch_loss(model, batch, pad_id)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().item())
            if tuner is not None:
                tuner.after(step, time.perf_counter() - t0, n_tok)
            seen += n_tok
            targets += n_tgt
            if on_step is not None:
                on_step(step + 1, total, losses[-1], phase)
            if log is not None and (step + 1) % log_every == 0:
                window = losses[-log_every:]
                log(f"step {step + 1}/{total} {phase} loss {sum(window) / len(window):.4f} "
                    f"lr {sched.get_last_lr()[0]:.2e} {seen / (time.perf_counter() - started):.0f} tok/s")
    finally:
        torch.set_num_threads(threads_before)
    model.eval()
    tail = losses[-max(1, min(20, len(losses))):]
    return SFTResult(steps=run, seconds=time.perf_counter() - started, tokens_seen=seen,
                     target_tokens=targets, final_loss=sum(tail) / len(tail), losses=losses, skipped_long=skipped,
                     copy_steps=min(cfg.copy_steps, run), thread_decisions=tuner.decisions if tuner else [])


@torch.no_grad()
def teacher_forced_accuracy(model: torch.nn.Module, examples: Sequence[SFTExample], pad_id: int,
                            batch_size: int = 8) -> dict[str, float]:
    """Greedy agreement with held-out expert replies under teacher forcing.

    `token_accuracy`: fraction of target tokens that are the model's argmax;
    `turn_exact`: fraction of assistant replies whose every token is the argmax (the reply
    greedy decoding would reproduce, given the same history).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    hit = total = turns_ok = turns = 0
    for i in range(0, len(examples), batch_size):
        batch = examples[i:i + batch_size]
        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long, device=device)  # [B, T]
        mask = torch.zeros_like(ids)
        for row, e in enumerate(batch):
            ids[row, :len(e.input_ids)] = torch.tensor(e.input_ids)
            mask[row, :len(e.input_ids)] = 1
        pred = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)  # [B, T]
        for row, e in enumerate(batch):
            ok_turn, in_turn = True, False
            for t in range(1, len(e.input_ids)):
                if e.loss_mask[t]:
                    in_turn = True
                    good = int(pred[row, t - 1]) == e.input_ids[t]
                    hit += good
                    total += 1
                    ok_turn = ok_turn and good
                elif in_turn:
                    turns += 1
                    turns_ok += ok_turn
                    ok_turn, in_turn = True, False
            if in_turn:
                turns += 1
                turns_ok += ok_turn
    if was_training:
        model.train()
    return {"token_accuracy": hit / max(1, total), "turn_exact": turns_ok / max(1, turns)}
