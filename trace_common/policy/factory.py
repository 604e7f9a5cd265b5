"""PolicyRef -> a ready `Policy`, the same way in every service (rollout, environment
calibration, trainer): built-in base agents are resolved (warm-started once, cached), model
and adapter artifact URIs are materialised as local directories (`trace_common.model_refs`, confined
to the service's `ModelRoots`: its store and the operator's model roots),
HTTP endpoints get the OpenAI-compatible client.

    policy = await open_policy(ref, allowed=ModelRoots.of(settings))   # ref: trace_common.specs.PolicyRefModel
    ...
    await policy.close()
"""

from __future__ import annotations

import asyncio

from trace_common.errors import InvalidArgument, PermissionDenied
from trace_common.model_refs import ModelRoots, materialize
from trace_common.policy.base import Policy
from trace_common.specs import PolicyRefModel


def _open_sync(ref: PolicyRefModel, s3=None, *, allowed: ModelRoots) -> Policy:
    if ref.backend == "POLICY_BACKEND_OPENAI_HTTP":
        from trace_common.policy.http_backend import OpenAIPolicy

        if not ref.endpoint:
            raise InvalidArgument(field="policy.endpoint", expected="the OpenAI-compatible base URL for the HTTP "
                                  "backend", fix="e.g. http://vllm:8000/v1")
        if not ref.endpoint_checked:  # fail closed: only the operator's endpoint profiles choose URLs and keys
            raise PermissionDenied("the endpoint was not checked against the service's endpoint profiles",
                                   field="policy.endpoint", fix="Resolve the ref with trace_common.endpoints."
                                   "Endpoints.policy before opening it")
        return OpenAIPolicy(ref.endpoint, ref.model, adapter=ref.adapter_name or None,
                            api_key_env=ref.credential_env)
    if ref.backend != "POLICY_BACKEND_IN_PROCESS":
        raise InvalidArgument(field="policy.backend", expected="POLICY_BACKEND_IN_PROCESS or _OPENAI_HTTP here",
                              got=ref.backend)
    from trace_common.policy.transformers_backend import TransformersPolicy

    model_dir = materialize(ref.model, allowed=allowed, s3=s3, field="policy.model")
    if ref.composition_uri:
        from trace_common.moe.routed_policy import composition_policy

        return composition_policy(ref.composition_uri, model_dir, routing=ref.routing or "token", s3=s3,
                                  allowed=allowed)
    adapter_dir = materialize(ref.adapter_uri, allowed=allowed, s3=s3, field="policy.adapter_uri") \
        if ref.adapter_uri else None
    return TransformersPolicy.from_dir(model_dir, adapter_dir=adapter_dir)


async def open_policy(ref: PolicyRefModel, s3=None, *, allowed: ModelRoots) -> Policy:
    """Build the policy off the event loop (model loading and warm starts take seconds to minutes).
    `allowed`: the service's `ModelRoots` (model, adapter and composition references it may read)."""
    return await asyncio.to_thread(_open_sync, ref, s3, allowed=allowed)
