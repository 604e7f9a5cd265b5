"""Runtime LoRA updating against an in-test server that mimics vLLM's endpoints (fake_vllm.py):
load -> verify -> switch -> unload the old version once drained; retries, timeouts, refusals."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.trainer.grpo.batch import build_sequences
from services.trainer.grpo.config import GRPOConfig, VLLMRolloutConfig
from services.trainer.grpo.lora import attach_lora, save_pretrained_to
from services.trainer.grpo.session import make_trainer
from services.trainer.grpo.vllm_rollouts import AdapterLoadError, VLLMAdapterManager
from services.trainer.jobspec import adapter_lineage
from tests.unit.trainer.grpo.fake_vllm import FakeVLLM
from tests.unit.trainer.grpo.helpers import PickEnv, tiny_model, tiny_tokenizer, warm_model
from trace_common.env.guidance import CLOSE, OPEN


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    model = attach_lora(tiny_model(), GRPOConfig(lora_r=4))
    return [str(p.parent) for p in (save_pretrained_to(model, root / f"a{i}")[0] for i in range(3))]


@pytest.fixture()
def server():
    tok = tiny_tokenizer()
    with FakeVLLM(tiny_model(), [tok.convert_tokens_to_ids("<|im_end|>")], tok.pad_token_id) as s:
        yield s


def manager(server, **kw) -> VLLMAdapterManager:
    cfg = dict(base_url=server.base_url, adapter_dir="/unused", request_timeout_s=5.0, load_retries=2,
               retry_backoff_s=0.01, drain_timeout_s=5.0)
    cfg.update(kw)
    return VLLMAdapterManager(VLLMRolloutConfig(**cfg))


def test_switch_unloads_previous_only_when_drained(server, adapter_dirs):
    async def go():
        m = manager(server)
        await m.switch("cap-v1", adapter_dirs[0])
        held = m.acquire()                       # a request still running on v1
        await m.switch("cap-v2", adapter_dirs[1])
        await asyncio.sleep(0.1)
        assert m.current == "cap-v2" and "cap-v1" in server.adapters   # not unloaded under a running request
        m.release(held)
        await asyncio.sleep(0.1)
        assert "cap-v1" not in server.adapters and server.unloads == ["cap-v1"]
        await m.close()
    asyncio.run(go())


def test_drain_timeout_never_hangs(server, adapter_dirs):
    async def go():
        m = manager(server, drain_timeout_s=0.2)
        await m.switch("cap-v1", adapter_dirs[0])
        m.acquire()                              # never released (a stuck request)
        await m.switch("cap-v2", adapter_dirs[1])
        t0 = time.monotonic()
        await m.close()                          # waits for the pending unload
        assert time.monotonic() - t0 < 2.0
        assert server.unloads == ["cap-v1"]
    asyncio.run(go())


@pytest.mark.parametrize("knobs, retries, ok, attempts, match", [
    ({"fail_loads": 2}, 2, True, 3, None),                       # transient 500s: retried
    ({"fail_loads": 5}, 2, False, 3, "after 3 attempts"),        # persistent: fails with the reason
    ({"reject_loads": True}, 3, False, 1, "refused"),            # a 4xx refusal is not retried
    ({"hide_loaded": True}, 1, False, 2, "not listed"),          # loaded but never verified
])
def test_load_failures(server, adapter_dirs, knobs, retries, ok, attempts, match):
    for k, v in knobs.items():
        setattr(server, k, v)

    async def go():
        m = manager(server, load_retries=retries)
        try:
            if ok:
                await m.switch("cap-v1", adapter_dirs[0])
                assert m.current == "cap-v1"
            else:
                with pytest.raises(AdapterLoadError, match=match):
                    await m.switch("cap-v1", adapter_dirs[0])
                assert m.current is None
        finally:
            await m.close()
    asyncio.run(go())
    assert len(server.loads) == attempts


def test_already_loaded_after_a_lost_reply_is_verified(server, adapter_dirs):
    async def go():
        m = manager(server)
        await m.load("cap-v1", adapter_dirs[0])
        await m.load("cap-v1", adapter_dirs[0])  # "already been loaded" -> listed -> fine
        await m.close()
    asyncio.run(go())
    assert server.loads == ["cap-v1", "cap-v1"]


def test_load_timeout_fails_in_bounded_time(server, adapter_dirs):
    server.load_delay_s = 1.0

    async def go():
        m = manager(server, request_timeout_s=0.2, load_retries=1)
        t0 = time.monotonic()
        with pytest.raises(AdapterLoadError, match="ReadTimeout"):
            await m.switch("cap-v1", adapter_dirs[0])
        assert time.monotonic() - t0 < 3.0
        await m.close()
    asyncio.run(go())


def vllm_grpo(server, adapter_dir, **kw) -> GRPOConfig:
    """A tiny GRPO config whose rollouts come from `server`, versions saved under `adapter_dir`."""
    values = dict(max_steps=2, groups_per_batch=2, num_generations=4, max_completion_length=4, learning_rate=5e-3,
                  lora_r=4, save_steps=0, guidance_fraction=0.0, early_stop_uninformative_iterations=0,
                  rollout_backend="vllm", vllm={"base_url": server.base_url, "adapter_dir": str(adapter_dir)})
    return GRPOConfig(**{**values, **kw})


def pick_server(tok) -> FakeVLLM:
    return FakeVLLM(warm_model("pick"), [tok.convert_tokens_to_ids("<|im_end|>")], tok.pad_token_id)


def test_training_with_vllm_rollouts(tmp_path):
    tok = tiny_tokenizer()
    with pick_server(tok) as server:
        cfg = vllm_grpo(server, tmp_path)
        rows = []
        trainer = make_trainer(cfg, warm_model("pick"), tok, PickEnv, capability="pick_skill",
                               on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
        trainer.train(resume=False, write_adapter=False)
        versions = int(rows[-1]["policy_version"])
        names = [f"pick_skill-v{v}" for v in range(versions + 1)]
        assert server.loads == names                      # every version loaded once, in order
        assert server.unloads == names[:-1]               # old versions unloaded, the current one kept
        assert set(server.completions) <= set(names[:-1]) and server.completions
        assert (tmp_path / names[-1] / "adapter_model.safetensors").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == [names[-1]]   # unloaded versions' files removed
        assert all(r["policy_errors"] == 0 for r in rows)


@pytest.mark.parametrize("fraction, guided", [(0.5, 2), (0.25, 1), (0.0, 0)])
def test_vllm_rollouts_show_the_block_in_the_guided_share_and_train_on_the_plain_prompt(tmp_path, fraction, guided):
    tok = tiny_tokenizer()
    with pick_server(tok) as server:
        cfg = vllm_grpo(server, tmp_path, guidance_fraction=fraction, max_steps=1)
        trainer = make_trainer(cfg, warm_model("pick"), tok, lambda: PickEnv(hint=True), capability="pick_skill")
        updates: list = []
        update = trainer._update
        trainer._update = lambda episodes: (updates.append(episodes), update(episodes))[1]
        trainer.train(resume=False, write_adapter=False)
        prompts = [tok.decode(p) for p in server.prompts]
    assert len(prompts) == cfg.groups_per_batch * cfg.num_generations      # one turn per episode
    shown = [p for p in prompts if OPEN in p]
    assert len(shown) == cfg.groups_per_batch * guided
    for p in shown:  # the instance's guidance, as the block at the end of the system prompt
        system, user = p.split("<|im_start|>user", 1)
        assert "Hint: the answer is" in system and OPEN not in user
        assert system.rstrip().endswith(f"{CLOSE}<|im_end|>")
    assert all("Hint:" not in p for p in prompts if OPEN not in p)
    assert updates, "no informative group: nothing was trained on"
    for episodes in updates:   # every kept group keeps its guided share; the update sees the plain prompts only
        assert sum(e.guided for e in episodes) == len(episodes) // cfg.num_generations * guided
        assert all(OPEN not in tok.decode(s.input_ids) and "Hint:" not in tok.decode(s.input_ids)
                   for s in build_sequences(episodes))


@pytest.mark.parametrize("first, second, apart", [
    ("runs/r1/adapters/pick_skill", "runs/r2/adapters/pick_skill", True),    # two runs: kept apart
    ("runs/r1/adapters/pick_skill", "runs/r1/adapters/pick_skill", False),   # resumed checkpoints: replaces
])
def test_two_jobs_of_one_capability_on_one_server(tmp_path, first, second, apart):
    """Two GRPO jobs of the same capability against one vLLM server, one after the other: the
    second neither replaces nor unloads nor deletes the first's served version unless it continues
    the same checkpoints (then the earlier attempt's leftovers are stale and replaced)."""
    tok = tiny_tokenizer()
    with pick_server(tok) as server:
        cfg = vllm_grpo(server, tmp_path, max_steps=1, num_generations=2)
        served = []
        for prefix in (first, second):
            trainer = make_trainer(cfg, warm_model("pick"), tok, PickEnv, capability="pick skill",
                                   lineage=adapter_lineage(prefix))
            trainer.train(resume=False, write_adapter=False)
            served.append(trainer.engine.manager.current)
            server.completions.clear()
        assert served[0].startswith(f"pick_skill-{adapter_lineage(first)}-v")
        assert served[1].startswith(f"pick_skill-{adapter_lineage(second)}-v")
        assert (served[0] == served[1]) is (not apart)
        assert (served[0] in server.unloads) is (not apart)        # replaced only on the same checkpoints
        assert served[0] in server.adapters and served[1] in server.adapters
        assert all((tmp_path / name / "adapter_model.safetensors").is_file() for name in served)   # files kept


@pytest.mark.parametrize("room, outcome", [
    (None, 16),              # the server reports no context length: max_tokens as asked
    (4000, 16),              # room enough
    (6, 6),                  # the reply gets the room left (vLLM would refuse prompt + 16)
    (0, "exhausted"),        # no room: the episode ends (ContextExhausted) and nothing is sent
])
def test_vllm_replies_get_the_room_left_in_the_context(server, adapter_dirs, room, outcome):
    """As the in-process backend: max_tokens shrinks to the server's context left after the prompt
    (`room`: the context is the prompt's length + room), and a prompt that leaves none ends the
    episode, not as a policy error."""
    from services.trainer.grpo.vllm_rollouts import VLLMPolicy
    from trace_common.env import Message
    from trace_common.errors import ContextExhausted
    from trace_common.policy.base import PolicyRequest, SamplingParams

    tok = tiny_tokenizer()
    request = PolicyRequest(messages=[Message.user("hello there")], params=SamplingParams(max_tokens=16, seed=0))

    async def go():
        m = manager(server)
        policy = VLLMPolicy(m, tok)
        n_prompt = len(policy.encode(policy.chat.render(request.messages, [], add_generation_prompt=True)))
        server.max_model_len = None if room is None else n_prompt + room
        await m.switch("cap-v1", adapter_dirs[0])            # lists the models: the context length is read
        try:
            return await policy.complete(request)
        finally:
            await m.close()

    if outcome == "exhausted":
        with pytest.raises(ContextExhausted, match="context"):
            asyncio.run(go())
        assert server.max_tokens_asked == []
    else:
        turn = asyncio.run(go())
        assert server.max_tokens_asked == [outcome] and len(turn.completion_token_ids) <= outcome


def test_a_vllm_context_refusal_ends_the_episode(server, adapter_dirs):
    """A server whose context the manager has not read (a length set after the last listing) refuses
    prompt + max_tokens with vLLM's own 400: that is ContextExhausted too, not a policy error."""
    from services.trainer.grpo.vllm_rollouts import VLLMPolicy
    from trace_common.env import Message
    from trace_common.errors import ContextExhausted
    from trace_common.policy.base import PolicyRequest, SamplingParams

    request = PolicyRequest(messages=[Message.user("hello there")], params=SamplingParams(max_tokens=16, seed=0))

    async def go():
        m = manager(server)
        await m.switch("cap-v1", adapter_dirs[0])
        server.max_model_len = 8                              # after the listing: unknown to the manager
        try:
            return await VLLMPolicy(m, tiny_tokenizer()).complete(request)
        finally:
            await m.close()

    with pytest.raises(ContextExhausted, match="vLLM HTTP 400: .*maximum context length is 8 tokens"):
        asyncio.run(go())
