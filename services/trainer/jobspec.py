"""What a training worker process is told (`WorkerSpec`) and what it reports (events).

The service validates a `TrainingSpec`, turns it into a `WorkerSpec` (JSON) and starts a
worker: a child process (`--spec-file`) or a Kubernetes Job pod (the JSON in the
`TRACE_TRAINER_JOB_SPEC` variable). Secrets never travel in the spec: the S3 secret key
comes from the worker's environment (`TRACE_TRAINER_S3_SECRET_KEY`; in a pod from a Secret).

Events are JSON objects `{"event": kind, ...}`:
    iteration   {"iteration", "values": {name: float}}
    checkpoint  {"iteration", "uri", "sha256", "size"}
    adapter     {"version", "uri", "outputs": [{"uri", "sha256", "size", "kind"}]}
    stopped     {"iteration", "reason"}             (early stop)
    result      {"iterations", "policy_version", "stop_reason", "adapter_uri", "outputs"}
                (outputs include the experiment trackers' files: kinds tensorboard, wandb)
    error       {"code", "message"}                 (the job failed; code = gRPC status name)
A local worker writes them to stdout, one per line after the `EVENT_PREFIX` marker; every
worker also keeps the full list in the artifact store (`events_key`), which is how the
Kubernetes executor follows a pod.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trace_common.model_refs import ModelRoots
from trace_common.specs import EnvironmentRefModel

EVENT_PREFIX = "@@trace-event "
SPEC_ENV = "TRACE_TRAINER_JOB_SPEC"


class WorkerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str
    run_id: str
    kind: str = Field("TRAINING_KIND_ADAPTER", description="TRAINING_KIND_ADAPTER or TRAINING_KIND_GATES.")
    capability: str
    environment: dict[str, Any] = Field(description="EnvironmentRefModel fields (adapters: the one environment).")
    environments: list[dict[str, Any]] = Field(default_factory=list,
                                               description="Gates: every EnvironmentRefModel of the spec, in order.")
    adapter_uris: dict[str, str] = Field(default_factory=dict, description="Gates: capability -> adapter URI.")
    policy: dict[str, Any] = Field(description="PolicyRefModel fields.")
    config: dict[str, Any] = Field(default_factory=dict, description="GRPO config (validated by the service).")
    artifact_root: str
    model_roots: list[str] = Field(default_factory=list, description="The service's model roots: with "
                                   "artifact_root, where the worker may load models and adapters from "
                                   "(trace_common/model_refs.py; the service checked the job's references).")
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_region: str = "us-east-1"
    s3_secure: bool = False
    prefix: str = Field(description="Key prefix of this capability's adapters and checkpoints.")
    resume_from: str = Field("", description="Key of a checkpoint.json to resume from; empty = latest under prefix.")
    events_key: str = Field("", description="Store key where the worker keeps its event log.")
    cache_dir: str = Field("", description="Where downloaded models are cached.")
    torch_threads: int = 0
    env_modules: list[str] = Field(default_factory=list, description="Modules to import before resolving the env.")
    environment_target: str = Field("", description="EnvironmentService host:port for environments that are not "
                                                    "built in (played over gRPC, see envs.py).")
    wandb_mode: str = Field("offline", description="The operator's W&B mode (TRACE_TRAINER_WANDB_MODE) for a job "
                            "whose config.report_to names 'wandb' (grpo/trackers.py).")


def worker_model_roots(spec: WorkerSpec) -> ModelRoots:
    """The service's model-reference rule, as the worker applies it again before loading anything."""
    return ModelRoots(store=spec.artifact_root, roots=tuple(spec.model_roots), setting="TRACE_TRAINER_MODEL_ROOTS")


#: The setting listing the directories a job's environments may name data under (TrainerSettings.data_roots).
DATA_ROOTS_SETTING = "TRACE_TRAINER_DATA_ROOTS"


def confined_environment(ref: EnvironmentRefModel, data_roots: Sequence[Path], field: str) -> EnvironmentRefModel:
    """`ref` with the data directories it names checked against the operator's `data_roots` and resolved
    (trace_common/data_roots.py; PermissionDenied naming `field`.params['data'] or `field`.uri otherwise):
    `params['data']` and `uri`, each when set. A `uri` is the data of an environment that takes `data`
    and names none in params (as the rollout service reads it), so the worker -- a child process or a
    Kubernetes Job pod -- gets the resolved directory the service checked, never the request's text."""
    from trace_common.data_roots import confine, uses_own_data

    params = dict(ref.params)
    if params.get("data"):
        params["data"] = confine(params["data"], data_roots, field=f"{field}.params['data']",
                                 setting=DATA_ROOTS_SETTING)
    uri = ref.uri
    if uri:
        resolved = confine(uri, data_roots, field=f"{field}.uri", setting=DATA_ROOTS_SETTING)
        if uses_own_data(ref.name, ref.version, params):
            params["data"] = resolved
        uri = Path(resolved).as_uri()
    return ref.model_copy(update={"params": params, "uri": uri})


#: The variable a training worker reads the environment service's token from (set by the executors).
ENVIRONMENT_TOKEN_ENV = "TRACE_TRAINER_ENVIRONMENT_TOKEN"
#: The CA a worker trusts for the environment service over TLS (the setting environment_tls_ca_file).
ENVIRONMENT_TLS_CA_ENV = "TRACE_TRAINER_ENVIRONMENT_TLS_CA_FILE"


def env_factory(ref: dict[str, Any], environment_target: str, token: str | None = None,
                tls_ca_file: str | Path | None = None):
    """A zero-argument factory of the environment `ref` names (EnvironmentRefModel fields): a
    built-in / imported environment is made in this process; any other name is served by the
    EnvironmentService at `environment_target` (generated code never runs in the trainer).
    Raises NotFound naming both places when neither has it.
    Callers that validate a request call the factory once (the service does, before a job exists).
    `token` is the environment service's bearer token; a worker leaves it None and reads it from
    ENVIRONMENT_TOKEN_ENV, which the executors set; `tls_ca_file` likewise (ENVIRONMENT_TLS_CA_ENV):
    set, the channel is TLS trusting it."""
    import os

    from trace_common.env import make
    from trace_common.env.registry import list_environments
    from trace_common.errors import NotFound

    name, version = ref["name"], ref.get("version") or None
    params = dict(ref.get("params") or {})
    built_in = {spec.name for spec in list_environments()}
    if name in built_in:
        return lambda: make(name, version, **params)   # bad params: InvalidArgument on the first call
    if not environment_target:
        raise NotFound(f"environment {name!r} is not registered (built in: {', '.join(sorted(built_in))}) and no "
                       "environment service is configured to serve it: set TRACE_TRAINER_ENVIRONMENT_ADDRESS")
    from trace_common.env.remote import remote_factory

    if token is None:  # a worker process: the executor put the token in its environment
        token = os.environ.get(ENVIRONMENT_TOKEN_ENV) or os.environ.get("TRACE_TRAINER_AUTH_TOKEN")
    if tls_ca_file is None:
        tls_ca_file = os.environ.get(ENVIRONMENT_TLS_CA_ENV) or None
    factory = remote_factory(environment_target, name, version or "", token=token or None, tls_ca_file=tls_ca_file)
    if params:
        from trace_common.errors import InvalidArgument

        raise InvalidArgument(field="spec.environments.params", expected="no parameters for an environment served by "
                              "the environment service (its instances are fixed at generation)", got=sorted(params))
    return factory


def prefix_for(run_id: str, capability: str) -> str:
    return f"runs/{run_id or 'adhoc'}/adapters/{capability}"


def adapter_lineage(prefix: str) -> str:
    """A short digest of a job's checkpoint prefix: the part of its vLLM adapter names that a
    job resuming the same checkpoints shares and a job of another run does not (vllm_rollouts.py)."""
    return hashlib.sha256(prefix.encode()).hexdigest()[:12]


def events_key_for(prefix: str, job_id: str) -> str:
    return f"{prefix}/jobs/{job_id}/events.jsonl"


def encode_event(kind: str, payload: dict[str, Any]) -> str:
    return json.dumps({"event": kind, **payload}, sort_keys=True, separators=(",", ":"))


def decode_line(line: str) -> dict[str, Any] | None:
    """The event on a worker's stdout line, or None for ordinary output."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        data = json.loads(line[len(EVENT_PREFIX):])
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and "event" in data else None
