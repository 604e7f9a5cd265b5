"""Validated analysis job spec (pydantic), built from the proto by the servicer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trace_common.limits import UriRef
from trace_common.specs import LlmEndpointModel, Strict, check_uri


class AnalysisSpecModel(Strict):
    rollout_uris: list[UriRef] = Field(min_length=1, max_length=1000,
                                    description="Trajectory artifacts (JSONL) from rollout jobs.")
    mode: Literal["ANALYST_MODE_LLM", "ANALYST_MODE_DIAGNOSTICS"] = Field(
        description="ANALYST_MODE_LLM (prompted LLM) or ANALYST_MODE_DIAGNOSTICS (environment diagnostics).")
    llm: LlmEndpointModel | None = None
    num_runs: int = Field(0, ge=0, le=100, description="N independent labeling runs; 0 means 10.")
    min_passing_runs: int = Field(0, ge=0, le=100, description="K; 0 means 8.")
    min_coverage: float = Field(0.0, ge=0.0, le=1.0, description="rho; 0 means 0.10.")
    min_gap: float = Field(0.0, ge=0.0, le=1.0, description="delta; 0 means 0.20.")
    max_candidates: int = Field(0, ge=0, le=50, description="Candidates proposed by discovery; 0 means 10.")
    seed: int = Field(0, description="Seeds discovery sampling, run order and bootstrap resamples.")
    trajectory_char_budget: int = Field(0, ge=0, le=1_000_000,
                                        description="Characters of one compacted trajectory; 0 means the "
                                        "service setting (6000); otherwise at least 600.")

    @field_validator("trajectory_char_budget")
    @classmethod
    def _budget(cls, v: int) -> int:
        if 0 < v < 600:
            raise ValueError(f"trajectory_char_budget={v} is too small for a trajectory's ids and one turn; "
                             "use 0 (the default) or at least 600")
        return v

    @field_validator("rollout_uris")
    @classmethod
    def _uris(cls, v: list[str]) -> list[str]:
        # a URI with '..' segments is left to the service, which refuses it as a path outside this run
        # (PERMISSION_DENIED, artifacts_io.confine_rollouts) like every other such path
        out = [u if ".." in u.split("/") else check_uri(u, f"rollout_uris[{i}]") for i, u in enumerate(v)]
        first: dict[str, int] = {}
        for i, u in enumerate(out):  # a repeated artifact would count its trajectories twice in every rate
            if first.setdefault(u, i) != i:
                raise ValueError(f"rollout_uris[{i}] repeats rollout_uris[{first[u]}] ({u}); list each artifact once")
        return out

    @model_validator(mode="after")
    def _llm(self) -> AnalysisSpecModel:
        if self.mode == "ANALYST_MODE_LLM" and self.llm is None:
            raise ValueError("mode ANALYST_MODE_LLM needs llm (profile, model); or use ANALYST_MODE_DIAGNOSTICS")
        runs = self.num_runs or 10
        if (self.min_passing_runs or 8) > runs:
            raise ValueError(f"min_passing_runs ({self.min_passing_runs or 8}) exceeds num_runs ({runs}); "
                             "lower min_passing_runs or raise num_runs")
        return self
