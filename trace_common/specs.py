"""Pydantic models of the pieces of job specs shared across services (validated once, here).

Servicers convert a proto spec with `protoconv.to_dict` and validate it with these models;
pydantic errors become INVALID_ARGUMENT naming the field (see the error interceptor).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def check_uri(value: str, field: str, *, required: bool = True) -> str:
    """Artifact or data URIs: s3://bucket/key, file:///abs/path, or an absolute local path."""
    if not value:
        if required:
            raise ValueError(f"{field} is required: give an s3://bucket/key or file:///absolute/path URI")
        return value
    if value.startswith("s3://"):
        rest = value[5:]
        if not rest or rest.startswith("/"):
            raise ValueError(f"{field}={value!r} has no bucket; expected s3://bucket/key")
    elif value.startswith("file://"):
        if not value.startswith("file:///"):
            raise ValueError(f"{field}={value!r} must be absolute: file:///absolute/path")
    elif not value.startswith("/"):
        raise ValueError(f"{field}={value!r} is not a URI; expected s3://bucket/key or file:///absolute/path")
    if "/../" in value or value.endswith("/.."):
        raise ValueError(f"{field}={value!r} contains '..'; give a normalised path")
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvironmentRefModel(Strict):
    """Which environment to play (registry name + version, optional data URI and params)."""

    name: str = Field(description="Registry name, e.g. 'store', 'tau2-retail'.")
    version: str = Field("", description="Registry version; empty means the latest.")
    uri: str = Field("", description="Data or code location for envs that need one.")
    params: dict[str, str] = Field(default_factory=dict, description="Environment parameters.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"environment name {v!r} must be 1-64 lower-case letters, digits, '_', '-', '.'; "
                             "list environments to see the registered names")
        return v

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        return check_uri(v, "environment.uri", required=False)


class PolicyRefModel(Strict):
    backend: Literal["POLICY_BACKEND_IN_PROCESS", "POLICY_BACKEND_OPENAI_HTTP", "POLICY_BACKEND_SCRIPTED"] = Field(
        description="Where completions come from.")
    model: str = Field(min_length=1, description="Base model dir/URI/built-in name or served model name.")
    adapter_uri: str = ""
    adapter_name: str = ""
    endpoint: str = ""
    composition_uri: str = ""
    routing: Literal["", "token", "per_request", "merged"] = Field(
        "", description="How a composition is applied; empty means token-level routing.")

    @field_validator("adapter_uri", "composition_uri")
    @classmethod
    def _uris(cls, v: str, info) -> str:
        return check_uri(v, f"policy.{info.field_name}", required=False)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"policy.endpoint {v!r} must be an http(s) base URL such as http://vllm:8000/v1")
        return v


class SamplingModel(Strict):
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(0.0, ge=0.0, le=1.0, description="0 means 1.0 (no nucleus truncation).")
    top_k: int = Field(0, ge=0)
    max_tokens: int = Field(0, ge=0, le=1 << 20)
    seed: int = 0


class LlmEndpointModel(Strict):
    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://vllm:8000/v1.")
    model: str = Field(min_length=1)
    api_key_env: str = ""
    timeout_seconds: float = Field(0.0, ge=0.0, le=3600.0)
    max_concurrency: int = Field(0, ge=0, le=1024)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"base_url {v!r} must be an http(s) URL such as http://127.0.0.1:8000/v1")
        return v
