"""GRPO hyper-parameters: one documented pydantic model, TRL's field names where the meaning is the same.

Names shared with `trl.GRPOConfig` (same meaning): `learning_rate`, `num_generations`,
`max_completion_length`, `temperature`, `top_p`, `top_k`, `beta`, `epsilon`, `epsilon_high`,
`scale_rewards`, `loss_type`, `num_iterations` (PPO-style passes over one batch, TRL's mu),
`gradient_accumulation_steps`, `max_grad_norm`, `weight_decay`, `adam_beta1`, `adam_beta2`,
`adam_epsilon`, `lr_scheduler_type`, `warmup_steps`, `max_steps`, `save_steps`, `seed`,
`gradient_checkpointing` (default False here; TRL's GRPOConfig defaults it to True),
`lora_r` / `lora_alpha` / `lora_dropout` / `lora_target_modules` (TRL's `ModelConfig`).

Names of our own, because TRL has no equivalent or its meaning differs:
- `groups_per_batch`: environment instances (seeds) per iteration; TRL counts completions
  per device instead, which has no meaning for multi-turn episodes.
- `max_turns`: assistant turns per episode (multi-turn tool use).
- `guidance_*`: guided rollouts (docs/design.md "Guided rollouts").
- `max_resample_rounds`, `early_stop_uninformative_iterations`: group dropping and the
  stop rule for a run that has no learning signal.
- `initial_batches_uri`: the environment's calibration episodes as the first batches
  (initial_batches.py).
- `checkpoint_at`: iterations checkpointed besides every `save_steps`-th (TRL saves on a
  fixed interval only), so a run evaluated at chosen points keeps exactly those checkpoints.

`report_to` is TRL's (transformers' `TrainingArguments.report_to`): the experiment trackers the
per-iteration metrics go to, among "tensorboard", "wandb" and "none" (trackers.py). Two differences:
the default is ["tensorboard"] (event files beside the checkpoints; transformers' is "none"), and
"all" (every tracker that happens to be installed) is refused in favour of naming them.

`gradient_accumulation_steps` here splits one iteration's episodes into that many
micro-batches, each backpropagated separately, with one optimizer step per pass over the
batch: it bounds activation memory and never changes the result beyond float rounding
(the loss is normalised by the whole batch's token count first). TRL instead multiplies the
generation batch by it.

Unknown keys are refused with the TRL/TRACE name to use instead (`group_size` ->
`num_generations`, ...), so a config written for another trainer fails loudly, not silently;
so are fields an earlier TRACE had (`REMOVED`: `guidance_position`), with what to do instead.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Keys people write for other trainers -> the field that means the same here.
ALIASES: dict[str, str] = {
    "group_size": "num_generations",
    "num_samples": "num_generations",
    "lr": "learning_rate",
    "kl_coef": "beta",
    "kl_beta": "beta",
    "clip_range": "epsilon",
    "clip_eps": "epsilon",
    "epsilon_low": "epsilon",
    "clip_range_high": "epsilon_high",
    "max_new_tokens": "max_completion_length",
    "max_tokens": "max_completion_length",
    "iterations": "max_steps",
    "num_train_steps": "max_steps",
    "steps": "max_steps",
    "ppo_epochs": "num_iterations",
    "mu": "num_iterations",
    "rank": "lora_r",
    "r": "lora_r",
    "alpha": "lora_alpha",
    "target_modules": "lora_target_modules",
    "batch_size": "groups_per_batch",
    "per_device_train_batch_size": "groups_per_batch",
    "checkpoint_every": "save_steps",
    "guidance_ratio": "guidance_fraction",
}

#: Fields an earlier TRACE had, refused with what to do instead (a config written then fails loudly).
REMOVED: dict[str, str] = {
    "guidance_position": "guidance is always shown as an <expert_guidance> block at the end of the system "
                         "prompt (issue 31; the prose hint in the first user message is gone); remove the field",
}


class VLLMRolloutConfig(BaseModel):
    """Rollouts from a vLLM server that hot-loads each adapter version (`--enable-lora`,
    `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field("", description="The trainer operator's endpoint profile of the server "
                         "(TRACE_TRAINER_ENDPOINTS); a job sent to the trainer service names this or the "
                         "profile's exact base_url.")
    base_url: str = Field("", description="OpenAI-compatible base URL of the server, e.g. http://vllm:8000/v1; "
                          "through the trainer service it must be a profile's base_url (empty: the profile's).")
    adapter_dir: str = Field(description="Directory the server can read where each adapter version is "
                             "saved before it is loaded (a shared volume in a cluster); through the trainer "
                             "service, inside its TRACE_TRAINER_VLLM_ADAPTER_ROOT (a relative path is taken "
                             "from there).")
    request_timeout_s: float = Field(30.0, gt=0, le=3600, description="Deadline of one HTTP call.")
    load_retries: int = Field(3, ge=0, le=20, description="Retries of a failed load/verify before the job fails.")
    retry_backoff_s: float = Field(1.0, ge=0, le=60, description="First retry delay (doubles each retry).")
    drain_timeout_s: float = Field(120.0, gt=0, le=3600,
                                   description="Longest wait for requests on an old version before unloading it "
                                   "anyway (never hangs).")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError(f"vllm.base_url {v!r} must be an http(s) URL such as http://127.0.0.1:8000/v1")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _where(self) -> VLLMRolloutConfig:
        if not (self.profile or self.base_url):
            raise ValueError("vllm needs the server: name the operator's endpoint profile (vllm.profile) or its "
                             "base_url (vllm.base_url, e.g. http://vllm:8000/v1)")
        return self


class GRPOConfig(BaseModel):
    """Hyper-parameters of one GRPO LoRA training run (see the module docstring for naming)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- schedule -------------------------------------------------------------------------------
    max_steps: int = Field(100, ge=1, le=1_000_000, description="GRPO iterations (one batch of groups each).")
    groups_per_batch: int = Field(4, ge=1, le=4096, description="Environment instances (seeds) per iteration.")
    num_generations: int = Field(8, ge=2, le=1024, description="Episodes per instance (the group size G).")
    max_resample_rounds: int = Field(
        0, ge=0, le=16, description="Constant-reward groups are dropped; up to this many extra rounds draw "
        "fresh seeds to replace them (0: train on the informative groups only).")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seeds the seed schedule, sampling and LoRA "
                      "initialisation (at most 2**63-1, torch.manual_seed's range).")
    initial_batches_uri: str = Field(
        "", max_length=4096, description="A calibration-batches manifest (calibration_batches.json, in this "
        "trainer's store) of the environment being trained: its calibration episodes, played by the base policy "
        "(= the adapter at initialisation), become the first iterations' batches, groups_per_batch groups of "
        "num_generations each, and the seed schedule skips their seeds (initial_batches.py). Refused unless "
        "they were sampled as this config samples (temperature, top_p, top_k, max_completion_length, max_turns, "
        "train_split). Empty: every iteration plays its own episodes.")
    # -- rollouts ---------------------------------------------------------------------------------
    max_completion_length: int = Field(128, ge=1, le=32768, description="Most tokens of one assistant turn.")
    max_turns: int = Field(0, ge=0, le=256, description="Assistant turns per episode; 0 = the environment's default.")
    temperature: float = Field(1.0, gt=0.0, le=5.0, description="Sampling temperature (> 0: GRPO needs sampling).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass; 1.0 = true sampling.")
    top_k: int = Field(0, ge=0, description="Top-k truncation; 0 = none (true sampling).")
    train_split: str = Field("train", min_length=1, description="Environment split the seeds come from.")
    generation_batch_size: int = Field(64, ge=1, le=4096, description="Most sequences generated in one batch.")
    episode_timeout_s: float = Field(600.0, gt=0, le=86400, description="Wall-clock limit of one episode.")
    # -- guided rollouts ---------------------------------------------------------------------------
    guidance_text: str = Field(
        "", max_length=4000, description="Override guidance: every guided episode shows this text in its "
        "`<expert_guidance>` block instead of its instance's own (the environment's `Observation.guidance`, "
        "guidance.py); empty = the instance's guidance.")
    guidance_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of each group played with the guidance shown as an "
        "`<expert_guidance>` block at the end of the system prompt (trace_common/env/guidance.py), rounded half "
        "up to whole episodes; the update trains on the plain prompt. The TRACE reference uses 0.25-0.5; any "
        "share that leaves at least one guided and one unguided episode per group is accepted, because the "
        "share is a setting chosen on train/dev. 0 = no guided rollouts. Asking for guidance from an "
        "environment that supplies none, with no guidance_text, fails before training starts.")
    guidance_mode: Literal["importance_weighted", "exclude"] = Field(
        "importance_weighted", description="How the off-policy guided tokens enter the loss: weighted by "
        "min(cap, pi_old(y | unguided context) / q(y | guided context)) per token, or left out of the loss "
        "(they still count for the group's reward statistics).")
    guidance_importance_cap: float = Field(1.0, gt=0.0, le=100.0,
                                           description="Truncation C of the guided tokens' importance weights.")
    # -- loss ---------------------------------------------------------------------------------------
    beta: float = Field(0.0, ge=0.0, le=10.0, description="KL coefficient to the frozen base (adapter disabled).")
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="Lower clip range of the ratio (1 - epsilon).")
    epsilon_high: float = Field(0.28, gt=0.0, le=10.0, description="Upper clip range of the ratio (1 + epsilon_high).")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Advantage scale: the group's reward std, the batch's, or none.")
    loss_type: Literal["dapo", "grpo"] = Field(
        "dapo", description="dapo: token-mean over the whole batch (the default); grpo: mean per sequence, then mean.")
    advantage_epsilon: float = Field(1e-4, gt=0.0, le=1.0, description="eps in A = (r - mean) / (std + eps).")
    num_iterations: int = Field(1, ge=1, le=16, description="Optimisation passes over each batch (TRL's mu).")
    gradient_accumulation_steps: int = Field(1, ge=1, le=4096, description="Micro-batches per pass (memory bound).")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass (less memory, ~1/3 more compute).")
    # -- optimiser ----------------------------------------------------------------------------------
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW learning rate of the LoRA parameters.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0)
    adam_epsilon: float = Field(1e-8, gt=0.0, le=1e-2)
    max_grad_norm: float = Field(1.0, ge=0.0, description="Gradient norm clip; 0 disables.")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    # -- LoRA ---------------------------------------------------------------------------------------
    lora_r: int = Field(16, ge=1, le=1024, description="LoRA rank.")
    lora_alpha: float = Field(32.0, gt=0.0, description="LoRA scaling numerator (scale = alpha / r).")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input (0 keeps runs exact).")
    lora_target_modules: str | list[str] = Field(
        "all-linear", description="'all-linear' (every linear projection of the blocks) or module names "
        "such as ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'].")
    # -- checkpoints, stopping, determinism ----------------------------------------------------------
    save_steps: int = Field(10, ge=0, description="Checkpoint every this many iterations (0: only at the end).")
    checkpoint_at: list[int] = Field(
        default_factory=list, description="Iterations that get a checkpoint besides every save_steps-th (and the "
        "last), e.g. the points of an evaluation's budget curve; each in [1, max_steps].")
    early_stop_uninformative_iterations: int = Field(
        5, ge=0, description="Stop (reason given) after this many consecutive iterations with no informative "
        "group; 0 never stops early.")
    # -- precision ------------------------------------------------------------------------------------
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Dtype the base weights load in (TRL: model_init_kwargs={'dtype': ...}). 'bfloat16' "
        "halves the base's memory on every rank (a 30B base: ~61 GB instead of ~122 GB), as the reference trains; "
        "an adapter job's LoRA weights, their gradients and AdamW state stay float32 (PEFT casts adapter weights "
        "up), the forward (the LM head included) runs in bfloat16 and the log-softmax over its logits in float32. "
        "A gate job loads its composition's base in it, the frozen adapters cast to it, the gates float32. No "
        "float16: without loss scaling its gradients overflow. An adapter_uri to merge into the base needs "
        "float32 (bfloat16 cannot hold most of a LoRA delta: below its precision).")
    deterministic: bool = Field(
        False, description="torch deterministic algorithms; with a fixed thread count, repeated and resumed "
        "runs give bitwise-identical adapters on CPU.")
    rollout_backend: Literal["in_process", "vllm"] = "in_process"
    vllm: VLLMRolloutConfig | None = None
    # -- where the metrics go (trackers.py) ----------------------------------------------------------
    report_to: list[str] = Field(
        default_factory=lambda: ["tensorboard"], description="Experiment trackers of the per-iteration metrics "
        "(TRL's report_to): 'tensorboard' (event files under <job prefix>/tensorboard/, beside the checkpoints), "
        "'wandb' (a Weights & Biases run, offline unless the trainer's operator sets TRACE_TRAINER_WANDB_MODE; "
        "needs the trace-agents[wandb] extra in the worker), or 'none'. A single name is taken as a list of one.")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        known = set(cls.model_fields)
        for key in data:
            if key in known:
                continue
            if key in ALIASES:
                raise ValueError(f"unknown GRPO config key {key!r}: use {ALIASES[key]!r} (TRL's name)")
            if key in REMOVED:
                raise ValueError(f"{key}: {REMOVED[key]}")
            near = sorted(k for k in known if k.startswith(str(key)[:4]))
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ValueError(f"unknown GRPO config key {key!r}{hint} (see services.trainer.grpo.config.GRPOConfig)")
        return data

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to(cls, v: Any) -> list[str]:
        from .trackers import REPORT_TO

        names = [v] if isinstance(v, str) else v
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"report_to={v!r}: give a list of tracker names among {list(REPORT_TO)}, "
                             "e.g. ['tensorboard']")
        if "all" in names:
            raise ValueError("report_to='all' (every installed tracker) is not accepted: name them, e.g. "
                             "['tensorboard', 'wandb']")
        bad = [n for n in names if n not in REPORT_TO]
        if bad:
            raise ValueError(f"report_to has unknown tracker(s) {bad}: use any of {list(REPORT_TO)}, e.g. "
                             "['tensorboard'] (the default) or ['none']")
        if "none" in names and len(set(names)) > 1:
            raise ValueError(f"report_to={list(names)} names 'none' with trackers: give either ['none'] or the "
                             "trackers")
        return list(dict.fromkeys(names)) or ["none"]

    @field_validator("initial_batches_uri")
    @classmethod
    def _batches_uri(cls, v: str) -> str:
        from trace_common.specs import check_uri

        return check_uri(v, "initial_batches_uri", required=False)

    @field_validator("lora_target_modules")
    @classmethod
    def _targets(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, str):
            if v != "all-linear":
                raise ValueError(f"lora_target_modules={v!r}: give 'all-linear' or a list of module names such "
                                 "as ['q_proj', 'v_proj']")
            return v
        if not v or any(not isinstance(m, str) or not m for m in v):
            raise ValueError("lora_target_modules must be 'all-linear' or a non-empty list of module names")
        return list(v)

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.epsilon_high < self.epsilon:
            raise ValueError(f"epsilon_high={self.epsilon_high} < epsilon={self.epsilon}: the upper clip range "
                             "must be at least the lower one (DAPO's clip-higher); e.g. epsilon=0.2, epsilon_high=0.28")
        if self.rollout_backend == "vllm" and self.vllm is None:
            raise ValueError("rollout_backend='vllm' needs a vllm block: "
                             "{'profile': 'vllm', 'adapter_dir': 'adapters'}")
        if self.top_k == 1:
            raise ValueError("top_k=1 is greedy decoding: every episode of a group would be identical; "
                             "use top_k=0 (true sampling) or a value >= 2")
        if self.guidance_fraction > 0 and self.guided_per_group == 0:
            raise ValueError(f"guidance_fraction={self.guidance_fraction:g} rounds to no guided episode in a group of "
                             f"num_generations={self.num_generations}; raise it to at least "
                             f"{math.ceil(500 / self.num_generations) / 1000:.3f} or set it to 0 (no guided rollouts)")
        if self.guidance_fraction > 0 and self.guided_per_group == self.num_generations:
            raise ValueError("guidance_fraction leaves no unguided episode in a group; lower it below "
                             f"{(self.num_generations - 0.5) / self.num_generations:.2f}")
        late = [k for k in self.checkpoint_at if not 1 <= k <= self.max_steps]
        if late:
            raise ValueError(f"checkpoint_at={late}: every iteration must be in [1, max_steps={self.max_steps}]; "
                             "raise max_steps or drop those iterations")
        if self.warmup_steps >= self.max_steps and self.warmup_steps > 0:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be below max_steps={self.max_steps}")
        return self

    @property
    def guided_per_group(self) -> int:
        """Guided episodes in each group: round(guidance_fraction * num_generations)."""
        return int(self.guidance_fraction * self.num_generations + 0.5)

    def digest(self) -> str:
        """Short hash of the config (recorded in checkpoints and the run manifest)."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]

    #: Fields that say how long to train, how often to save, or how the update is laid out in memory,
    #: not what is trained: a checkpoint written under one value continues under another ("train
    #: longer" resumes; so does a re-run with more micro-batches after the worker ran out of memory).
    RESUME_NEUTRAL: ClassVar[frozenset[str]] = frozenset(
        {"max_steps", "save_steps", "checkpoint_at", "gradient_accumulation_steps", "gradient_checkpointing",
         "vllm",          # where rollouts are served (server, adapter directory), not what is trained
         "report_to"})    # where the metrics are logged

    #: RESUME_NEUTRAL before `vllm` joined it (checkpoints written then still continue, when the
    #: config is unguided: `resumable_digests`).
    _PREVIOUS_RESUME_NEUTRAL: ClassVar[frozenset[str]] = RESUME_NEUTRAL - {"vllm"}

    #: RESUME_NEUTRAL before the memory-layout fields joined it: checkpoints written then carry a
    #: digest over those fields, and an unguided config still continues them under the same values
    #: (`resumable_digests`).
    #: (`checkpoint_at` and `report_to` came later still; no digest ever covered them, so they are left
    #: out here too.)
    _LEGACY_RESUME_NEUTRAL: ClassVar[frozenset[str]] = frozenset(
        {"max_steps", "save_steps", "checkpoint_at", "report_to"})

    #: What every checkpoint written before `guidance_position` was removed (REMOVED) recorded for it
    #: in its digest. Only an unguided config continues such a checkpoint: its rollouts never showed
    #: guidance, so the removal changed nothing it trains. A guided one starts fresh, because its
    #: guided prompts now show the block in the system prompt where they showed prose.
    _REMOVED_WHEN_UNGUIDED: ClassVar[tuple[dict[str, str], ...]] = (
        {"guidance_position": "user"}, {"guidance_position": "system"})

    def _digest_without(self, neutral: frozenset[str], extra: dict[str, Any] | None = None) -> str:
        data = {k: v for k, v in self.model_dump(mode="json").items() if k not in neutral}
        if not data.get("initial_batches_uri"):   # unset: the digest of a config from before the field existed
            data.pop("initial_batches_uri", None)
        if data.get("dtype") == "float32":        # the default: the digest of a config from before the field existed
            data.pop("dtype", None)
        data.update(extra or {})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def resume_digest(self) -> str:
        """Short hash of the fields a checkpoint must agree on to be continued (recorded in it)."""
        return self._digest_without(self.RESUME_NEUTRAL)

    def resumable_digests(self) -> frozenset[str]:
        """Digests of the checkpoints this config continues: today's, and, for an unguided config,
        the ones an older TRACE recorded for the same values (its dump still held `guidance_position`,
        under each of the earlier neutral sets), so an upgrade mid-training does not restart it."""
        old: tuple[str, ...] = ()
        if self.guided_per_group == 0:
            old = tuple(self._digest_without(neutral, extra)
                        for neutral in (self.RESUME_NEUTRAL, self._PREVIOUS_RESUME_NEUTRAL,
                                        self._LEGACY_RESUME_NEUTRAL)
                        for extra in self._REMOVED_WHEN_UNGUIDED)
        return frozenset({self.resume_digest(), *old})


def parse_config(values: dict[str, Any] | None, model: type[GRPOConfig] = GRPOConfig) -> GRPOConfig:
    """Validate a config dict (e.g. from the proto's Struct) into InvalidArgument errors that
    name the field and say how to fix it. `model`: GRPOConfig or a subclass of it (gate training)."""
    from pydantic import ValidationError

    from trace_common.errors import InvalidArgument

    data = dict(values or {})
    # Struct numbers arrive as floats: integral floats for int fields are accepted.
    for name, field in model.model_fields.items():
        if name in data and field.annotation is int and isinstance(data[name], float) and data[name].is_integer():
            data[name] = int(data[name])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "config"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        raise InvalidArgument(msg, field=f"config.{where}" if where != "config" else "config",
                              fix=f"see {model.__module__}.{model.__name__} for every field and its range") from None
