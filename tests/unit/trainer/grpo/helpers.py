"""Real, tiny components for GRPO tests: a byte-level BPE tokenizer trained on the toy text, a
random Qwen3 model built in code, and two toy environments.

`PickEnv` is the learning test's environment: one assistant turn; reward 1 when the reply's
first character is one of `good` (a single learnable behaviour: which first token to emit).
`ToolEnv` is multi-turn: the agent may look a number up with a tool before answering;
partial credit (0.5) for the lookup, 1.0 for telling the user the looked-up number.

Guidance (`Observation.guidance`, what guided GRPO rollouts show): `PickEnv(hint=True)` supplies
a per-instance hint naming the instance's word (`pick_hint`), plain `PickEnv` none; `ToolEnv`
supplies `TOOL_HINT` for every instance by default, `ToolEnv(hint="instance")` a per-instance
hint naming the key (`tool_hint`), `ToolEnv(hint="none")` none.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tests.unit.env.toy_env import SeededEnv
from trace_common.agents.tokenizer import train_tokenizer
from trace_common.env import Message, MessageAction, Observation, StepResult, ToolAction
from trace_common.errors import FailedPrecondition
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, render_template_text

LOOKUP_SCHEMA = {"type": "function", "function": {
    "name": "lookup", "description": "Look up the secret number of a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}

#: ToolEnv's hint with hint="fixed" (also what the warm-start demonstrations show, `tool_demo`).
TOOL_HINT = "Hint: call lookup first."

WORDS = ("apple banana cherry dog egg fish grape house ice jam kite lemon moon nut orange pear queen rose sun "
         "tree umbrella violin water xray yak zebra 0 1 2 3 4 5 6 7 8 9 The answer is secret number key").split()


class PickEnv(SeededEnv):
    name: ClassVar[str] = "pick"
    version: ClassVar[str] = "1.0.0"
    default_max_turns: ClassVar[int] = 1

    def __init__(self, good: str = "abcdefghijklm", constant: float | None = None, hint: bool = False):
        super().__init__()
        self.good = good
        self.constant = constant
        self.hint = hint
        self._reply = ""

    def splits(self) -> dict[str, Sequence[int]]:
        return {"train": range(0, 1000), "test": range(1000, 1100)}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def reset(self, seed: int) -> Observation:
        self._begin(seed)
        self._reply, self._done = "", False
        word = random.Random(seed).choice(WORDS)
        return Observation(messages=[Message.system("Reply with one word."), Message.user(f"Say {word}.")],
                           task_id=str(seed), seed=seed, guidance=pick_hint(seed) if self.hint else None)

    def step(self, action: Any) -> StepResult:
        if self._done:
            raise FailedPrecondition("episode over")
        self._reply = action.content if isinstance(action, MessageAction) else f"<{action.name}>"
        self._done = True
        return StepResult(observation=[Message.user("Thanks.")], done=True)

    def reward(self) -> float:
        if self.constant is not None:
            return self.constant
        return 1.0 if self._reply[:1] in self.good and self._reply[:1] else 0.0


def pick_hint(seed: int) -> str:
    """PickEnv(hint=True)'s hint for instance `seed`."""
    return f"Hint: the answer is {random.Random(seed).choice(WORDS)}."


def tool_hint(key: str) -> str:
    """ToolEnv(hint="instance")'s hint for the instance whose key is `key`."""
    return f"Hint: call lookup with key {key} first."


class ToolEnv(SeededEnv):
    name: ClassVar[str] = "toolenv"
    version: ClassVar[str] = "1.0.0"
    default_max_turns: ClassVar[int] = 3

    def __init__(self, hint: str = "fixed"):
        """`hint`: "fixed" (TOOL_HINT for every instance), "instance" (`tool_hint(key)`) or "none"."""
        super().__init__()
        if hint not in ("fixed", "instance", "none"):
            raise ValueError(f"hint={hint!r}: use 'fixed', 'instance' or 'none'")
        self.hint = hint

    def splits(self) -> dict[str, Sequence[int]]:
        return {"train": range(0, 500), "test": range(500, 550)}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [LOOKUP_SCHEMA]

    def reset(self, seed: int) -> Observation:
        self._begin(seed)
        rng = random.Random(seed)
        self.key = rng.choice(WORDS[:26])
        self.secret = str(rng.randrange(100))
        self._done, self._looked, self._told = False, False, False
        guidance = {"fixed": TOOL_HINT, "instance": tool_hint(self.key), "none": None}[self.hint]
        return Observation(messages=[Message.system("Answer with the secret number."),
                                     Message.user(f"What is the secret number of {self.key}?")],
                           task_id=str(seed), seed=seed, tools=self.tool_schemas(), guidance=guidance)

    def step(self, action: Any) -> StepResult:
        if self._done:
            raise FailedPrecondition("episode over")
        if isinstance(action, ToolAction):
            if action.name == "lookup" and not action.error:
                self._looked = True
                return StepResult(observation=[Message.tool(action.call_id, self.secret)])
            return StepResult(observation=[self.tool_error(action, "call lookup(key)")])
        self._told = self._looked and self.secret in (action.content or "")
        self._done = True
        return StepResult(observation=[Message.user("Bye.")], done=True)

    def reward(self) -> float:
        return 1.0 if self._told else (0.5 if self._looked else 0.0)


def corpus() -> list[str]:
    rng = random.Random(0)
    texts = []
    for _ in range(60):
        w = rng.choice(WORDS)
        msgs = [{"role": "system", "content": "Reply with one word."}, {"role": "user", "content": f"Say {w}."},
                {"role": "assistant", "content": w}]
        texts.append(render_template_text(TRACE_CHATML_TEMPLATE, msgs, [LOOKUP_SCHEMA]))
    env = ToolEnv()
    for seed in range(60):
        msgs = tool_demo(env, seed, 0.5)
        texts.append(render_template_text(TRACE_CHATML_TEMPLATE, [m.to_dict() for m in msgs], [LOOKUP_SCHEMA]))
    texts.append(" ".join(WORDS) + " Hint: call lookup first. Thanks. Bye. What is the secret number of")
    return texts


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    return train_tokenizer(corpus(), vocab_size=400)


def tiny_model(seed: int = 0, hidden: int = 64, layers: int = 2) -> Qwen3ForCausalLM:
    tok = tiny_tokenizer()
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=1024, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.eval()
    return model


# -- warm start: scripted demonstrations + a few steps of supervised training ---------------------

def pick_demo(env: PickEnv, seed: int) -> list[Message]:
    obs = env.reset(seed)
    word = random.Random(seed * 7 + 1).choice(WORDS[:26])
    return [*obs.messages, Message.assistant(word)]


def tool_demo(env: ToolEnv, seed: int, p_lookup: float) -> list[Message]:
    """The scripted agent: looks the number up with probability `p_lookup` (always when the hint
    is in the prompt), otherwise guesses."""
    from trace_common.env import ToolCall

    obs = env.reset(seed)
    rng = random.Random(seed * 13 + 5)
    msgs = list(obs.messages)
    hinted = rng.random() < 0.3
    if hinted:
        msgs[1] = Message.user(f"{msgs[1].content}\n\n{TOOL_HINT}")
    if hinted or rng.random() < p_lookup:
        msgs.append(Message.assistant(None, [ToolCall.create("call_0_0", "lookup", {"key": env.key})]))
        msgs.append(Message.tool("call_0_0", env.secret))
        msgs.append(Message.assistant(f"The answer is {env.secret}."))
    else:
        msgs.append(Message.assistant(f"The answer is {rng.randrange(100)}."))
    return msgs


def warm_start(model: torch.nn.Module, tokenizer: Any, conversations: list[tuple[list[Message], list]],
               steps: int = 60, lr: float = 3e-3, batch: int = 16, seed: int = 0) -> None:
    """Full fine-tuning on the assistant tokens of `conversations` ((messages, tools) pairs)."""
    from trace_common.policy.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    examples = []
    for msgs, tools in conversations:
        text, spans = chat.assistant_spans(msgs, tools)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [any(s <= a < e for s, e in spans) for a, _ in enc["offset_mapping"]]
        examples.append((enc["input_ids"], mask))
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    pad = tokenizer.pad_token_id
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(examples), (batch,), generator=gen).tolist()
        width = max(len(examples[i][0]) for i in idx)
        ids = torch.full((batch, width), pad)
        att = torch.zeros((batch, width), dtype=torch.long)
        labels = torch.full((batch, width), -100)
        for r, i in enumerate(idx):
            x, m = examples[i]
            ids[r, :len(x)] = torch.tensor(x)
            att[r, :len(x)] = 1
            labels[r, :len(x)] = torch.where(torch.tensor(m), torch.tensor(x), torch.tensor(-100))
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@functools.lru_cache(maxsize=4)
def _warm_state(kind: str, p_lookup: float = 0.2) -> dict[str, torch.Tensor]:
    model = tiny_model()
    tok = tiny_tokenizer()
    if kind == "pick":
        env = PickEnv()
        convs = [(pick_demo(env, s), []) for s in range(200)]
        warm_start(model, tok, convs, steps=80)
    else:
        env = ToolEnv()
        convs = [(tool_demo(env, s, p_lookup), env.tool_schemas()) for s in range(300)]
        warm_start(model, tok, convs, steps=150)
    return {k: v.clone() for k, v in model.state_dict().items()}


def warm_model(kind: str, p_lookup: float = 0.2) -> Qwen3ForCausalLM:
    """A tiny model warm-started on the toy env's demonstrations (cached per process)."""
    model = tiny_model()
    model.load_state_dict(_warm_state(kind, p_lookup))
    model.eval()
    return model
