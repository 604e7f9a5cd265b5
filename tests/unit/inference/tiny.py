"""A tiny, fully built-in world for composition tests: two capability "environments", a BPE
tokenizer trained on their text, a 2-layer Qwen3 base that was taught one fixed tool-call reply,
and random LoRA adapters. Everything is made in code in a few seconds (no downloads).

* `refunds` and `addresses` trajectories differ in system prompt, tools and wording, as the
  trajectories of two capability environments do; gate warm start must tell their tokens apart.
* The base is trained (120 full-batch Adam steps on 48 conversations) to answer every
  conversation with `FIXED_REPLY`, a Hermes `<tool_call>` -- so greedy generation through the
  served composition produces a tool call the parser and the OpenAI client must both recover.
* Adapters are random LoRAs with small B (`ADAPTER_SCALE`), so routing changes the logits
  measurably (routing traces are non-trivial) without breaking the taught reply's greedy margin.

`check_world` verifies what the tests rely on -- greedy decoding yields exactly `FIXED_REPLY`
and then `<|im_end|>` after every probe prompt (`PROBE_SEEDS` of both capabilities), through the
base alone and with each adapter, with a logit margin of at least `MIN_MARGIN` at every reply
token -- and fails, saying what was not learnt, on every world `cached_world` hands out (freshly
built or from the cache). With 12 training conversations instead of 48 the base learnt the reply
only for some prompts, and which ones changed with the tokenizer's merges: a world cached
before a tokenizer change passed the inference tests, a fresh build failed them (issue #22). With
80 steps the world passed on one machine and failed on another (an AMD EPYC with AVX-512: 22 of 96
probes, the base answering order id "Atools7" for "A17", smallest margin -1.03); with 120 steps
that machine's smallest margin is 1.70 (160: 3.10).

`cached_world` caches the world in the temp dir under a key covering every source file it can
depend on (this file, all of trace_common/ and services/) and the torch, transformers,
tokenizers and peft versions, so a change to the library code builds a new world.
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
REPO = Path(__file__).resolve().parents[3]
#: Training conversations for the fixed reply: enough variety in order ids, reasons and streets
#: that the base answers FIXED_REPLY after prompts it never saw (12 was not: issue #22).
TEACH_CONVERSATIONS = 48
#: Prompts `check_world` probes, per capability (the tests use seeds below 10).
PROBE_SEEDS = range(16)
#: Smallest logit gap between the taught token and the runner-up at any reply position. Measured:
#: the built world's smallest is ~0.4 (at the first reply token), and one adapter moved it by ~0.1.
MIN_MARGIN = 0.25
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


def teach_fixed_reply(model, tokenizer, steps: int = 120, seed: int = 0,
                      conversations: int = TEACH_CONVERSATIONS) -> float:
    """Language-model training of the whole tiny model on conversations of both capabilities whose
    first assistant turn is replaced by FIXED_REPLY: greedy decoding after a user message then yields
    FIXED_REPLY, and the hidden states learn to carry which capability a conversation is about (the
    later turns differ), which is what the gates read."""
    chat = ChatFormat(tokenizer)
    rng = random.Random(seed)
    fixed = Message.assistant(FIXED_REPLY)
    seqs = []
    for i in range(conversations):
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
    loss = torch.tensor(float("nan"))  # steps=0: untrained (what check_world must reject)
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


def build_world(root: Path, *, hidden: int = 64, layers: int = 2, name: str = "base", steps: int = 120) -> TinyWorld:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model trains ~10x faster single-threaded on a shared 2-core box
    try:
        return _build_world(root, hidden=hidden, layers=layers, name=name, steps=steps)
    finally:
        torch.set_num_threads(threads)


def _build_world(root: Path, *, hidden: int, layers: int, name: str, steps: int) -> TinyWorld:
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(tiny_config(len(tokenizer), hidden=hidden, layers=layers))
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    loss = teach_fixed_reply(model, tokenizer, steps=steps)
    model_dir = root / name
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    adapters = {
        "refunds": save_adapter(model_dir, root / f"{name}-refunds", 1, r=4, lora_alpha=8, target_modules="all-linear"),
        "addresses": save_adapter(model_dir, root / f"{name}-addresses", 2, r=2, lora_alpha=4,
                                  target_modules=["q_proj", "v_proj", "down_proj"]),
    }
    return TinyWorld(model_dir, adapters, tokenizer, loss)


def reply_ids(tokenizer) -> list[int]:
    """Token ids the taught reply consists of, then the end of the turn."""
    return [*tokenizer(FIXED_REPLY, add_special_tokens=False)["input_ids"], tokenizer.convert_tokens_to_ids("<|im_end|>")]


def reply_margins(model, tokenizer, capability: str, seed: int) -> tuple[list[int], list[float]]:
    """Teacher-forced pass over probe prompt + FIXED_REPLY + <|im_end|>: per reply position, the
    greedy choice and (taught token's logit - best other logit); greedy decoding reproduces
    the reply exactly iff every margin is positive."""
    chat = ChatFormat(tokenizer)
    prompt = chat.render(prompt_messages(capability, seed), TOOLS[capability], add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    target = reply_ids(tokenizer)
    ids = torch.tensor([prompt_ids + target])  # [1, P+R]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()  # [R, V]
    taught = logits.gather(1, torch.tensor(target)[:, None])[:, 0]  # [R]
    others = logits.scatter(1, torch.tensor(target)[:, None], float("-inf")).max(dim=1).values  # [R]
    return logits.argmax(dim=1).tolist(), (taught - others).tolist()


def check_world(world: TinyWorld) -> float:
    """Raise AssertionError, saying what was not learnt, unless greedy decoding yields exactly
    FIXED_REPLY + <|im_end|> with margin >= MIN_MARGIN for every probe prompt, through the base
    and through the base with each adapter. Returns the smallest margin seen."""
    from peft import PeftModel

    models = {"base": Qwen3ForCausalLM.from_pretrained(world.model_dir).eval()}
    for cap, adapter_dir in world.adapter_dirs.items():
        models[f"base+{cap}"] = PeftModel.from_pretrained(
            Qwen3ForCausalLM.from_pretrained(world.model_dir), str(adapter_dir)).eval()
    failures, smallest = [], float("inf")
    for label, model in models.items():
        for cap in CAPABILITIES:
            for seed in PROBE_SEEDS:
                greedy, margins = reply_margins(model, world.tokenizer, cap, seed)
                smallest = min(smallest, *margins)
                worst = min(range(len(margins)), key=margins.__getitem__)
                if margins[worst] < MIN_MARGIN:
                    failures.append(f"{label}, {cap} prompt seed {seed}: at reply token {worst} margin "
                                    f"{margins[worst]:.2f}, greedy continues {world.tokenizer.decode(greedy)!r}")
    if failures:
        raise AssertionError(
            f"the tiny test world ({world.model_dir}) did not learn to answer every probe prompt with "
            f"{FIXED_REPLY!r} + <|im_end|> (greedy, logit margin >= {MIN_MARGIN}); the inference tests rely on "
            f"it. {len(failures)} of {len(models) * len(CAPABILITIES) * len(PROBE_SEEDS)} probes failed, e.g.:\n  "
            + "\n  ".join(failures[:6]) + f"\n(final training loss {world.final_sft_loss:.4f}; see "
            "teach_fixed_reply in tests/unit/inference/tiny.py)")
    return smallest


def world_cache_key() -> str:
    """sha256 over every source file the world can depend on (this file, trace_common/, services/)
    and the versions of the libraries that build it."""
    import peft
    import tokenizers

    digest = hashlib.sha256()
    files = [("tests/unit/inference/tiny.py", Path(__file__))] + sorted(
        (str(p.relative_to(REPO)), p) for tree in ("trace_common", "services") for p in (REPO / tree).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts)
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    versions = [torch.__version__, transformers.__version__, tokenizers.__version__, peft.__version__]
    digest.update("/".join(versions).encode())
    return digest.hexdigest()


#: Where `cached_world` keeps its worlds: the test stacks list it as a model root (tests/support/stack.py).
TINY_WORLDS = Path(tempfile.gettempdir()) / "trace-tiny-worlds"


def cached_world() -> TinyWorld:
    """`build_world` once per machine and version of the code it depends on (`world_cache_key`;
    a temp-dir cache under TINY_WORLDS shared by the unit and integration suites, renamed into place
    complete or not at all), checked by `check_world` before it is handed out."""
    root = TINY_WORLDS / f"world-{world_cache_key()[:16]}"
    if not (root / "DONE").is_file():
        TINY_WORLDS.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=TINY_WORLDS))
        world = build_world(tmp)
        (tmp / "DONE").write_text(json.dumps({"final_sft_loss": world.final_sft_loss}))
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    from transformers import AutoTokenizer

    meta = json.loads((root / "DONE").read_text())
    world = TinyWorld(model_dir=root / "base", adapter_dirs={c: root / f"base-{c}" for c in CAPABILITIES},
                      tokenizer=AutoTokenizer.from_pretrained(root / "base"), final_sft_loss=meta["final_sft_loss"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_world(world)
    finally:
        torch.set_num_threads(threads)
    return world


def random_base_dir(root: Path, vocab: int, *, hidden: int = 64, layers: int = 2, seed: int = 5) -> Path:
    """An untrained tiny Qwen3 of another shape (for mismatch tests), saved with save_pretrained."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_config(vocab, hidden=hidden, layers=layers))
    model.save_pretrained(root)
    return root
