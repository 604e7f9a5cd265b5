"""A toy world where each of two adapters clearly helps one environment and the plain base is the
right choice on a third kind of task, for gate-training tests (also registered as environments
`toy-early` / `toy-late` / `toy-target` for trainer worker processes).

* `early` environment: "Reply with one word." / "Say <word>."; reward 1 when the reply starts with
  a letter a-m. `late` environment: "Answer with the secret number." / "What is the secret number of
  <word>?"; reward 1 when the reply starts with n-z. `magic` tasks: "Say the magic word." / "Please,
  <word>."; reward 1 when the reply is MAGIC ("key"). Single turn.
* `toy-target`, the target: a compound of the three kinds (seed % 3 picks early / late / magic), so
  the right routing differs by task: adapter `early`, adapter `late`, or the plain base (slot 0).
* The base (tests/unit/trainer/grpo/helpers.py tiny Qwen3 + BPE) is fine-tuned to answer the early
  and late prompts with a random word of WORDS[:26] (apple ... zebra: about half of its replies score
  on either) and to answer a magic prompt with MAGIC (it scores on magic).
* Adapter `early` is a LoRA (on decoder layer 1 only) fine-tuned to answer *every* prompt with an a-m
  word, adapter `late` with an n-z word: each is right on one environment, wrong on the other and on
  magic, so only routing by the prompt -- to an adapter, or to the base for magic -- gets all three
  (the known answer the gate-training tests check).
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
from tests.unit.inference.tiny import TINY_WORLDS
from tests.unit.trainer.grpo.helpers import WORDS, tiny_model, tiny_tokenizer, warm_start
from trace_common.env import Message, MessageAction, Observation, StepResult, register
from trace_common.errors import AlreadyExists, FailedPrecondition

ANIMALS = WORDS[:26]
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EARLY = set("abcdefghijklm")
PROMPTS = {"early": ("Reply with one word.", "Say {w}."),
           "late": ("Answer with the secret number.", "What is the secret number of {w}?"),
           "magic": ("Say the magic word.", "Please, {w}.")}
KINDS = ("early", "late", "magic")
MAGIC = "key"  # the one right reply to a magic task (no adapter ever says it)


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

    def kind(self, seed: int) -> str:
        return self.half

    def reset(self, seed: int) -> Observation:
        self._begin(seed)
        self._reply, self._done = "", False
        self._kind = self.kind(seed)
        system, user = PROMPTS[self._kind]
        self._word = random.Random(seed).choice(ANIMALS)
        return Observation(messages=[Message.system(system), Message.user(user.format(w=self._word))],
                           task_id=str(seed), seed=seed, info={"task_type": self._kind})

    def step(self, action: Any) -> StepResult:
        if self._done:
            raise FailedPrecondition("episode over")
        self._reply = (action.content or "").strip().lower() if isinstance(action, MessageAction) else ""
        self._done = True
        return StepResult(observation=[Message.user("Thanks.")], done=True)

    def reward(self) -> float:
        if self._kind == "magic":
            return 1.0 if self._reply.split(".")[0].strip() == MAGIC else 0.0
        first = self._reply[:1]
        if not first.isalpha():
            return 0.0
        return 1.0 if (first in EARLY) == (self._kind == "early") else 0.0


class EarlyEnv(HalfEnv):
    name: ClassVar[str] = "toy-early"
    half: ClassVar[str] = "early"


class LateEnv(HalfEnv):
    name: ClassVar[str] = "toy-late"
    half: ClassVar[str] = "late"


class TargetEnv(HalfEnv):
    """The compound target: seed % 3 picks the kind (early, late, magic)."""

    name: ClassVar[str] = "toy-target"

    def kind(self, seed: int) -> str:
        return KINDS[seed % 3]


class CrossedEnv(TargetEnv):
    """A target unlike the capability environments in what helps where: seed % 3 picks the prompt
    (early, late, magic) as in `toy-target`, but an early prompt scores an n-z reply and a late prompt
    an a-m reply. So on an early-prompt task only adapter `late` scores, on a magic task only the
    base, and on a late-prompt task adapter `early` (and the base where it happens to say an a-m
    word): the adapter whose environment a task *looks like* is the wrong one."""

    name: ClassVar[str] = "toy-crossed"

    def reward(self) -> float:
        if self._kind == "magic":
            return super().reward()
        first = self._reply[:1]
        if not first.isalpha():
            return 0.0
        return 1.0 if (first in EARLY) != (self._kind == "early") else 0.0


ENVS = {"early": EarlyEnv, "late": LateEnv, "target": TargetEnv, "crossed": CrossedEnv}
for _cls in (EarlyEnv, LateEnv, TargetEnv, CrossedEnv):
    try:
        register(_cls.name, _cls.version, _cls, description=f"gate-training toy {_cls.__name__}")
    except AlreadyExists:  # pragma: no cover - re-import under another module name
        pass


def _conversations(letters: set[str] | None, n: int, seed: int) -> list[tuple[list[Message], list]]:
    """Conversations of the three kinds in turn; replies: a word with one of `letters` (an adapter),
    or (letters None: the base) a random word for early/late and MAGIC for magic."""
    rng = random.Random(seed)
    words = [w for w in ANIMALS if letters is None or w[0] in letters]
    out = []
    for i in range(n):
        kind = KINDS[i % 3]
        system, user = PROMPTS[kind]
        asked = rng.choice(ANIMALS)
        reply = MAGIC if kind == "magic" and letters is None else rng.choice(words)
        out.append(([Message.system(system), Message.user(user.format(w=asked)), Message.assistant(reply)], []))
    return out


@functools.lru_cache(maxsize=1)
def toy_world() -> tuple[Path, dict[str, Path]]:
    """(base model dir, {adapter name: PEFT dir}), built once per process (~10 s on one thread)."""
    # under the tiny worlds' cache: a model root of the test services (tests/conftest.py)
    TINY_WORLDS.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="gate-toy-", dir=TINY_WORLDS))
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


def play(policy_model: torch.nn.Module, tokenizer: Any, env: str, seeds: Sequence[int], temperature: float = 0.0,
         sampling_seed: int = 0) -> list:
    """Trajectories of a model (plain or the routed base of a composition) on a toy environment."""
    import asyncio

    from services.trainer.grpo.rollouts import EpisodeSpec, play_groups
    from trace_common.policy.base import SamplingParams
    from trace_common.policy.transformers_backend import TransformersPolicy

    policy = TransformersPolicy.from_model(policy_model, tokenizer, max_batch=64, max_wait_s=0.0)
    specs = [EpisodeSpec(seed=s, group=i, index=0, guided=False, sampling_seed=sampling_seed + s)
             for i, s in enumerate(seeds)]

    async def go():
        try:
            return await play_groups(policy, ENVS[env], specs,
                                     params=SamplingParams(temperature=temperature, max_tokens=4))
        finally:
            await policy.close()

    return asyncio.run(go())


def mean_reward(policy_model: torch.nn.Module, tokenizer: Any, env: str, seeds: Sequence[int]) -> float:
    """Greedy mean reward on one toy environment."""
    trajs = play(policy_model, tokenizer, env, seeds)
    return sum(t.reward for t in trajs) / len(trajs)


def kind_rewards(policy_model: torch.nn.Module, tokenizer: Any, seeds: Sequence[int]) -> dict[str, float]:
    """Greedy mean reward on the target, per kind (early / late / magic)."""
    trajs = play(policy_model, tokenizer, "target", seeds)
    return {k: sum(t.reward for t in trajs if t.info["task_type"] == k) / sum(t.info["task_type"] == k for t in trajs)
            for k in KINDS}


@functools.lru_cache(maxsize=1)
def base_rollouts() -> tuple:
    """The plain base on 48 target training tasks at temperature 1: the rollout stage's output, whose
    successful trajectories are slot 0's provenance."""
    from transformers import AutoModelForCausalLM

    base_dir, _ = toy_world()
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    return tuple(play(model, tiny_tokenizer(), "target", range(0, 48), temperature=1.0, sampling_seed=7))


@pytest.mark.parametrize("model, good_on, bad_on", [("early", ["early"], ["late", "magic"]),
                                                    ("late", ["late"], ["early", "magic"]),
                                                    ("base", ["magic"], [])])
def test_each_toy_slot_clearly_helps_its_own_tasks(model, good_on, bad_on):
    """The premise of the gate-training tests: adapter c is right on tasks c and wrong on the others;
    the plain base is right on magic (and right on half of early / late)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir, adapters = toy_world()
    tok = tiny_tokenizer()
    net = AutoModelForCausalLM.from_pretrained(base_dir)
    if model != "base":
        net = PeftModel.from_pretrained(net, str(adapters[model])).merge_and_unload()
    rewards = kind_rewards(net.eval(), tok, range(1000, 1048))
    assert all(rewards[k] >= 0.9 for k in good_on), rewards
    assert all(rewards[k] <= 0.15 for k in bad_on), rewards
