"""The gate-training job's config (`GateGRPOConfig`): GRPO's fields (TRL names, applied to the gates
only) plus the warm start's, with the rules that refuse a field that would be inert (LoRA settings,
the other label kind's fields, removed fields). The job itself is `grpo.py`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.trainer.gates.warm_start import GateTrainingConfig
from services.trainer.grpo.config import GRPOConfig
from trace_common.specs import check_uri

_LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


#: Fields only one kind of warm-start label reads. Set to anything but its default under the other kind
#: a field would do nothing, so the config refuses it (a setting that is configured but inert is an
#: error, not a no-op); a default value passes, so a fully dumped config (ValidateTrainingConfig's
#: answer, the worker's spec) parses again, as the LoRA fields' rule does.
_ONLY_FOR: dict[str, frozenset[str]] = {
    "provenance": frozenset({"warm_start_episodes", "base_provenance", "base_provenance_uris"}),
    "outcome": frozenset({"warm_start_tasks", "warm_start_samples_per_slot", "warm_start_temperature",
                          "warm_start_fallback_score", "warm_start_tie_label"}),
}


class GateGRPOConfig(GRPOConfig):
    """Gate-training job config: the GRPO fields (TRL names, same meaning, applied to the gates) plus
    the warm start's. `lora_*` do not apply (the adapters are frozen) and are refused when set to
    anything but their defaults."""

    max_steps: int = Field(20, ge=0, le=1_000_000,
                           description="GRPO iterations on the gates after the warm start (0 = warm start only).")
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0, description="AdamW learning rate of the gates in GRPO.")
    load_balancing_coef: float = Field(
        0.01, ge=0.0, le=10.0, description="Weight of the Switch load-balancing term added to the GRPO loss.")
    max_resample_rounds: int = Field(
        3, ge=0, le=16, description="Uninformative (constant-reward) GRPO groups on the gates, and groups cut short by a "
                                    "policy error or timeout, are dropped and up to this many extra rounds draw fresh "
                                    "target training tasks to replace them; every "
                                    "re-collected episode is counted in rollouts_total (0: train on the informative "
                                    "groups only). 3, as the reference re-collects.")
    warm_start_steps: int = Field(100, ge=0, le=1_000_000,
                                  description="Warm-start optimizer steps on the labelled sequences (0 = no warm start).")
    warm_start_labels: Literal["outcome", "provenance"] = Field(
        "outcome", description="Where the warm start's labels come from. `outcome` (default): every slot alone (the "
                               "base, each adapter) replays `warm_start_tasks` target training tasks and each task is "
                               "labelled with the slot that scores there, trained on that slot's own trajectory "
                               "(outcomes.py). `provenance`: each token is labelled with the environment its "
                               "trajectory came from (provenance.py) -- kept only as the ablation that measures what "
                               "outcome labels add (it learns which environment a prompt looks like, not which adapter "
                               "helps on the task).")
    warm_start_tasks: int = Field(
        32, ge=1, le=65_536, description="Outcome labels: target training tasks every slot replays (the last of GRPO's "
                                         "seed schedule, disjoint from the tasks GRPO on the gates draws first). The "
                                         "replays cost warm_start_tasks x (K+1) x warm_start_samples_per_slot episodes, "
                                         "counted in the job's budget.")
    warm_start_samples_per_slot: int = Field(
        1, ge=1, le=64, description="Outcome labels: episodes per slot and task, at the GRPO sampling settings; a "
                                    "slot's score on a task is its mean reward over them.")
    warm_start_temperature: float | None = Field(
        None, ge=0.0, le=5.0, description="Outcome labels: sampling temperature of the replays (0 = greedy, as the "
                                          "evaluation decodes; then warm_start_samples_per_slot must be 1). None "
                                          "(default): `temperature`, GRPO's.")
    warm_start_fallback_score: str = Field(
        "", max_length=64, pattern=r"^([a-z][a-z0-9_]*)?$",
        description="Outcome labels: a reward_breakdown entry that labels the tasks where no slot scores a reward "
                    "above 0; the slot with its highest mean wins, as for the reward. Pick one that is 1 only when "
                    "the reward is, such as the store's `credit` (the share of sub-requests fulfilled, 0 after a "
                    "policy violation or an unrequested change); the store's `subrequests` ignores both and can "
                    "prefer a slot that rarely passes. Empty (default): such tasks give no label.")
    warm_start_tie_label: Literal["base", "none"] = Field(
        "base", description="Outcome labels: what a task where every slot scores the same (by the deciding score) "
                            "teaches. `base` (default): it is labelled with the base, so routing keeps the base's "
                            "behaviour where no adapter does better. `none`: it gives no label, as a GRPO group whose "
                            "episodes all score the same teaches nothing; the gates then learn only from tasks where "
                            "the slots differ, so where the adapters mostly replay the base's behaviour the base may "
                            "get few or no examples (outcome_tied_tasks counts the tasks every slot tied on). Ties among some "
                            "slots only still go to the base, else the lowest adapter index. A tie on the reward does "
                            "not fall through to warm_start_fallback_score, which decides only where no slot scores.")
    warm_start_episodes: int = Field(
        16, ge=1, le=4096, description="Provenance labels only: episodes played per capability environment; also the "
                                       "most base trajectories slot 0 takes.")
    warm_start_learning_rate: float = Field(5e-3, gt=0.0, le=1.0, description="AdamW learning rate of the warm start.")
    warm_start_batch_size: int = Field(8, ge=1, le=4096, description="Provenance sequences per warm-start step.")
    warm_start_max_length: int = Field(
        8192, ge=8, le=1 << 17, description="Tokens kept per provenance sequence (GateTrainingConfig.max_length: keep "
                                            "it above the target's prompt, or its replies carry no label).")
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0,
                                    description="Share of provenance kept out of the warm start to measure routing "
                                                "accuracy.")
    base_provenance_uris: list[str] = Field(
        default_factory=list, max_length=64,
        description="Provenance labels only (outcome labels replay the base themselves): trajectory files (JSONL "
                    "artifacts in the trainer's store) of the base agent on the target's training tasks: slot 0's "
                    "warm-start examples. The pipeline passes the rollout stage's output. Empty: slot 0 gets no "
                    "example (logged; the gates then never learn to choose the base).")
    base_provenance: Literal["successful", "all", "none"] = Field(
        "successful", description="Provenance labels only: which base trajectories label slot 0: the successful ones "
                                  "(default: the base acted right there), all of them, or none (provenance.py says "
                                  "why).")

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "target_fraction" in data:
                raise ValueError("target_fraction: GRPO on the gates plays the target's training tasks only (the "
                                 "capability environments are the adapters' own); remove the field")
            if "warm_start_tokens" in data:
                raise ValueError("warm_start_tokens: provenance labels only the decisions that generate assistant "
                                 "tokens; remove the field")
        return data

    @field_validator("base_provenance_uris")
    @classmethod
    def _uris(cls, v: list[str]) -> list[str]:
        for i, uri in enumerate(v):
            check_uri(uri, f"base_provenance_uris[{i}]")
        return v

    @model_validator(mode="after")
    def _gates_only(self) -> GateGRPOConfig:
        if self.rollout_backend != "in_process":
            raise ValueError("rollout_backend must be 'in_process' for gate training: the composition routes every "
                             "token through its gates, which a vLLM LoRA server cannot do; remove rollout_backend")
        set_lora = sorted(f for f in _LORA_FIELDS
                          if f in self.model_fields_set and getattr(self, f) != GRPOConfig.model_fields[f].default)
        if set_lora:
            raise ValueError(f"{', '.join(set_lora)}: gate training composes frozen adapters, so LoRA settings do not "
                             "apply; remove them")
        if self.max_steps == 0 and self.warm_start_steps == 0:
            raise ValueError("max_steps=0 and warm_start_steps=0 train nothing; set warm_start_steps (e.g. 100) "
                             "and/or max_steps (GRPO iterations)")
        if self.warm_start_temperature == 0 and self.warm_start_samples_per_slot > 1:
            raise ValueError("warm_start_temperature 0 (greedy) replays the same episode every sample; set "
                             "warm_start_samples_per_slot 1, or a warm_start_temperature above 0")
        if self.gradient_checkpointing:
            raise ValueError("gradient_checkpointing does not apply to gate training (the backbone gets no "
                             "gradient); remove it")
        other = "provenance" if self.warm_start_labels == "outcome" else "outcome"
        inert = sorted(f for f in _ONLY_FOR[other] & self.model_fields_set
                       if getattr(self, f) != type(self).model_fields[f].get_default(call_default_factory=True))
        if inert:
            raise ValueError(f"{', '.join(inert)}: {other} labels only, and warm_start_labels is "
                             f"'{self.warm_start_labels}'; remove them, or set warm_start_labels: {other}")
        return self

    def warm_start_config(self, data_digest: str = "") -> GateTrainingConfig:
        return GateTrainingConfig(learning_rate=self.warm_start_learning_rate, max_steps=self.warm_start_steps,
                                  per_device_train_batch_size=self.warm_start_batch_size,
                                  max_length=self.warm_start_max_length, heldout_fraction=self.heldout_fraction,
                                  save_steps=self.save_steps, seed=self.seed, data_digest=data_digest)


__all__ = ["GateGRPOConfig"]
