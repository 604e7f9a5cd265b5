"""`build_micro` end to end at toy scale (seconds): tokenizer, model, warm start, HF dir, cache
record -- and the result loads in the in-process policy and plays an episode."""

from __future__ import annotations

import asyncio

from transformers import AutoModelForCausalLM, AutoTokenizer

from trace_common.agents import MicroConfig, SFTConfig, WarmStartData, read_meta, resolve_base_agent
from trace_common.domains.store import StoreEnv
from trace_common.policy import SamplingParams
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE
from trace_common.policy.episodes import play_episodes
from trace_common.policy.transformers_backend import TransformersPolicy

TOY = MicroConfig(hidden_size=64, num_layers=1, intermediate_size=64, num_kv_heads=1, vocab_size=512,
                  data=WarmStartData(episodes=12, task_types="precondition_check"),
                  sft=SFTConfig(steps=2, batch_size=2, copy_steps=2, copy_batch_size=4))


def test_toy_micro_build_is_a_usable_cached_hf_dir(tmp_path):
    model_dir = resolve_base_agent("micro", tmp_path, config=TOY)
    assert resolve_base_agent("micro", tmp_path, config=TOY) == model_dir  # cached
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.model_type == "qwen3" and model.config.head_dim == 64
    assert model.config.vocab_size == len(tok) <= 512
    assert tok.chat_template == TRACE_CHATML_TEMPLATE
    assert model.generation_config.top_k == 0 and model.generation_config.top_p == 1.0
    meta = read_meta(model_dir)
    assert meta["metrics"]["examples"] == 12 and 0 <= meta["metrics"]["held_out_token_accuracy"] <= 1

    async def play():
        policy = TransformersPolicy.from_dir(model_dir)
        try:
            return await play_episodes(lambda: StoreEnv(task_types="precondition_check"), policy,
                                       [(1_000_002, 0)], SamplingParams(seed=0, max_tokens=8), max_turns=2)
        finally:
            await policy.close()

    (traj,) = asyncio.run(play())
    assert 1 <= traj.assistant_turns() == len(traj.turns) <= 2
