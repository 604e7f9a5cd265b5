"""The `tracectl run` configuration file (YAML), validated once here.

Every section maps onto one stage and one service; fields a service validates itself
(GRPO hyper-parameters, gate training) pass through as dictionaries and are checked by that
service's pydantic model when the job is created, so a typo fails the run before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trace_common.config import SERVICE_NAMES
from trace_common.errors import InvalidArgument

Arm = Literal["base", "best_single", "grpo_target", "gepa", "trace_routing", "trace_per_request"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LlmSection(Section):
    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://vllm:8000/v1.")
    model: str = Field(description="Served model name.")
    api_key_env: str = ""


class StoreSection(Section):
    root: str = Field("file://./.trace", description="Artifact store root: file:///dir or s3://bucket[/prefix].")
    s3_endpoint: str | None = Field(None, description="host:port of the S3 server for s3:// roots.")
    s3_access_key_env: str = Field("TRACE_S3_ACCESS_KEY", description="Env var holding the S3 access key.")
    s3_secret_key_env: str = Field("TRACE_S3_SECRET_KEY", description="Env var holding the S3 secret key.")
    s3_secure: bool = False


class TargetSection(Section):
    env: str = Field("store", description="Registered target environment (store, tau2-retail...).")
    uri: str = Field("", description="Data directory for data-backed targets (tau2), as a path or file:// URI.")
    params: dict[str, str] = Field(default_factory=dict)
    user_simulator: LlmSection | None = Field(None, description="LLM user simulator (tau2 targets).")


class BaseAgentSection(Section):
    name: str = Field("micro", description="'micro', 'smollm2', a local HF model dir, or a served model name.")
    backend: Literal["in-process", "http"] = "in-process"
    endpoint: str = Field("", description="OpenAI-compatible base URL when backend is http (vLLM).")
    warm_start: dict[str, Any] = Field(default_factory=dict, description="Warm-start overrides (built-in agents).")


class RolloutSection(Section):
    split: str = "train"
    limit: int = Field(64, ge=1, description="Target training tasks played by the base agent.")
    samples: int = Field(2, ge=1, description="Samples per task.")
    temperature: float = Field(1.0, ge=0.0)
    concurrency: int = Field(16, ge=1)


class AnalysisSection(Section):
    mode: Literal["diagnostics", "llm"] = "diagnostics"
    llm: LlmSection | None = None
    num_runs: int = Field(10, ge=1)
    min_passing_runs: int = Field(8, ge=1)
    min_coverage: float = Field(0.10, ge=0.0, le=1.0)
    min_gap: float = Field(0.20, ge=0.0, le=1.0)
    max_capabilities: int = Field(4, ge=1, description="Train at most this many retained capabilities (by coverage).")

    @model_validator(mode="after")
    def _llm(self) -> AnalysisSection:
        if self.mode == "llm" and self.llm is None:
            raise ValueError("analysis.mode is 'llm' but analysis.llm is missing: give base_url and model, "
                             "or use mode: diagnostics")
        if self.min_passing_runs > self.num_runs:
            raise ValueError(f"analysis.min_passing_runs ({self.min_passing_runs}) > num_runs ({self.num_runs})")
        return self


class EnvironmentsSection(Section):
    mode: Literal["library", "llm"] = "library"
    llm: LlmSection | None = None
    max_retries: int = Field(3, ge=0)
    calibration_reward_min: float = Field(0.2, gt=0.0, le=1.0, description="Lowest accepted mean reward of the base "
                                          "policy on a candidate environment (a small value such as 0.001 accepts "
                                          "any environment the base earns something on).")
    calibration_reward_max: float = Field(0.6, gt=0.0, le=1.0, description="Highest accepted mean reward.")
    calibration_min_informative: float | None = Field(
        None, ge=0.0, le=1.0, description="Lowest fraction of informative calibration groups (None: the environment "
                                          "service's setting, 0.5). 0 accepts environments where the base policy "
                                          "never varies; GRPO then relies on guided rollouts (training.grpo."
                                          "guidance_fraction).")


class TrainingSection(Section):
    executor: Literal["local", "kubernetes"] = "local"
    parallel: int = Field(2, ge=1, description="Adapters trained at once.")
    grpo: dict[str, Any] = Field(default_factory=dict, description="GRPO config (TRL names), per adapter.")


class GatesSection(Section):
    config: dict[str, Any] = Field(default_factory=dict, description="Gate training config.")


class EvaluationSection(Section):
    split: str = "test"
    limit: int = Field(200, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    arms: list[Arm] = Field(default_factory=lambda: ["base", "best_single", "grpo_target", "trace_routing",
                                                     "trace_per_request"])
    gepa: LlmSection | None = Field(None, description="Reflection LLM for the GEPA prompt-optimization arm.")

    @model_validator(mode="after")
    def _gepa(self) -> EvaluationSection:
        if "gepa" in self.arms and self.gepa is None:
            raise ValueError("evaluation.arms includes 'gepa' but evaluation.gepa (a reflection LLM endpoint) is "
                             "missing; add it or drop the arm")
        return self


class RunConfig(Section):
    run_id: str = Field(description="Names the run directory runs/<run_id>/ (letters, digits, '-', '_').")
    seed: int = 0
    services: dict[str, str] = Field(default_factory=dict, description="service -> host:port; empty = embedded.")
    store: StoreSection = StoreSection()
    target: TargetSection = TargetSection()
    base_agent: BaseAgentSection = BaseAgentSection()
    rollout: RolloutSection = RolloutSection()
    analysis: AnalysisSection = AnalysisSection()
    environments: EnvironmentsSection = EnvironmentsSection()
    training: TrainingSection = TrainingSection()
    gates: GatesSection = GatesSection()
    evaluation: EvaluationSection = EvaluationSection()

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str) -> str:
        from trace_common.jobs import RUN_ID_RE

        if not RUN_ID_RE.match(v):
            raise ValueError(f"run_id {v!r}: use 1-64 letters, digits, '-' or '_' (e.g. demo-1)")
        return v

    @field_validator("services")
    @classmethod
    def _services(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = set(v) - set(SERVICE_NAMES)
        if unknown:
            raise ValueError(f"services: unknown {sorted(unknown)}; known: {', '.join(SERVICE_NAMES)}")
        return v

    def section(self, stage: str) -> dict[str, Any]:
        """The configuration stage `stage` depends on directly (for manifest hashes)."""
        by_stage = {"rollout": [self.target, self.base_agent, self.rollout], "analysis": [self.analysis],
                    "environments": [self.environments], "adapters": [self.training], "gates": [self.gates],
                    "evaluation": [self.evaluation], "report": []}
        return {"seed": self.seed, "parts": [p.model_dump() for p in by_stage[stage]]}


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise InvalidArgument(field="--config", expected="a readable YAML file", got=str(path),
                              fix="see examples/demo.yaml") from err
    except yaml.YAMLError as err:
        raise InvalidArgument(f"{path}: not valid YAML: {err}") from err
    data.update(overrides or {})
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg'].removeprefix('Value error, ')}"
                 for e in err.errors()]
        raise InvalidArgument(f"{path}: invalid run config:\n  " + "\n  ".join(lines)) from None
