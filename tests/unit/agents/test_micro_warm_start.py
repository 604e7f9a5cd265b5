"""Warm-start a small `micro` agent on one task type with a planted gap, then play it through the
in-process backend: it must write well-formed tool calls and inherit the gap (slow: minutes)."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from trace_common.agents import MicroConfig, SFTConfig, WarmStartData, read_meta, resolve_base_agent
from trace_common.domains.store import SPLITS, StoreEnv
from trace_common.policy import SamplingParams
from trace_common.policy.episodes import play_episodes
from trace_common.policy.transformers_backend import TransformersPolicy

pytestmark = pytest.mark.slow

#: The expert checks the order's status before cancelling in 20 % of its episodes only.
GAP = {"precondition_verification": 0.2}
CONFIG = MicroConfig(
    hidden_size=256, num_layers=3, intermediate_size=768, num_kv_heads=2,
    data=WarmStartData(episodes=600, task_types="precondition_check", skills=GAP),
    sft=SFTConfig(steps=150, batch_size=8, learning_rate=1.5e-3, copy_steps=150, copy_batch_size=32))


def _skipped_check(traj) -> bool | None:
    """True when the first cancel came before any order lookup; None without a cancel."""
    looked = False
    for m in traj.messages:
        for call in (m.tool_calls or []) if m.role == "assistant" else []:
            if call.function.name == "get_order_details":
                looked = True
            if call.function.name == "cancel_pending_order":
                return not looked
    return None


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory):
    return resolve_base_agent("micro", tmp_path_factory.mktemp("agents"), config=CONFIG)


def test_build_is_a_loadable_hf_dir_with_a_record(micro_dir):
    model = AutoModelForCausalLM.from_pretrained(micro_dir)
    tok = AutoTokenizer.from_pretrained(micro_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.head_dim == 64
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 10_000_000
    assert "<tool_call>" in tok.chat_template and tok.eos_token == "<|im_end|>"
    meta = read_meta(micro_dir)
    assert meta["build_seconds"] > 0 and meta["config"] == CONFIG.model_dump(mode="json")


def test_emits_well_formed_tool_calls_and_inherits_the_gap(micro_dir):
    async def play():
        policy = TransformersPolicy.from_dir(micro_dir)
        try:
            seeds = list(SPLITS["test"])[:96]
            return await play_episodes(lambda: StoreEnv(task_types="precondition_check"), policy,
                                       [(s, 0) for s in seeds], SamplingParams(temperature=1.0, seed=3))
        finally:
            await policy.close()

    trajs = asyncio.run(play())
    replies = [m for t in trajs for m in t.messages if m.role == "assistant"]
    call_turns = [m for m in replies if m.tool_calls]
    malformed = sum(len(e["errors"]) for t in trajs for e in t.info["parse_errors"])
    assert len(call_turns) / len(replies) > 0.5  # the expert makes 2 calls per reply to the user
    assert 1 - malformed / sum(len(m.tool_calls) for m in call_turns) > 0.9
    # The planted gap: the expert skips the status check in ~80 % of its episodes; so does the agent.
    verdicts = [v for v in map(_skipped_check, trajs) if v is not None]
    assert len(verdicts) >= 6, verdicts  # a 3-layer model trained for 150 steps cancels in ~1 of 6 episodes
    assert sum(verdicts) / len(verdicts) >= 0.5
