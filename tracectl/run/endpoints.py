"""The endpoint profiles tracectl allows its embedded services for one run (tracectl is their operator).

A deployed service calls only the endpoints its operator configured (TRACE_<SERVICE>_ENDPOINTS,
rendered by the chart). Embedded services are started by tracectl itself, so there tracectl is
the operator, and it allows exactly the endpoints the run config names:

    target.user_simulator          -> profile "user-simulator"  for rollout
    base_agent.endpoint (http)     -> profile "base-agent"      for rollout and environment (calibration)
    analysis.llm                   -> profile "analyst"         for analysis
    environments.llm               -> profile "generator"       for environment

each with the section's `api_key_env` as the profile's key variable (the embedded services share
tracectl's environment). The pipeline's requests carry only the base URL, which the service maps
back to the profile. `evaluation.gepa` needs no profile: the reflection model is called by
tracectl itself, not by a service. Two sections naming one URL for one service share a profile;
with different keys the config is refused (one endpoint, one key).
"""

from __future__ import annotations

from typing import Any

from trace_common.endpoints import normalize_url
from trace_common.errors import InvalidArgument
from tracectl.run.config import RunConfig


def run_endpoints(cfg: RunConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """service -> {profile name -> {"base_url", "api_key_env"}} for the run's embedded services
    (the shape `tracectl.embedded.EMBEDDED_ENDPOINTS` takes)."""
    wanted: list[tuple[str, str, str, str, tuple[str, ...]]] = []  # (name, field, url, key env, services)
    if cfg.target.user_simulator is not None:
        u = cfg.target.user_simulator
        wanted.append(("user-simulator", "target.user_simulator", u.base_url, u.api_key_env, ("rollout",)))
    if cfg.base_agent.backend == "http" and cfg.base_agent.endpoint:
        wanted.append(("base-agent", "base_agent.endpoint", cfg.base_agent.endpoint, "", ("rollout", "environment")))
    if cfg.analysis.llm is not None:
        a = cfg.analysis.llm
        wanted.append(("analyst", "analysis.llm", a.base_url, a.api_key_env, ("analysis",)))
    if cfg.environments.llm is not None:
        e = cfg.environments.llm
        wanted.append(("generator", "environments.llm", e.base_url, e.api_key_env, ("environment",)))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    first: dict[tuple[str, str], tuple[str, str]] = {}  # (service, url) -> (field, key env)
    for name, field, url, key_env, services in wanted:
        for service in services:
            seen = first.get((service, normalize_url(url)))
            if seen is not None:
                if seen[1] != key_env:
                    raise InvalidArgument(field=f"{field}.api_key_env", expected=f"{seen[1]!r}, the key variable "
                                          f"{seen[0]} gives the same endpoint {url}", got=key_env,
                                          fix="One endpoint has one key: use the same api_key_env in both sections")
                continue
            first[(service, normalize_url(url))] = (field, key_env)
            out.setdefault(service, {})[name] = {"base_url": url, "api_key_env": key_env}
    return out
