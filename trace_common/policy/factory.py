"""PolicyRef -> a ready `Policy`, the same way in every service (rollout, environment
calibration, trainer): built-in base agents are resolved (warm-started once, cached), model
and adapter artifact URIs are materialised as local directories, HTTP endpoints get the
OpenAI-compatible client.

    policy = await open_policy(ref)          # ref: trace_common.specs.PolicyRefModel
    ...
    await policy.close()
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from trace_common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from trace_common.policy.base import Policy
from trace_common.specs import PolicyRefModel

#: Files that identify a model / adapter directory when a URI names one of them.
ARTIFACT_DIR_FILES = frozenset({"adapter_model.safetensors", "adapter_config.json", "model.safetensors",
                                "config.json"})


def materialize_dir(uri: str, cache_root: Path | None = None, s3=None) -> Path:
    """A local directory holding the artifact directory at `uri` (file:// as is; s3:// downloaded
    once into a cache keyed by the URI, every object sha256-verified by the store). The URI of a
    file inside such a directory (what training jobs output: `.../adapter_model.safetensors`)
    names its directory."""
    if uri.rsplit("/", 1)[-1] in ARTIFACT_DIR_FILES:
        uri = uri.rsplit("/", 1)[0]
    if uri.startswith("file://"):
        path = Path(uri.removeprefix("file://"))
    elif uri.startswith("/"):
        path = Path(uri)
    elif uri.startswith("s3://"):
        from trace_common.artifacts import open_uri

        cache_root = cache_root or Path.home() / ".cache" / "trace" / "artifacts"
        path = cache_root / hashlib.sha256(uri.encode()).hexdigest()[:24]
        if not path.is_dir():
            store, prefix = open_uri(uri.rstrip("/"), s3)
            tmp = path.with_suffix(".partial")
            tmp.mkdir(parents=True, exist_ok=True)
            for info in store.list(prefix + "/"):
                dest = tmp / info.key[len(prefix) + 1:]
                dest.parent.mkdir(parents=True, exist_ok=True)
                store.get_file(info.key, dest)
            tmp.rename(path)
    else:
        raise InvalidArgument(field="uri", expected="file:///dir, /abs/dir or s3://bucket/prefix", got=uri)
    if not path.is_dir():
        raise FailedPrecondition(f"{uri} is not a directory that exists; was the artifact written?")
    return path


def _open_sync(ref: PolicyRefModel, s3=None) -> Policy:
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
    from trace_common.agents import resolve_base_agent
    from trace_common.policy.transformers_backend import TransformersPolicy

    model = ref.model
    model_dir = materialize_dir(model, s3=s3) if model.startswith(("file://", "s3://")) else resolve_base_agent(model)
    if ref.composition_uri:
        from trace_common.moe.routed_policy import composition_policy

        return composition_policy(ref.composition_uri, model_dir, routing=ref.routing or "token", s3=s3)
    adapter_dir = materialize_dir(ref.adapter_uri, s3=s3) if ref.adapter_uri else None
    return TransformersPolicy.from_dir(model_dir, adapter_dir=adapter_dir)


async def open_policy(ref: PolicyRefModel, s3=None) -> Policy:
    """Build the policy off the event loop (model loading and warm starts take seconds to minutes)."""
    return await asyncio.to_thread(_open_sync, ref, s3)
