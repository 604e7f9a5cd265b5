"""The outbound endpoints a service may call, as its operator allows them (`TRACE_<SERVICE>_ENDPOINTS`).

Trust boundary (docs/design.md, "Trust boundaries"): a request never chooses an outbound URL or a
credential. A service that calls OpenAI-compatible endpoints (analysis, environment, rollout; the
trainer for vLLM rollouts) is given a map of *profiles* by its operator, as one JSON setting (the
chart renders it from values and Secret references; `tracectl run` builds it from the run config
for its embedded services):

    TRACE_ANALYSIS_ENDPOINTS='{"analyst": {"base_url": "https://llm.example.com/v1",
                                           "api_key_env": "ANALYST_API_KEY",
                                           "models": ["gpt-4.1*"]}}'

`api_key_env` names a variable of the *service's* environment (chosen by the operator, e.g.
filled from a Kubernetes Secret); its value goes out as `Authorization: Bearer <value>` to that
profile's `base_url` and nowhere else. `models` (optional, fnmatch patterns) bounds the model
names a request may send there.

What a request may say, and what happens (`Endpoints.llm` / `Endpoints.policy` / `Endpoints.server`):

    LlmEndpoint.profile, PolicyRef.endpoint_profile,  a profile name -> that profile
      the trainer's config.vllm.profile
    LlmEndpoint.base_url, PolicyRef.endpoint,         accepted only when equal (trailing '/' ignored)
      the trainer's config.vllm.base_url              to a profile's base_url -> that profile
    LlmEndpoint.api_key_env                           always refused
    environment params named *_url, *_api_key, ...    always refused (`refuse_outbound_params`)

Every refusal is `PermissionDenied` (gRPC PERMISSION_DENIED) naming the field and the configured
profiles, raised while the request is checked -- before a job exists and before any connection
is opened, so nothing leaves the machine. A profile name that is malformed, or a request naming
no endpoint at all, is `InvalidArgument`.

A resolved `PolicyRef` carries its profile's credential variable in a private attribute
(`credential_env`), and `trace_common.policy.factory` opens an HTTP policy only from a ref this
module checked (`endpoint_checked`): a service that forgot the check fails closed.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from trace_common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from trace_common.specs import LlmEndpointModel, PolicyRefModel

#: A profile name: what a request may name (`LlmEndpoint.profile`, `PolicyRef.endpoint_profile`).
PROFILE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
#: A variable name a profile may read its key from (POSIX shell names).
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: The service's own secrets: never an endpoint's key, whatever the operator writes.
SERVICE_SECRET_RE = re.compile(r"^TRACE_[A-Z0-9]+_(AUTH_TOKEN|S3_SECRET_KEY|S3_ACCESS_KEY)$|^TRACE_AUTH_TOKEN$")
#: Environment parameters that would choose an outbound URL or a credential (tau2's `user_base_url`,
#: `user_api_key`); a request never sets them -- the user simulator comes from a profile.
OUTBOUND_PARAM_RE = re.compile(r"(^|_)(url|base_url|endpoint|api_key|api_key_env|key_env|token|secret|password)$")

ENDPOINTS_DESCRIPTION = (
    "Outbound OpenAI-compatible endpoints this service may call, as a JSON map profile name -> "
    '{"base_url": "http(s)://.../v1", "api_key_env": "VAR" (a variable of this service\'s environment holding '
    'the key; empty = no key), "models": ["pattern", ...] (optional fnmatch patterns of allowed model names)}. '
    "A request names a profile (or its exact base_url), never a URL or credential of its own; the chart "
    "renders this from values and Secret references (trace_common/endpoints.py).")


def read_api_key(api_key_env: str, where: str = "api_key_env") -> str:
    """The one API-key rule: the value of `api_key_env` in this process's environment, or "EMPTY"
    (what vLLM and local servers accept) when no variable is named. An unset or blank variable is
    FailedPrecondition naming `where` -- never a silent key-less request."""
    if not api_key_env:
        return "EMPTY"
    key = os.environ.get(api_key_env, "")
    if not key.strip():
        raise FailedPrecondition(f"{where}={api_key_env!r} names an unset environment variable; export it (in "
                                 "Kubernetes: from a Secret) or leave api_key_env empty")
    return key


def normalize_url(url: str) -> str:
    """The form base URLs are compared in: trailing slashes removed, nothing else changed."""
    return url.rstrip("/")


class EndpointProfile(BaseModel):
    """One outbound endpoint an operator allows: where, with which key, for which models."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://vllm:8000/v1 (compared without "
                          "trailing '/').")
    api_key_env: str = Field("", description="Variable of the service's environment holding this endpoint's key "
                             "(sent as 'Authorization: Bearer ...' to base_url only); empty = no key.")
    models: tuple[str, ...] = Field((), description="fnmatch patterns of the model names requests may send here "
                                    "(the served name: an adapter's when one is named); empty = any.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"base_url {v!r} must be an http(s) URL such as http://vllm:8000/v1")
        return normalize_url(v)

    @field_validator("api_key_env")
    @classmethod
    def _key_env(cls, v: str) -> str:
        if v and not ENV_NAME_RE.match(v):
            raise ValueError(f"api_key_env {v!r} must be an environment variable name (letters, digits, '_')")
        if SERVICE_SECRET_RE.match(v):
            raise ValueError(f"api_key_env {v!r} is one of the service's own secrets (its auth token or S3 key), "
                             "never an endpoint's key; put the endpoint's key in a variable of its own")
        return v

    def allows_model(self, model: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(model, p) for p in self.models)


def _check_profiles(profiles: dict[str, EndpointProfile]) -> dict[str, EndpointProfile]:
    seen: dict[str, str] = {}
    for name, p in profiles.items():
        if not PROFILE_RE.match(name):
            raise ValueError(f"endpoint profile name {name!r}: use 1-63 lower-case letters, digits, '_', '-', '.'")
        if p.base_url in seen:
            raise ValueError(f"endpoint profiles {seen[p.base_url]!r} and {name!r} share base_url {p.base_url}; "
                             "a request's base_url must name one profile: merge them")
        seen[p.base_url] = name
    return profiles


#: The settings field type: `endpoints: EndpointMap = Field(default_factory=dict, description=...)`.
EndpointMap = Annotated[dict[str, EndpointProfile], AfterValidator(_check_profiles)]


@dataclass(frozen=True)
class ResolvedEndpoint:
    """A request's endpoint after the operator's profiles decided: where to send, with which key."""

    profile: str
    base_url: str
    model: str
    #: The operator's variable (never a request's); read with `read_api_key` when the client is made.
    api_key_env: str


class Endpoints:
    """One service's allow-list of outbound endpoints (its `endpoints` setting).

    `setting` is the variable that configures it (e.g. TRACE_ANALYSIS_ENDPOINTS), named in every
    refusal so an operator knows where to add a profile. `add` / `remove` exist for the embedded
    stack, whose operator (tracectl) adds the run config's endpoints in-process; no request
    reaches them."""

    def __init__(self, profiles: Mapping[str, EndpointProfile] | None = None, setting: str = "endpoints"):
        self.setting = setting
        self._profiles: dict[str, EndpointProfile] = {}
        for name, p in (profiles or {}).items():
            self.add(name, p)

    # -- the operator's side -----------------------------------------------------------------------
    def add(self, name: str, profile: EndpointProfile | Mapping) -> None:
        p = profile if isinstance(profile, EndpointProfile) else EndpointProfile.model_validate(profile)
        if self._profiles.get(name) == p:
            return
        _check_profiles({**{k: v for k, v in self._profiles.items() if k != name}, name: p})
        if name in self._profiles:
            raise ValueError(f"endpoint profile {name!r} is already configured for {self._profiles[name].base_url}; "
                             "give the new one another name")
        self._profiles[name] = p

    def remove(self, name: str) -> None:
        self._profiles.pop(name, None)

    @property
    def profiles(self) -> dict[str, EndpointProfile]:
        return dict(self._profiles)

    def describe(self) -> str:
        if not self._profiles:
            return f"none are configured ({self.setting} is empty)"
        return "configured: " + ", ".join(f"{n} ({p.base_url})" for n, p in sorted(self._profiles.items()))

    def _fix(self, name_field: str) -> str:
        return (f"Name one of the operator's profiles in {name_field} ({self.describe()}); the operator adds "
                f"endpoints in {self.setting}")

    # -- the request's side ------------------------------------------------------------------------
    def _choose(self, profile: str, url: str, *, profile_field: str, url_field: str) -> tuple[str, EndpointProfile]:
        if profile:
            if not PROFILE_RE.match(profile):
                raise InvalidArgument(field=profile_field, expected="an endpoint profile name (lower-case letters, "
                                      "digits, '_', '-', '.')", got=profile, fix=self._fix(profile_field))
            chosen = self._profiles.get(profile)
            if chosen is None:
                raise PermissionDenied(f"{profile!r} is not an endpoint profile of this service",
                                       field=profile_field, fix=self._fix(profile_field))
            if url and normalize_url(url) != chosen.base_url:
                raise PermissionDenied(f"{url!r} is not the base_url of profile {profile!r} ({chosen.base_url})",
                                       field=url_field, fix=f"Leave {url_field} empty: the profile decides the URL")
            return profile, chosen
        if not url:
            raise InvalidArgument(field=profile_field, expected="the endpoint profile to call",
                                  fix=self._fix(profile_field))
        wanted = normalize_url(url)
        for name, p in self._profiles.items():
            if p.base_url == wanted:
                return name, p
        raise PermissionDenied(f"{url!r} is not an endpoint the operator allows", field=url_field,
                               fix=self._fix(profile_field))

    def llm(self, endpoint: LlmEndpointModel, field: str) -> ResolvedEndpoint:
        """The profile behind a request's `LlmEndpoint` at `field` (e.g. "spec.llm")."""
        if endpoint.api_key_env:
            raise PermissionDenied("a request cannot name a credential", field=f"{field}.api_key_env",
                                   fix=f"Remove it: the key is the operator's, in the profile. {self._fix(f'{field}.profile')}")
        name, p = self._choose(endpoint.profile, endpoint.base_url, profile_field=f"{field}.profile",
                               url_field=f"{field}.base_url")
        if not p.allows_model(endpoint.model):
            raise PermissionDenied(f"model {endpoint.model!r} is not allowed on profile {name!r} "
                                   f"(allowed: {', '.join(p.models)})", field=f"{field}.model",
                                   fix="Use an allowed model, or ask the operator to allow it")
        return ResolvedEndpoint(profile=name, base_url=p.base_url, model=endpoint.model, api_key_env=p.api_key_env)

    def server(self, profile: str, base_url: str, field: str) -> ResolvedEndpoint:
        """The profile behind a request's `{profile, base_url}` pair at `field` (e.g. "spec.config.vllm")
        for a server called without a request-chosen model (the trainer's vLLM)."""
        name, p = self._choose(profile, base_url, profile_field=f"{field}.profile", url_field=f"{field}.base_url")
        return ResolvedEndpoint(profile=name, base_url=p.base_url, model="", api_key_env=p.api_key_env)

    def policy(self, ref: PolicyRefModel, field: str) -> PolicyRefModel:
        """`ref` with its endpoint decided by a profile (OPENAI_HTTP), ready for `open_policy`; other
        backends call nothing outbound and come back unchanged."""
        if ref.backend != "POLICY_BACKEND_OPENAI_HTTP":
            return ref
        name, p = self._choose(ref.endpoint_profile, ref.endpoint, profile_field=f"{field}.endpoint_profile",
                               url_field=f"{field}.endpoint")
        served = ref.adapter_name or ref.model
        if not p.allows_model(served):
            which = "adapter_name" if ref.adapter_name else "model"
            raise PermissionDenied(f"model {served!r} is not allowed on profile {name!r} "
                                   f"(allowed: {', '.join(p.models)})", field=f"{field}.{which}",
                                   fix="Use an allowed model, or ask the operator to allow it")
        return ref.checked_endpoint(base_url=p.base_url, profile=name, credential_env=p.api_key_env)


def refuse_outbound_params(params: Mapping[str, str], field: str) -> None:
    """PermissionDenied for an environment parameter that would choose an outbound URL or a
    credential (see OUTBOUND_PARAM_RE): the user simulator of tau2 comes from a profile
    (`RolloutSpec.user_simulator.profile`) or the service's own TRACE_TAU2_USER_* settings."""
    bad = sorted(k for k in params if OUTBOUND_PARAM_RE.search(k))
    if bad:
        raise PermissionDenied(f"parameter(s) {', '.join(bad)} would choose an outbound URL or credential, which a "
                               "request cannot", field=field,
                               fix="Remove them; name the user simulator's endpoint profile in "
                               "spec.user_simulator.profile (the operator configures the profiles)")
    if "user_model" in params:
        # without a profile, the user simulator is the operator's TRACE_TAU2_USER_BASE_URL, called with its
        # key: a request naming the model there would pass over the model allow-list profiles keep
        raise PermissionDenied("parameter user_model would choose the model the operator's user-simulator "
                               "endpoint serves to this request, which a request cannot", field=field,
                               fix="Remove it; the user simulator's model is the operator's TRACE_TAU2_USER_MODEL, or, "
                               "for a rollout job, one of the allowed models of the profile named in "
                               "spec.user_simulator.profile and spec.user_simulator.model")
