"""A tiny real base model for the built-in store domain, saved as a Hugging Face directory: a
byte-level BPE tokenizer trained on the scripted expert's rendered precondition_check episodes
and a random 2-layer Qwen3. It plays badly (it is random) -- trainer-service tests need a model
the worker process can load and a real environment, not a good policy."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from trace_common.agents.tokenizer import train_tokenizer
from trace_common.domains.store.env import StoreEnv
from trace_common.domains.store.expert import ExpertConfig, StoreExpert
from trace_common.env import run_episode
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, render_template_text

ENV_PARAMS = {"task_types": "precondition_check"}


def store_texts(n: int = 24) -> list[str]:
    env = StoreEnv(task_types="precondition_check")
    expert = StoreExpert(ExpertConfig())
    out = []
    for seed in range(n):
        env.reset(seed)
        traj = run_episode(env, expert.policy_for(env, expert.skill_flags(seed, 0)), seed)
        out.append(render_template_text(TRACE_CHATML_TEMPLATE, traj.messages, traj.tools))
    return out


def save_store_model(directory: Path, *, seed: int = 0) -> Path:
    tok = train_tokenizer(store_texts(), vocab_size=1200, model_max_length=8192)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory

