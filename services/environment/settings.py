"""Settings of the environment service (`TRACE_ENVIRONMENT_*`).

Three groups: episode serving, the sandbox -- where workers run (a process or a Kubernetes
pod), their limits and isolation layers (`TRACE_ENVIRONMENT_SANDBOX_*`, see
services/environment/sandbox/isolation.py and pods.py), and validation
thresholds (`TRACE_ENVIRONMENT_VALIDATION_*`, see services/environment/validation.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from trace_common.config import ServiceSettings
from trace_common.data_roots import ROOTS_DESCRIPTION, default_roots, parse_roots
from trace_common.endpoints import ENDPOINTS_DESCRIPTION, EndpointMap

from .calibration_policy import CalibrationSampling
from .sandbox.config import PodConfig, SandboxConfig
from .validation import ValidationConfig

#: SandboxConfig fields that configure benchmarks and tests, never a deployed service.
NOT_SETTINGS = frozenset({"plain", "python", "kubernetes_api"})


def sandbox_env_names() -> dict[str, tuple[str, ...]]:
    """Every sandbox variable -> the path of the field it sets: TRACE_ENVIRONMENT_SANDBOX_<FIELD> ->
    ("sandbox", field), TRACE_ENVIRONMENT_SANDBOX_NAMESPACE and _SANDBOX_POD_<FIELD> -> ("sandbox",
    "pod", field). The NOT_SETTINGS fields and `pod` itself (set through its own fields) are absent."""
    out: dict[str, tuple[str, ...]] = {}
    for name in SandboxConfig.model_fields:
        if name not in NOT_SETTINGS and name != "pod":
            out[f"TRACE_ENVIRONMENT_SANDBOX_{name.upper()}"] = ("sandbox", name)
    for name in PodConfig.model_fields:
        flat = "NAMESPACE" if name == "namespace" else f"POD_{name.upper()}"
        out[f"TRACE_ENVIRONMENT_SANDBOX_{flat}"] = ("sandbox", "pod", name)
    return out


class EnvironmentSettings(ServiceSettings):
    service_name: ClassVar[str] = "environment"
    # "_" splits once: TRACE_ENVIRONMENT_SANDBOX_CPU_SECONDS -> sandbox.cpu_seconds (flat fields never split)
    model_config = SettingsConfigDict(env_prefix="TRACE_ENVIRONMENT_", extra="ignore", validate_default=True,
                                      env_nested_delimiter="_", env_nested_max_split=1)

    # -- episodes -------------------------------------------------------------------------------
    max_open_episodes: int = Field(256, ge=1, le=100_000, description="Episodes open at once (sandboxes).")
    episode_idle_timeout_s: float = Field(300.0, gt=0, le=86_400,
                                          description="An episode untouched this long is closed.")
    idle_workers_per_env: int = Field(2, ge=0, le=256,
                                      description="Loaded sandbox workers kept per environment version for reuse.")

    # -- sandbox: declared once, in sandbox/config.py (SandboxConfig, PodConfig) ---------------
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description="Where generated code runs and its limits and isolation layers. "
        "Each field is the variable TRACE_ENVIRONMENT_SANDBOX_<FIELD> (pod fields: _SANDBOX_NAMESPACE and "
        "_SANDBOX_POD_<FIELD>), and the keyword sandbox_<field>; bounds and docs are SandboxConfig's.")
    # -- outbound endpoints -----------------------------------------------------------------------
    endpoints: EndpointMap = Field(default_factory=dict, description=ENDPOINTS_DESCRIPTION)
    # -- data directories a request may name (a tau2 target's `data`) ----------------------------
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=default_roots, description=ROOTS_DESCRIPTION)

    # -- validation -----------------------------------------------------------------------------
    validation_seeds: int = Field(8, ge=2, le=500, description="Seeds for the determinism and oracle checks.")
    validation_trivial_episodes: int = Field(16, ge=1, le=1000, description="Episodes for the no-op / random checks.")
    validation_noop_max_mean: float = Field(0.1, ge=0, le=1, description="Highest mean reward of the no-op policy.")
    validation_random_max_mean: float = Field(0.25, ge=0, le=1, description="Highest mean reward of the random policy.")
    validation_trivial_max_success: float = Field(0.1, ge=0, le=1, description="Highest trivial-policy success rate.")
    validation_groups: int = Field(16, ge=1, le=1000, description="Calibration groups (seeds).")
    validation_group_size: int = Field(8, ge=2, le=256, description="Calibration samples per group.")
    validation_min_informative: float = Field(0.5, ge=0, le=1, description="Lowest informative-group fraction.")
    validation_max_addendum_chars: int = Field(600, ge=0, le=20_000, description="Longest capability addendum a "
                                               "candidate's system prompt may add after the target's (surface check).")
    validation_calibration_concurrency: int = Field(
        32, ge=1, le=4096, description="Calibration episodes in flight at once (a model backend batches them).")
    validation_episode_deadline_s: float = Field(
        3600.0, gt=0, le=3600, description="Wall-clock limit of one calibration episode, waiting for the shared model "
        "included; an episode past it fails the job, never scores 0. A last-resort guard only: an HTTP model call has "
        "its own timeout and retries, and max_turns bounds the turns, while SmolLM2 on a 2-core CPU with 64 episodes "
        "in flight took over 600 s per episode.")
    calibration_temperature: float = Field(
        1.0, ge=0, le=5, description="Sampling temperature of the base policy during calibration (GRPO samples at "
        "> 0; at 0 every group is constant and none is informative).")
    calibration_max_tokens: int = Field(256, ge=1, le=32768, description="Most tokens of one calibration reply.")
    calibration_keep_idle_policies: int = Field(
        1, ge=0, le=16, description="Loaded calibration models kept while no job uses them (0: unload after each job).")
    calibration_skill_p: float = Field(
        0.3, ge=0, le=1, description="Skill probability of the scripted calibration stand-in used when a job names "
        "no calibration policy (policies.ScriptedSkillFactory).")

    # -- generation -----------------------------------------------------------------------------
    default_max_retries: int = Field(3, ge=0, le=20, description="Feedback rounds when a job gives max_retries 0.")
    llm_timeout_s: float = Field(600.0, gt=0, le=3600, description="Deadline of one generation request.")
    llm_max_tokens: int = Field(16_000, ge=256, le=1 << 20, description="max_tokens of one generation request.")
    llm_temperature: float = Field(0.2, ge=0, le=2, description="Sampling temperature of the generation agent.")
    prompt_path: str = Field("", description="Generation prompt file (default: prompts/environment/generate.md).")

    @field_validator("data_roots", mode="before")
    @classmethod
    def _data_roots(cls, v: object) -> list[Path]:
        return parse_roots(v)

    @model_validator(mode="before")
    @classmethod
    def _flat_sandbox(cls, data: Any) -> Any:
        """`sandbox_<field>=...` keywords (the variables' spelling) go into `sandbox`. The fields of
        NOT_SETTINGS are refused from the environment and from plain dicts (a SandboxConfig object,
        as benchmarks and tests build it, may carry them)."""
        if not isinstance(data, dict):
            return data
        flat = {k.removeprefix("sandbox_"): v for k, v in data.items() if k.startswith("sandbox_")}
        nested = data.get("sandbox")
        if isinstance(nested, SandboxConfig):
            if not flat:
                return data
            base = {**nested.model_dump(), "kubernetes_api": nested.kubernetes_api}
        else:
            base = dict(nested or {})
            refused = sorted((base.keys() | flat.keys()) & NOT_SETTINGS)
            if refused:
                raise ValueError(f"TRACE_ENVIRONMENT_SANDBOX_{refused[0].upper()} is not a service setting "
                                 f"(SandboxConfig.{refused[0]} is for benchmarks and tests); remove it")
        rest = {k: v for k, v in data.items() if not k.startswith("sandbox_")}
        return {**rest, "sandbox": {**base, **flat}}

    @model_validator(mode="after")
    def _backend(self) -> EnvironmentSettings:
        sandbox = self.sandbox
        if sandbox.backend == "kubernetes" and not (sandbox.pod.template or sandbox.pod.image):
            raise ValueError("TRACE_ENVIRONMENT_SANDBOX_BACKEND=kubernetes needs the sandbox image: set "
                             "TRACE_ENVIRONMENT_SANDBOX_POD_TEMPLATE (the chart's sandbox-pod.json) or "
                             "TRACE_ENVIRONMENT_SANDBOX_POD_IMAGE (e.g. registry/trace/sandbox:0.1.0)")
        return self

    def sandbox_config(self) -> SandboxConfig:
        """The sandbox setting (kept for callers; the same object as `self.sandbox`)."""
        return self.sandbox

    def validation_config(self, band: tuple[float, float] = (0.2, 0.6), seed: int = 0,
                          min_informative: float | None = None) -> ValidationConfig:
        return ValidationConfig(
            seeds=self.validation_seeds, trivial_episodes=self.validation_trivial_episodes,
            noop_max_mean=self.validation_noop_max_mean, random_max_mean=self.validation_random_max_mean,
            trivial_max_success=self.validation_trivial_max_success, band=band, groups=self.validation_groups,
            group_size=self.validation_group_size,
            min_informative=self.validation_min_informative if min_informative is None else min_informative,
            max_addendum_chars=self.validation_max_addendum_chars, seed=seed,
            calibration_concurrency=self.validation_calibration_concurrency,
            episode_deadline_s=self.validation_episode_deadline_s)

    def calibration_sampling(self) -> CalibrationSampling:
        return CalibrationSampling(temperature=self.calibration_temperature, max_tokens=self.calibration_max_tokens,
                                   keep_idle=self.calibration_keep_idle_policies)
