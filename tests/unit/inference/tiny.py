"""A tiny, fully built-in world for composition tests: two capability "environments", a BPE
tokenizer trained on their text, a 2-layer Qwen3 base that was taught one fixed tool-call reply,
and random LoRA adapters. Everything is made in code in a few seconds (no downloads).

* `refunds` and `addresses` trajectories differ in system prompt, tools and wording, as the
  trajectories of two capability environments do; gate warm start must tell their tokens apart.
* The base is trained (a few hundred Adam steps) to answer every conversation with
  `FIXED_REPLY`, a Hermes `<tool_call>` -- so greedy generation through the served composition
  produces a tool call the parser and the OpenAI client must both recover.
* Adapters are random LoRAs with small B (`ADAPTER_SCALE`), so routing changes the logits
  measurably (routing traces are non-trivial) without breaking the taught reply's greedy margin.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from trace_common.agents.tokenizer import train_tokenizer
from trace_common.env.messages import Message, ToolCall
from trace_common.env.trajectory import EnvInfo, PolicyInfo, Trajectory
from trace_common.policy.chat import ChatFormat

CAPABILITIES = ("refunds", "addresses")
FIXED_CALL = {"name": "refund_order", "arguments": {"order_id": "A17"}}
FIXED_REPLY = f"<tool_call>{json.dumps(FIXED_CALL)}</tool_call>"
ADAPTER_SCALE = 0.05

TOOLS = {
    "refunds": [{"type": "function", "function": {
        "name": "refund_order", "description": "Refund a delivered order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}],
    "addresses": [{"type": "function", "function": {
        "name": "update_address", "description": "Change the shipping address of a pending order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "street": {"type": "string"}},
                       "required": ["order_id", "street"]}}}],
}
SYSTEM = {"refunds": "You are the refunds desk of the store. Check the order before refunding.",
          "addresses": "You are the shipping desk. Only pending orders can change address."}
STREETS = ("Elm", "Oak", "Birch", "Maple", "Cedar", "Pine")
REASONS = ("arrived broken", "arrived late", "was the wrong size", "never arrived")


def conversation(capability: str, rng: random.Random) -> list[Message]:
    oid = f"{rng.choice('ABC')}{rng.randint(10, 99)}"
    if capability == "refunds":
        reason = rng.choice(REASONS)
        call = ToolCall.create("call_0_0", "refund_order", {"order_id": oid})
        return [Message.system(SYSTEM[capability]), Message.user(f"Please refund order {oid}, it {reason}."),
                Message.assistant(None, [call]), Message.tool("call_0_0", json.dumps({"refunded": True})),
                Message.assistant(f"Order {oid} is refunded. Sorry that it {reason}.")]
    street = f"{rng.randint(1, 99)} {rng.choice(STREETS)} street"
    call = ToolCall.create("call_0_0", "update_address", {"order_id": oid, "street": street})
    return [Message.system(SYSTEM[capability]), Message.user(f"Ship order {oid} to {street} instead."),
            Message.assistant(None, [call]), Message.tool("call_0_0", json.dumps({"status": "pending"})),
            Message.assistant(f"Order {oid} now ships to {street}.")]


def trajectories(capability: str, n: int, seed: int) -> list[Trajectory]:
    rng = random.Random(f"{capability}:{seed}")
    return [Trajectory(task_id=f"{capability}-{i}", seed=seed * 1000 + i, env=EnvInfo(name=capability, version="1"),
                       policy=PolicyInfo(model="scripted-expert"), messages=conversation(capability, rng),
                       reward=1.0, success=True, termination="done", tools=TOOLS[capability])
            for i in range(n)]


def prompt_messages(capability: str = "refunds", seed: int = 0) -> list[Message]:
    """A conversation up to the first assistant turn (what a client sends)."""
    return conversation(capability, random.Random(seed))[:2]


def make_tokenizer():
    from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, render_template_text

    texts = []
    for cap in CAPABILITIES:
        for t in trajectories(cap, 30, seed=99):
            texts.append(render_template_text(TRACE_CHATML_TEMPLATE, t.messages, t.tools))
    texts.append(FIXED_REPLY)
    return train_tokenizer(texts, vocab_size=420, model_max_length=512)


def tiny_config(vocab: int, *, hidden: int = 64, layers: int = 2) -> Qwen3Config:
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                       tie_word_embeddings=False)


def teach_fixed_reply(model, tokenizer, steps: int = 80, seed: int = 0) -> float:
    """Language-model training of the whole tiny model on conversations of both capabilities whose
    first assistant turn is replaced by FIXED_REPLY: greedy decoding after a user message then yields
    FIXED_REPLY, and the hidden states learn to carry which capability a conversation is about (the
    later turns differ), which is what the gates read."""
    chat = ChatFormat(tokenizer)
    rng = random.Random(seed)
    fixed = Message.assistant(FIXED_REPLY)
    seqs = []
    for i in range(12):
        cap = CAPABILITIES[i % 2]
        msgs = conversation(cap, rng)
        msgs = [*msgs[:2], fixed, *msgs[3:]]
        text = chat.render(msgs, TOOLS[cap], add_generation_prompt=False)
        seqs.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    width = max(len(x) for x in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(seqs), width), pad)
    labels = torch.full((len(seqs), width), -100)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, seq in enumerate(seqs):
        ids[b, :len(seq)] = torch.tensor(seq)
        attn[b, :len(seq)] = 1
        labels[b, :len(seq)] = torch.tensor(seq)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    loss = None
    for _ in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def save_adapter(model_dir: Path, out: Path, seed: int, **lora) -> Path:
    base = Qwen3ForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(seed)
    peft_model = get_peft_model(base, LoraConfig(init_lora_weights=False, lora_dropout=0.0, **lora))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(ADAPTER_SCALE)
    peft_model.save_pretrained(str(out))
    return out


@dataclass
class TinyWorld:
    model_dir: Path
    adapter_dirs: dict[str, Path]
    tokenizer: object
    final_sft_loss: float


def build_world(root: Path, *, hidden: int = 64, layers: int = 2, name: str = "base") -> TinyWorld:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model trains ~10x faster single-threaded on a shared 2-core box
    try:
        return _build_world(root, hidden=hidden, layers=layers, name=name)
    finally:
        torch.set_num_threads(threads)


def _build_world(root: Path, *, hidden: int, layers: int, name: str) -> TinyWorld:
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(tiny_config(len(tokenizer), hidden=hidden, layers=layers))
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    loss = teach_fixed_reply(model, tokenizer)
    model_dir = root / name
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    adapters = {
        "refunds": save_adapter(model_dir, root / f"{name}-refunds", 1, r=4, lora_alpha=8, target_modules="all-linear"),
        "addresses": save_adapter(model_dir, root / f"{name}-addresses", 2, r=2, lora_alpha=4,
                                  target_modules=["q_proj", "v_proj", "down_proj"]),
    }
    return TinyWorld(model_dir, adapters, tokenizer, loss)


def cached_world() -> TinyWorld:
    """`build_world` once per machine and version of this file (a temp-dir cache shared by the unit
    and integration suites; the directory is renamed into place complete, or not at all)."""
    key = hashlib.sha256(Path(__file__).read_bytes() + f"{torch.__version__}/{transformers.__version__}".encode())
    root = Path(tempfile.gettempdir()) / f"trace-tiny-world-{key.hexdigest()[:12]}"
    if not (root / "DONE").is_file():
        tmp = Path(tempfile.mkdtemp(prefix="trace-tiny-world-build-"))
        world = build_world(tmp)
        (tmp / "DONE").write_text(json.dumps({"final_sft_loss": world.final_sft_loss}))
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    from transformers import AutoTokenizer

    meta = json.loads((root / "DONE").read_text())
    return TinyWorld(model_dir=root / "base", adapter_dirs={c: root / f"base-{c}" for c in CAPABILITIES},
                     tokenizer=AutoTokenizer.from_pretrained(root / "base"), final_sft_loss=meta["final_sft_loss"])


def random_base_dir(root: Path, vocab: int, *, hidden: int = 64, layers: int = 2, seed: int = 5) -> Path:
    """An untrained tiny Qwen3 of another shape (for mismatch tests), saved with save_pretrained."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_config(vocab, hidden=hidden, layers=layers))
    model.save_pretrained(root)
    return root
