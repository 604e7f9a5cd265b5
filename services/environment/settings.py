"""Settings of the environment service (`TRACE_ENVIRONMENT_*`).

Three groups: episode serving, the sandbox worker's limits and isolation layers
(`TRACE_ENVIRONMENT_SANDBOX_*`, see services/environment/sandbox/isolation.py), and validation
thresholds (`TRACE_ENVIRONMENT_VALIDATION_*`, see services/environment/validation.py).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from trace_common.config import ServiceSettings

from .calibration_policy import CalibrationSampling
from .sandbox.parent import SandboxConfig
from .validation import ValidationConfig


class EnvironmentSettings(ServiceSettings):
    service_name: ClassVar[str] = "environment"
    model_config = SettingsConfigDict(env_prefix="TRACE_ENVIRONMENT_", extra="ignore", validate_default=True)

    # -- episodes -------------------------------------------------------------------------------
    max_open_episodes: int = Field(256, ge=1, le=100_000, description="Episodes open at once (sandboxes).")
    episode_idle_timeout_s: float = Field(300.0, gt=0, le=86_400,
                                          description="An episode untouched this long is closed.")
    idle_workers_per_env: int = Field(2, ge=0, le=256,
                                      description="Loaded sandbox workers kept per environment version for reuse.")

    # -- sandbox --------------------------------------------------------------------------------
    sandbox_cpu_seconds: int = Field(300, ge=1, le=86_400, description="Total CPU seconds of one worker.")
    sandbox_memory_mb: int = Field(1024, ge=128, le=1 << 20, description="Address-space limit of one worker (MiB).")
    sandbox_file_size_mb: int = Field(16, ge=1, le=1 << 20, description="Largest file a worker may write (MiB).")
    sandbox_open_files: int = Field(64, ge=16, le=65_536, description="Open-file limit of one worker.")
    sandbox_call_timeout_s: float = Field(10.0, gt=0, le=3600, description="Wall-clock deadline of one worker call.")
    sandbox_startup_timeout_s: float = Field(30.0, gt=0, le=600, description="Deadline of a worker's startup.")
    sandbox_max_output_kb: int = Field(1024, ge=4, le=1 << 20, description="Largest worker response (KiB).")
    sandbox_network_namespace: bool = Field(True, description="Give each worker an empty network namespace.")
    sandbox_mount_namespace: bool = Field(True, description="Read-only filesystem except the worker's scratch.")
    sandbox_drop_privileges: bool = Field(True, description="Run workers as uid nobody when the service is root.")
    sandbox_seccomp: bool = Field(True, description="Install the seccomp filter in workers.")
    sandbox_audit_hook: bool = Field(True, description="Install the reporting audit hook in workers.")
    sandbox_require_network_isolation: bool = Field(
        True, description="Refuse to run workers when neither a network namespace nor seccomp is available.")
    sandbox_scratch_root: str = Field("", description="Directory for worker scratch dirs (default: system tmp).")

    # -- validation -----------------------------------------------------------------------------
    validation_seeds: int = Field(8, ge=2, le=500, description="Seeds for the determinism and oracle checks.")
    validation_trivial_episodes: int = Field(16, ge=1, le=1000, description="Episodes for the no-op / random checks.")
    validation_noop_max_mean: float = Field(0.1, ge=0, le=1, description="Highest mean reward of the no-op policy.")
    validation_random_max_mean: float = Field(0.25, ge=0, le=1, description="Highest mean reward of the random policy.")
    validation_trivial_max_success: float = Field(0.1, ge=0, le=1, description="Highest trivial-policy success rate.")
    validation_groups: int = Field(16, ge=1, le=1000, description="Calibration groups (seeds).")
    validation_group_size: int = Field(8, ge=2, le=256, description="Calibration samples per group.")
    validation_min_informative: float = Field(0.5, ge=0, le=1, description="Lowest informative-group fraction.")
    validation_min_tools: int = Field(3, ge=1, le=64, description="Fewest target tools a candidate may reuse.")
    validation_max_tools: int = Field(5, ge=1, le=64, description="Most target tools a candidate may reuse.")
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

    @model_validator(mode="after")
    def _tools(self) -> EnvironmentSettings:
        if self.validation_min_tools > self.validation_max_tools:
            raise ValueError("TRACE_ENVIRONMENT_VALIDATION_MIN_TOOLS must not exceed ..._MAX_TOOLS")
        return self

    def sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(
            cpu_seconds=self.sandbox_cpu_seconds, memory_mb=self.sandbox_memory_mb,
            file_size_mb=self.sandbox_file_size_mb, open_files=self.sandbox_open_files,
            call_timeout_s=self.sandbox_call_timeout_s, startup_timeout_s=self.sandbox_startup_timeout_s,
            max_output_kb=self.sandbox_max_output_kb, network_namespace=self.sandbox_network_namespace,
            mount_namespace=self.sandbox_mount_namespace, drop_privileges=self.sandbox_drop_privileges,
            seccomp=self.sandbox_seccomp, audit_hook=self.sandbox_audit_hook,
            require_network_isolation=self.sandbox_require_network_isolation,
            scratch_root=self.sandbox_scratch_root)

    def validation_config(self, band: tuple[float, float] = (0.2, 0.6), seed: int = 0,
                          min_informative: float | None = None) -> ValidationConfig:
        return ValidationConfig(
            seeds=self.validation_seeds, trivial_episodes=self.validation_trivial_episodes,
            noop_max_mean=self.validation_noop_max_mean, random_max_mean=self.validation_random_max_mean,
            trivial_max_success=self.validation_trivial_max_success, band=band, groups=self.validation_groups,
            group_size=self.validation_group_size,
            min_informative=self.validation_min_informative if min_informative is None else min_informative,
            min_tools=self.validation_min_tools, max_tools=self.validation_max_tools, seed=seed,
            calibration_concurrency=self.validation_calibration_concurrency,
            episode_deadline_s=self.validation_episode_deadline_s)

    def calibration_sampling(self) -> CalibrationSampling:
        return CalibrationSampling(temperature=self.calibration_temperature, max_tokens=self.calibration_max_tokens,
                                   keep_idle=self.calibration_keep_idle_policies)
