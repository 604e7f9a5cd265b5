"""In-process policy: a local Hugging Face causal LM (optionally with a PEFT adapter).

    policy = TransformersPolicy.from_dir("/models/micro", adapter_dir=None)
    turns = await policy.generate([PolicyRequest(messages, tools, SamplingParams(seed=1))])

Requests from concurrent episodes are gathered by a `RequestBatcher` (up to `max_batch`,
waiting `max_wait_s` for company) and generated together by `generation.generate_batch`
on one worker thread, so the asyncio loop stays responsive. Prompts are rendered with the
model's chat template (`ChatFormat`), replies parsed by `parse_assistant_text`.

A PEFT adapter is merged into the freshly loaded base weights by default
(`merge_and_unload`): unmerged LoRA generates 1.3-1.7x slower on CPU (measured on the project's machines). Pass
`merge_adapter=False` to keep it unmerged (e.g. to compare with a training-time model); a bfloat16 or
float16 model always keeps it unmerged (half precision cannot hold most of a LoRA delta).
`from_model` wraps a model object owned by someone else (the GRPO trainer): no copy is
made, and the prefix KV cache notices in-place weight updates (see `PrefixCache`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trace_common.errors import ContextExhausted, InvalidArgument, NotFound, TraceError
from trace_common.hf_load import load_causal_lm
from trace_common.policy.base import AssistantTurn, Policy, PolicyRequest
from trace_common.policy.batcher import RequestBatcher
from trace_common.policy.chat import ChatFormat, Mode
from trace_common.policy.errors import PolicyUnavailable
from trace_common.policy.generation import (
    GenerationOutput,
    PrefixCache,
    RowParams,
    generate_batch,
    stop_token_ids,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TransformersPolicy(Policy):
    """Batched generation with a transformers model on this process's CPU or GPU."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, name: str = "model", adapter: str | None = None,
                 max_batch: int = 32, max_wait_s: float = 0.005, chat_mode: Mode = "auto",
                 prefix_cache_bytes: int = 1 << 30, max_context: int | None = None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.adapter = adapter
        self.chat = ChatFormat(tokenizer, chat_mode)
        self.stop_ids = stop_token_ids(tokenizer, model)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.pad_id = int(pad)
        self.prefix_cache = PrefixCache(max_bytes=prefix_cache_bytes)
        config_ctx = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_context = int(max_context or config_ctx or 4096)
        self._batcher: RequestBatcher[PolicyRequest, AssistantTurn | TraceError] = RequestBatcher(
            self._generate_sync, max_batch=max_batch, max_wait_s=max_wait_s)
        model.eval()

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, model_dir: str | Path, *, adapter_dir: str | Path | None = None, merge_adapter: bool = True,
                 dtype: str = "float32", device: str = "cpu", **kwargs: Any) -> TransformersPolicy:
        """Load a local HF model directory (config + weights + tokenizer), optionally with a
        PEFT adapter directory (merged into this process's copy unless `merge_adapter=False`)."""
        from transformers import AutoTokenizer

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise NotFound(f"{model_dir} is not a Hugging Face model directory (no config.json); "
                           "give a directory written by save_pretrained")
        if dtype not in _DTYPES:
            raise InvalidArgument(field="dtype", expected=" | ".join(_DTYPES), got=dtype)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = load_causal_lm(model_dir, dtype=_DTYPES[dtype], device=device)
        adapter = None
        if adapter_dir is not None:
            from peft import PeftModel

            adapter_dir = Path(adapter_dir)
            if not (adapter_dir / "adapter_config.json").is_file():
                raise NotFound(f"{adapter_dir} is not a PEFT adapter directory (no adapter_config.json)")
            model = PeftModel.from_pretrained(model, adapter_dir)
            # this process loaded its own copy: merge in place, unless the weights are half precision, which
            # cannot hold most of a LoRA delta (it lies below their precision): then PEFT applies it unmerged
            if merge_adapter and dtype == "float32":
                model = model.merge_and_unload()
            adapter = str(adapter_dir)
        kwargs.setdefault("name", str(model_dir))
        return cls(model, tokenizer, adapter=adapter, **kwargs)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, **kwargs: Any) -> TransformersPolicy:
        """Wrap a model object without copying it (it is shared with its owner)."""
        return cls(model, tokenizer, **kwargs)

    # -- Policy API ----------------------------------------------------------------------------
    async def generate(self, requests: Sequence[PolicyRequest]) -> list[AssistantTurn]:
        results = await self._batcher.submit_many(list(requests))
        for result in results:
            if isinstance(result, TraceError):
                raise result
        return results  # type: ignore[return-value]

    async def close(self) -> None:
        await self._batcher.close()

    @property
    def batch_sizes(self) -> list[int]:
        return self._batcher.batch_sizes

    def render(self, request: PolicyRequest) -> str:
        return self.chat.render(request.messages, request.tools, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- the batch function (worker thread) ---------------------------------------------------
    def _prepare(self, request: PolicyRequest) -> tuple[list[int], RowParams] | TraceError:
        try:
            ids = self.encode(self.render(request))
        except TraceError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - a template error fails this request only
            return PolicyUnavailable(f"cannot render the conversation with the chat template: "
                                     f"{type(exc).__name__}: {exc}", kind="backend_error")
        room = self.max_context - len(ids)
        if room < 1:
            return ContextExhausted(f"the prompt has {len(ids)} tokens but the model's context is "
                                    f"{self.max_context}")
        p = request.params
        return ids, RowParams(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                              max_tokens=min(p.max_tokens, room), seed=p.seed)

    def _generate_sync(self, requests: list[PolicyRequest]) -> list[AssistantTurn | TraceError]:
        started = time.perf_counter()
        prepared = [self._prepare(r) for r in requests]
        ok = [i for i, p in enumerate(prepared) if not isinstance(p, TraceError)]
        outputs: dict[int, GenerationOutput] = {}
        if ok:
            prompts = [prepared[i][0] for i in ok]  # type: ignore[index]
            params = [prepared[i][1] for i in ok]  # type: ignore[index]
            try:
                gen = self._run(prompts, params)
            except (RuntimeError, ValueError, IndexError) as exc:
                self.stats.record_failure("backend_error")
                err = PolicyUnavailable(f"generation failed: {type(exc).__name__}: {exc}", kind="backend_error")
                return [err for _ in requests]
            outputs = dict(zip(ok, gen, strict=True))
        seconds = time.perf_counter() - started
        self.stats.record_batch(seconds)
        results: list[AssistantTurn | TraceError] = []
        for i, request in enumerate(requests):
            prep = prepared[i]
            if isinstance(prep, TraceError):
                self.stats.record_failure("bad_request")
                results.append(prep)
                continue
            out = outputs[i]
            results.append(self._turn(request, prep[0], out, seconds))
        return results

    def _run(self, prompts: list[list[int]], params: list[RowParams]) -> list[GenerationOutput]:
        """Generate one batch of rendered prompts (subclasses change how the model runs, e.g. routing)."""
        return generate_batch(self.model, prompts, params, stop_ids=self.stop_ids, pad_id=self.pad_id,
                              prefix_cache=self.prefix_cache)

    def _turn(self, request: PolicyRequest, prompt_ids: list[int], out: GenerationOutput,
              seconds: float) -> AssistantTurn:
        body = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        turn = AssistantTurn.from_text(
            text, request.turn_index, prompt_token_ids=prompt_ids, completion_token_ids=list(out.token_ids),
            logprobs=list(out.logprobs), finish_reason=out.finish_reason, prompt_tokens=len(prompt_ids),
            completion_tokens=len(out.token_ids), seconds=seconds)
        self.stats.record_turn(turn)
        return turn
