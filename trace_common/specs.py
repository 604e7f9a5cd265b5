"""Pydantic models of the pieces of job specs shared across services (validated once, here).

Servicers convert a proto spec with `protoconv.to_dict` and validate it with these models;
pydantic errors become INVALID_ARGUMENT naming the field (see the error interceptor).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from trace_common.limits import Identifier, Params, UriRef

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
#: A served composition's name (the inference service's rule; `tracectl serve` derives names by it).
COMPOSITION_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def check_printable(value: str, field: str) -> str:
    """`value` unless it holds a control character (NUL, a newline, DEL, C1 ...): ValueError naming `field`.

    A reference is a path or a URI, printable by nature; a NUL would otherwise reach `os.path.realpath`
    or `open` deep inside a load ("embedded null byte", an INTERNAL error), and a newline would split
    the log line that records the reference."""
    for i, ch in enumerate(value):
        if unicodedata.category(ch) == "Cc":
            raise ValueError(f"{field} holds the control character {ch!r} at position {i}; a path or URI is "
                             "printable text: remove it")
    return value


def check_uri(value: str, field: str, *, required: bool = True) -> str:
    """Artifact or data URIs: s3://bucket/key, file:///abs/path, or an absolute local path (printable)."""
    if not value:
        if required:
            raise ValueError(f"{field} is required: give an s3://bucket/key or file:///absolute/path URI")
        return value
    check_printable(value, field)
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

    name: Identifier = Field(description="Registry name, e.g. 'store', 'tau2-retail'.")
    version: Identifier = Field("", description="Registry version; empty means the latest.")
    uri: UriRef = Field("", description="Data or code location for envs that need one.")
    params: Params = Field(default_factory=dict, description="Environment parameters (trace_common.limits).")

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
    """The policy a job plays. For OPENAI_HTTP the endpoint is the operator's: `endpoint_profile` names
    one of the service's endpoint profiles, or `endpoint` equals a profile's base_url; anything else
    is refused (trace_common/endpoints.py). Only a ref that check returned opens an HTTP policy."""

    backend: Literal["POLICY_BACKEND_IN_PROCESS", "POLICY_BACKEND_OPENAI_HTTP", "POLICY_BACKEND_SCRIPTED"] = Field(
        description="Where completions come from.")
    model: UriRef = Field(min_length=1, description="Base model dir/URI/built-in name or served model name.")
    adapter_uri: UriRef = ""
    adapter_name: Identifier = ""
    endpoint: UriRef = Field("", description="OPENAI_HTTP: accepted only when equal to the base_url of one of the "
                          "service's endpoint profiles (that profile applies).")
    composition_uri: UriRef = ""
    routing: Literal["", "token", "per_request", "merged", "soft_trajectory"] = Field(
        "", description="How a composition is applied (trace_common.moe.composition_io.Routing); empty means "
                        "token-level routing.")
    endpoint_profile: Identifier = Field("", description="OPENAI_HTTP: the service's endpoint profile to call.")
    #: Set only by `checked_endpoint` (trace_common.endpoints.Endpoints.policy), never from a request.
    _credential_env: str = PrivateAttr("")
    _endpoint_checked: bool = PrivateAttr(False)

    @field_validator("adapter_uri", "composition_uri")
    @classmethod
    def _uris(cls, v: str, info) -> str:
        return check_uri(v, f"policy.{info.field_name}", required=False)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        # a built-in name, a path or a served name: no URI form to check, but never a control character
        return check_printable(v, "policy.model")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"policy.endpoint {v!r} must be an http(s) base URL such as http://vllm:8000/v1")
        return v

    def checked_endpoint(self, *, base_url: str, profile: str, credential_env: str) -> PolicyRefModel:
        """A copy calling `base_url` of `profile` with the key in `credential_env` (the operator's variable)."""
        ref = self.model_copy(update={"endpoint": base_url, "endpoint_profile": profile})
        ref._credential_env, ref._endpoint_checked = credential_env, True
        return ref

    @property
    def credential_env(self) -> str:
        """The operator's variable holding the endpoint's key ("" = none); empty until checked."""
        return self._credential_env

    @property
    def endpoint_checked(self) -> bool:
        """Whether the endpoint was decided by the service's endpoint profiles."""
        return self._endpoint_checked


#: A composition's routing mode (`trace_common.moe.composition_io.Routing`) -> the value name of the
#: proto enum `trace.v1.CompositionRouting` that carries it in `CompositionSpec.routing`.
COMPOSITION_ROUTING: dict[str, str] = {
    "token": "COMPOSITION_ROUTING_TOKEN",
    "per_request": "COMPOSITION_ROUTING_PER_REQUEST",
    "merged": "COMPOSITION_ROUTING_MERGED",
    "soft_trajectory": "COMPOSITION_ROUTING_SOFT_TRAJECTORY",
}
#: The enum's zero value: a spec that does not choose gets token-level routing.
COMPOSITION_ROUTING_DEFAULT = "COMPOSITION_ROUTING_UNSPECIFIED"


def composition_routing_mode(value: str | int) -> str:
    """The routing mode named by a `CompositionRouting` value name (UNSPECIFIED -> "token").

    `value` is what `protoconv.to_dict` gives: the value name, or the bare number of a value this
    build does not know (a newer client). ValueError, listing the known names, for anything else."""
    if value == COMPOSITION_ROUTING_DEFAULT:
        return "token"
    for mode, name in COMPOSITION_ROUTING.items():
        if value == name:
            return mode
    known = ", ".join([COMPOSITION_ROUTING_DEFAULT, *COMPOSITION_ROUTING.values()])
    raise ValueError(f"routing {value!r} is not a CompositionRouting this service serves; use one of {known}")


class SamplingModel(Strict):
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(0.0, ge=0.0, le=1.0, description="0 means 1.0 (no nucleus truncation).")
    top_k: int = Field(0, ge=0)
    max_tokens: int = Field(0, ge=0, le=1 << 20)
    seed: int = 0


class LlmEndpointModel(Strict):
    """An agent's LLM endpoint as a request names it. The service decides where it goes and with
    which key (trace_common/endpoints.py): `profile` names one of its endpoint profiles, or
    `base_url` equals a profile's base_url; `api_key_env` is refused (kept so the refusal can name it)."""

    profile: Identifier = Field("", description="The service's endpoint profile to call.")
    base_url: UriRef = Field("", description="Accepted only when equal to a profile's base_url (that profile applies).")
    model: UriRef = Field(min_length=1, description="Served model name (vLLM serves a model under its path).")
    api_key_env: Identifier = Field("", description="Refused when set: a request never names a credential.")
    timeout_seconds: float = Field(0.0, ge=0.0, le=3600.0)
    max_concurrency: int = Field(0, ge=0, le=1024)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"base_url {v!r} must be an http(s) URL such as http://127.0.0.1:8000/v1")
        return v
