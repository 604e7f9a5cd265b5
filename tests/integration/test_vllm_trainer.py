"""GRPO training whose rollouts come from a real vLLM server (CPU build) with hot-swapped adapters.

The trainer (`make_trainer`, the call the trainer worker makes) trains a LoRA on the same
SmolLM2-135M directory the session's vLLM server serves (tests/support/vllm.py), with
`rollout_backend="vllm"`: after each optimizer step the adapter is saved, loaded under the
immutable name `<capability>-v<N>`, verified in `/v1/models`, and the previous version is
unloaded. Checked against the real server: the load/unload sequence, that the adapter served
at the end is exactly the trained one (greedy output under vLLM == PEFT's), that a stale
adapter of the same name left by an earlier run is replaced, and that a version the server
cannot load fails the run after bounded retries with the server's reason -- never a hang.

Environment: the built-in `store` env (precondition_check tasks). Its verifier gives
SmolLM2-135M-base reward 0 on every episode (the model cannot look an order up), so no group
would be informative and the policy would never change; the test env below adds partial
credit for the length of the agent's replies so that every group is informative and each
iteration publishes a new version. What is learnt does not matter here, only how versions
are served. Budgets are tiny (1 group of 2 episodes, 1 turn of <= 32 tokens, LoRA r8): the
store prompt is ~1.6k tokens and the backward pass over it dominates. Wall time measured here
(2 shared cores, load ~5): 176 s for the two iterations (~29 s rollouts + ~60 s update each),
~3.5 min for the module after the server is up.
"""

from __future__ import annotations

import re
import shutil
import time

import httpx
import pytest
import torch

from services.trainer.grpo import vllm_rollouts
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.session import make_trainer
from trace_common.domains.store.env import StoreEnv
from trace_common.errors import Unavailable

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]

PROMPTS = ["Please cancel order #W57304. Reason: ordered by mistake.", "What is the status of order #W24241?"]


class LengthCreditStore(StoreEnv):
    """`store` with partial credit: the verifier's reward when it is 1, else 0.5 x the agent's
    reply length (characters / 200, capped at 1) -- continuous, so a group's rewards differ."""

    def reward(self) -> float:
        verified = super().reward()
        if verified >= 1.0:
            return verified
        return 0.5 * min(1.0, sum(len(t) for t in self._agent_texts) / 200)


def store_env() -> LengthCreditStore:
    return LengthCreditStore(task_types="precondition_check")


def config(server, adapter_dir, **kw) -> GRPOConfig:
    values = dict(max_steps=2, groups_per_batch=1, num_generations=2, max_completion_length=32, max_turns=1,
                  lora_r=8, lora_alpha=16, lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                  learning_rate=2e-3, save_steps=0, guidance_fraction=0.0, early_stop_uninformative_iterations=0,
                  rollout_backend="vllm",
                  vllm={"base_url": server.base_url, "adapter_dir": str(adapter_dir), "request_timeout_s": 300,
                        "load_retries": 1, "retry_backoff_s": 0.2, "drain_timeout_s": 30})
    values.update(kw)
    return GRPOConfig(**values)


def served_adapters(server, capability: str) -> set[str]:
    models = httpx.get(server.base_url + "/models", timeout=30).json()["data"]
    return {m["id"] for m in models if m["id"].startswith(capability + "-v")}


def loads_logged(server, adapter_dir) -> list[str]:
    """Adapter names the server logged as loaded from `adapter_dir`, in order."""
    pat = re.compile(r"Loaded new LoRA adapter: name '([^']+)', path '" + re.escape(str(adapter_dir)) + "/")
    return pat.findall(server.log_path.read_text())


def greedy(server, model_name: str, tok, prompts, peft=None, n: int = 10) -> list[str]:
    """Greedy continuations of each chat prompt: served by vLLM under `model_name`, or, with
    `peft`, generated locally by that PEFT model."""
    out = []
    for p in prompts:
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        if peft is None:
            r = httpx.post(server.base_url + "/completions", json={"model": model_name, "prompt": text,
                                                                  "max_tokens": n, "temperature": 0}, timeout=300)
            assert r.status_code == 200, r.text
            out.append(r.json()["choices"][0]["text"].strip())
        else:
            ids = tok(text, return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                gen = peft.generate(**ids, max_new_tokens=n, do_sample=False)
            out.append(tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    return out


def base_and_tokenizer(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.timeout(900)
def test_training_hot_swaps_versions_and_serves_the_trained_adapter(vllm_server, smollm2_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    cap = "length_credit"
    # A stale `<cap>-v2` left on the server by an earlier attempt of this job (no job id here: the names
    # are `<cap>-v<N>`; random, non-zero weights).
    torch.manual_seed(1)
    base, tok = base_and_tokenizer(smollm2_dir)
    stale = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    stale_dir = tmp_path / "earlier-run" / f"{cap}-v2"
    stale.save_pretrained(stale_dir)
    r = httpx.post(vllm_server.base_url.removesuffix("/v1") + "/v1/load_lora_adapter",
                   json={"lora_name": f"{cap}-v2", "lora_path": str(stale_dir)}, timeout=300)
    assert r.status_code == 200, r.text
    stale_out = greedy(vllm_server, f"{cap}-v2", tok, PROMPTS)

    adapter_dir = tmp_path / "adapters"
    rows: list[tuple[dict, set[str]]] = []

    def on_event(kind, payload):
        if kind == "iteration":  # called synchronously after the iteration's publish
            rows.append((payload["values"], served_adapters(vllm_server, cap)))

    base, tok = base_and_tokenizer(smollm2_dir)
    trainer = make_trainer(config(vllm_server, adapter_dir), base, tok, store_env, capability=cap, on_event=on_event)
    t0 = time.monotonic()
    result = trainer.train(resume=False, write_adapter=False)
    wall = time.monotonic() - t0

    assert result.iterations == 2 and result.stop_reason == "completed", result
    assert [int(v["policy_version"]) for v, _ in rows] == [1, 2], [v for v, _ in rows]  # each iteration updated
    assert all(v["policy_errors"] == 0 for v, _ in rows)
    # after iteration i, version i is served and version i-1 is gone (v2 at iteration 1 is the stale one)
    assert f"{cap}-v1" in rows[0][1] and f"{cap}-v0" not in rows[0][1], rows[0][1]
    assert rows[1][1] == {f"{cap}-v2"}, rows[1][1]
    assert loads_logged(vllm_server, adapter_dir) == [f"{cap}-v0", f"{cap}-v1", f"{cap}-v2"]
    assert sorted(p.name for p in adapter_dir.iterdir()) == [f"{cap}-v2"]  # unloaded versions' files removed

    # the served v2 is the trained adapter, not the stale one: greedy output equals PEFT's
    final = PeftModel.from_pretrained(base_and_tokenizer(smollm2_dir)[0], adapter_dir / f"{cap}-v2").eval()
    local = greedy(vllm_server, "", tok, PROMPTS, peft=final)
    served = greedy(vllm_server, f"{cap}-v2", tok, PROMPTS)
    assert served == local, (served, local)
    assert local != stale_out, "the stale adapter must give other outputs, or this check could not fail"
    print(f"two GRPO iterations with vLLM rollouts: {wall:.1f} s;", [(round(v["generate_seconds"], 1), round(v["step_seconds"], 1)) for v, _ in rows])


def _save_then_vanish(real):
    """`save_pretrained_to` whose files are gone before the server looks (as if written to a
    volume the server does not mount)."""
    def save(model, path):
        out = real(model, path)
        shutil.rmtree(path)
        return out
    return save


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cap, overrides, vanish, reason", [
    ("rank_too_high", {"lora_r": 32, "lora_alpha": 32}, False, "greater than max_lora_rank 16"),
    ("files_unseen", {}, True, "No adapter found"),
])
def test_unloadable_version_fails_after_retries(vllm_server, smollm2_dir, tmp_path, monkeypatch, cap, overrides,
                                                vanish, reason):
    if vanish:
        monkeypatch.setattr(vllm_rollouts, "save_pretrained_to", _save_then_vanish(vllm_rollouts.save_pretrained_to))
    base, tok = base_and_tokenizer(smollm2_dir)
    cfg = config(vllm_server, tmp_path / "adapters", **overrides)
    trainer = make_trainer(cfg, base, tok, store_env, capability=cap)
    before = vllm_server.log_path.read_text().count("POST /v1/load_lora_adapter")
    t0 = time.monotonic()
    with pytest.raises(Unavailable) as err:
        trainer.train(resume=False, write_adapter=False)
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    assert isinstance(err.value, vllm_rollouts.AdapterLoadError)
    assert f"'{cap}-v0'" in msg and "after 2 attempts" in msg and reason in msg, msg
    assert vllm_server.log_path.read_text().count("POST /v1/load_lora_adapter") - before == 2  # 1 try + 1 retry
    assert elapsed < 60, elapsed
    assert served_adapters(vllm_server, cap) == set()
    # the server is still usable after the failed loads
    assert greedy(vllm_server, "smollm2", tok, PROMPTS[:1])[0]
