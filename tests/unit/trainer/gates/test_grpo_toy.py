"""A toy world where each of two adapters clearly helps one environment, for gate-training tests
(also registered as environments `toy-early` / `toy-late` for trainer worker processes).

* `early` environment: "Reply with one word." / "Say <word>."; reward 1 when the reply starts with
  a letter a-m. `late` environment: "Answer with the secret number." / "What is the secret number of
  <word>?"; reward 1 when the reply starts with n-z. Single turn.
* The base (tests/unit/trainer/grpo/helpers.py tiny Qwen3 + BPE) is fine-tuned to answer both prompts with a
  random word of WORDS[:26] (apple ... zebra): about half of its replies score on either environment.
* Adapter `early` is a LoRA (on decoder layer 1 only) fine-tuned to answer *both* prompts with a-m words, adapter `late` with
  n-z words: each is right on one environment and wrong on the other, so only routing by the prompt
  (a gate) gets both -- the known answer the gate-training tests check.
"""

from __future__ import annotations

import functools
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tests.unit.env.toy_env import SeededEnv
from tests.unit.trainer.grpo.helpers import WORDS, tiny_model, tiny_tokenizer, warm_start
from trace_common.env import Message, MessageAction, Observation, StepResult, register
from trace_common.errors import AlreadyExists, FailedPrecondition

ANIMALS = WORDS[:26]
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EARLY = set("abcdefghijklm")
PROMPTS = {"early": ("Reply with one word.", "Say {w}."),
           "late": ("Answer with the secret number.", "What is the secret number of {w}?")}


class HalfEnv(SeededEnv):
    """One turn; reward 1 when the reply's first letter is in the environment's half of the alphabet."""

    name: ClassVar[str] = "toy-half"
    version: ClassVar[str] = "1.0.0"
    default_max_turns: ClassVar[int] = 1
    half: ClassVar[str] = "early"

    def __init__(self) -> None:
        super().__init__()
        self._reply = ""

    def splits(self) -> dict[str, Sequence[int]]:
        return {"train": range(0, 1000), "test": range(1000, 1200)}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def reset(self, seed: int) -> Observation:
        self._begin(seed)
        self._reply, self._done = "", False
        system, user = PROMPTS[self.half]
        word = random.Random(seed).choice(ANIMALS)
        return Observation(messages=[Message.system(system), Message.user(user.format(w=word))],
                           task_id=str(seed), seed=seed)

    def step(self, action: Any) -> StepResult:
        if self._done:
            raise FailedPrecondition("episode over")
        self._reply = (action.content or "").strip().lower() if isinstance(action, MessageAction) else ""
        self._done = True
        return StepResult(observation=[Message.user("Thanks.")], done=True)

    def reward(self) -> float:
        first = self._reply[:1]
        if not first.isalpha():
            return 0.0
        return 1.0 if (first in EARLY) == (self.half == "early") else 0.0


class EarlyEnv(HalfEnv):
    name: ClassVar[str] = "toy-early"
    half: ClassVar[str] = "early"


class LateEnv(HalfEnv):
    name: ClassVar[str] = "toy-late"
    half: ClassVar[str] = "late"


ENVS = {"early": EarlyEnv, "late": LateEnv}
for _cls in (EarlyEnv, LateEnv):
    try:
        register(_cls.name, _cls.version, _cls, description=f"gate-training toy {_cls.__name__}")
    except AlreadyExists:  # pragma: no cover - re-import under another module name
        pass


def _conversations(letters: set[str] | None, n: int, seed: int) -> list[tuple[list[Message], list]]:
    rng = random.Random(seed)
    words = [w for w in ANIMALS if letters is None or w[0] in letters]
    out = []
    for i in range(n):
        system, user = PROMPTS["early" if i % 2 == 0 else "late"]
        msgs = [Message.system(system), Message.user(user.format(w=rng.choice(ANIMALS))),
                Message.assistant(rng.choice(words))]
        out.append((msgs, []))
    return out


@functools.lru_cache(maxsize=1)
def toy_world() -> tuple[Path, dict[str, Path]]:
    """(base model dir, {adapter name: PEFT dir}), built once per process (~10 s on one thread)."""
    root = Path(tempfile.mkdtemp(prefix="trace-gate-toy-"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = tiny_tokenizer()
        base = tiny_model()
        warm_start(base, tok, _conversations(None, 400, seed=1), steps=120, lr=3e-3)
        base.save_pretrained(root / "base")
        tok.save_pretrained(root / "base")
        adapters = {}
        for k, (name, letters) in enumerate((("early", EARLY), ("late", set("nopqrstuvwxyz")))):
            model = tiny_model()
            model.load_state_dict(base.state_dict())
            torch.manual_seed(10 + k)
            # layer 1 only: layer 0's gate sees just the token (its input is the embedding), so it could
            # not tell the environments apart at the reply's first position; layer 1's gate sees the context
            peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=LINEARS,
                                                    layers_to_transform=[1], lora_dropout=0.0))
            warm_start(peft, tok, _conversations(letters, 300, seed=2 + k), steps=80, lr=1e-2)
            peft.save_pretrained(str(root / name))
            adapters[name] = root / name
    finally:
        torch.set_num_threads(threads)
    return root / "base", adapters


def mean_reward(policy_model: torch.nn.Module, tokenizer: Any, half: str, seeds: Sequence[int]) -> float:
    """Greedy reward of a model (plain or the routed base of a composition) on one toy environment."""
    import asyncio

    from services.trainer.grpo.rollouts import EpisodeSpec, play_groups
    from trace_common.policy.base import SamplingParams
    from trace_common.policy.transformers_backend import TransformersPolicy

    policy = TransformersPolicy.from_model(policy_model, tokenizer, max_batch=64, max_wait_s=0.0)
    specs = [EpisodeSpec(seed=s, group=i, index=0, guided=False, sampling_seed=s) for i, s in enumerate(seeds)]

    async def go():
        try:
            return await play_groups(policy, ENVS[half], specs, params=SamplingParams(temperature=0.0, max_tokens=4))
        finally:
            await policy.close()

    trajs = asyncio.run(go())
    return sum(t.reward for t in trajs) / len(trajs)


@pytest.mark.parametrize("adapter, good_on, bad_on", [("early", "early", "late"), ("late", "late", "early")])
def test_each_toy_adapter_clearly_helps_one_environment(adapter, good_on, bad_on):
    """The premise of the gate-training tests: adapter c is right on environment c, wrong on the other."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir, adapters = toy_world()
    tok = tiny_tokenizer()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(adapters[adapter]))
    model = model.merge_and_unload().eval()
    seeds = range(1000, 1032)
    assert mean_reward(model, tok, good_on, seeds) >= 0.9
    assert mean_reward(model, tok, bad_on, seeds) <= 0.1
