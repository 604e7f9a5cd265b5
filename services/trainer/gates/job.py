"""TRAINING_KIND_GATES: the MoE gate-training job (services.trainer.gates.grpo) in the trainer service.

Service side (`validate_gates`, before a job exists): the job name, the adapters (each a PEFT
adapter in this trainer's artifact store: `adapter_model.safetensors` with `adapter_config.json`
beside it, named by the object or its directory), the data directory each environment names (under
the trainer's data roots: jobspec.confined_environment), an environment for every adapter, the target
environment when GRPO runs (max_steps > 0: it plays the target's training tasks only) or the
outcome warm start does (it replays every slot on the target's training tasks), the config
(`GateGRPOConfig`: GRPO fields with TRL names + warm start), with provenance labels the base agent's
trajectories of slot 0 (`config.base_provenance_uris`: JSONL artifacts in this trainer's store, every
one of them on the target's training split; outcome labels do not read them) and the policy.

Which environment belongs to which adapter (`assign_environments`): an environment whose
registry name is the capability (the environment registry names generated environments after
their capability); the other adapters, in sorted name order (the slot order), take the remaining
environments in order (the pipeline lists the capability environments that way, then the target);
environments left over are the target's: GRPO on the gates and the outcome replays play only them
(their training split), the capability environments serve the provenance warm start only. An environment parameter
`split` (the pipeline sends the target with split=train) is not passed to the environment: it names
the split that environment's instances are drawn from (default `config.train_split`).

Worker side (`run_gates`): loads the base, materialises the adapter directories, composes them,
reads the base trajectories (provenance labels), runs `train_gate_job` and reports the standard events (jobspec.py);
outputs `composition` (manifest URI for `load_composition` / `PolicyRef.composition_uri`), `gates`,
`training_metrics`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from services.trainer.gates.config import GateGRPOConfig
from services.trainer.grpo.config import parse_config
from services.trainer.jobspec import DATA_ROOTS_SETTING, confined_environment, env_factory, worker_model_roots
from trace_common.artifacts import ArtifactStore
from trace_common.data_roots import own_data_hidden
from trace_common.endpoints import refuse_outbound_params
from trace_common.env.trajectory import Trajectory, loads_jsonl
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound
from trace_common.model_refs import materialize
from trace_common.moe.composition_io import BASE_SLOT_NAME

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
JOB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
ADAPTER_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def gates_prefix(run_id: str, name: str) -> str:
    return f"runs/{run_id or 'adhoc'}/moe/{name}"


def adapter_dir_key(store: ArtifactStore, name: str, uri: str) -> str:
    """The store key of the adapter directory `uri` names (the object or its directory); InvalidArgument
    when it is outside the store or not a complete PEFT adapter."""
    field = f"spec.adapter_uris[{name!r}]"
    root = store.root_uri.rstrip("/") + "/"
    if not uri.startswith(root):
        raise InvalidArgument(field=field, expected=f"an adapter in this trainer's artifact store ({store.root_uri})",
                              got=uri, fix="pass the `adapter` output URI of the capability's adapter job, or copy "
                                           "the adapter into the store")
    key = uri[len(root):].rstrip("/")
    if key.endswith(".safetensors"):
        key = key.rsplit("/", 1)[0]
    for part in (ADAPTER_FILE, ADAPTER_CONFIG):
        try:
            store.stat(f"{key}/{part}")
        except NotFound:
            raise InvalidArgument(field=field, expected=f"a PEFT adapter ({ADAPTER_FILE} with {ADAPTER_CONFIG} "
                                  "beside it)", got=uri, reason=f"{store.uri_for(f'{key}/{part}')} does not exist",
                                  fix="pass the `adapter` output URI of a finished adapter job") from None
    return key


def store_key(store: ArtifactStore, uri: str, field: str) -> str:
    """The key of an object of this trainer's store named by `uri`; InvalidArgument when it is outside
    the store or missing."""
    root = store.root_uri.rstrip("/") + "/"
    if not uri.startswith(root):
        raise InvalidArgument(field=field, expected=f"an artifact in this trainer's artifact store ({store.root_uri})",
                              got=uri, fix="pass the rollout stage's `trajectories` output URI")
    key = uri[len(root):]
    try:
        store.stat(key)
    except NotFound:
        raise InvalidArgument(field=field, expected="an existing trajectories artifact", got=uri,
                              fix="pass the `trajectories` output URI of a finished rollout job") from None
    return key


def read_base_trajectories(store: ArtifactStore, uris: Sequence[str]) -> list[Trajectory]:
    """The base agent's trajectories named by `config.base_provenance_uris` (sha256-verified reads)."""
    out: list[Trajectory] = []
    for i, uri in enumerate(uris):
        key = store_key(store, uri, f"spec.config.base_provenance_uris[{i}]")
        out.extend(loads_jsonl(store.get_bytes(key), source=uri))
    return out


def assign_environments(adapters: Sequence[str], refs: Sequence[Any]) -> tuple[dict[str, Any], list[Any]]:
    """(adapter -> its environment ref, the target refs) -- see the module docstring."""
    by_name = {ref.name: ref for ref in refs}
    chosen: dict[str, Any] = {a: by_name[a] for a in adapters if a in by_name}
    rest = [ref for ref in refs if not any(ref is r for r in chosen.values())]
    unmatched = [a for a in adapters if a not in chosen]
    if len(rest) < len(unmatched):
        raise InvalidArgument(field="spec.environments", expected=f"an environment for every adapter {list(adapters)} "
                              "(named like the capability, or listed in adapter order before the target's)",
                              got=[r.name for r in refs], reason=f"no environment left for {unmatched[len(rest):]}",
                              fix="add each capability's environment (the adapters stage's environments), then the "
                                  "target with params split=train")
    for a, ref in zip(unmatched, rest, strict=False):
        chosen[a] = ref
    return {a: chosen[a] for a in adapters}, rest[len(unmatched):]


def validate_gates(spec: Any, store: ArtifactStore, environment_target: str = "",
                   environment_token: str | None = None, data_roots: Sequence[Path] = (),
                   environment_tls_ca_file: Path | None = None) -> GateGRPOConfig:
    """Everything checkable without loading a model (module docstring); the parsed config.
    `environment_token`, `environment_tls_ca_file`: the environment service's bearer token and the CA
    trusted for its TLS (the service's settings); `data_roots`:
    the directories an environment may name data under (TRACE_TRAINER_DATA_ROOTS; none: it may name
    none) -- each environment's `params['data']` and `uri` are checked before it is made."""
    if not JOB_NAME_RE.match(spec.capability):
        raise InvalidArgument(field="spec.capability", expected="a composition name: lower-case letters, digits, "
                              "'_', '-', '.' (e.g. '<run>-moe')", got=spec.capability)
    if not spec.adapter_uris:
        raise InvalidArgument(field="spec.adapter_uris", expected="capability -> adapter URI of the frozen adapters "
                              "to compose", fix="pass the adapters stage's outputs")
    for name, uri in spec.adapter_uris.items():
        if not ADAPTER_NAME_RE.match(name) or name == BASE_SLOT_NAME:
            raise InvalidArgument(field="spec.adapter_uris", expected=f"snake_case capability names other than "
                                  f"{BASE_SLOT_NAME!r} (slot 0 is the base)", got=name)
        adapter_dir_key(store, name, uri)
    config = parse_config(spec.config, GateGRPOConfig)
    assert isinstance(config, GateGRPOConfig)
    environments = [confined_environment(ref, data_roots, f"spec.environments[{i}]")
                    for i, ref in enumerate(spec.environments)]   # PERMISSION_DENIED before any data is read
    assigned, targets = assign_environments(list(spec.adapter_uris), environments)
    target_factories: list[tuple[str, Any]] = []
    splits: dict[str, str] = {}
    for label, ref, is_target in [*((a, r, False) for a, r in assigned.items()), *((r.name, r, True) for r in targets)]:
        params = dict(ref.params)
        refuse_outbound_params(params, f"spec.environments[{ref.name}].params")  # no URL or key from a request
        split = params.pop("split", "") or config.train_split
        # built in, or served by the environment service (NotFound / InvalidArgument with the reason)
        factory = env_factory({"name": ref.name, "version": ref.version, "params": params}, environment_target,
                              environment_token, environment_tls_ca_file)
        with own_data_hidden(ref.name, ref.version, params, setting=DATA_ROOTS_SETTING):  # no default path shown
            env = factory()
        if split not in env.splits():
            raise InvalidArgument(field="spec.config.train_split", expected=f"a split of every environment; "
                                  f"{ref.name!r} ({label}) has {sorted(env.splits())}", got=split,
                                  fix="set config.train_split or the environment's split param to one of them")
        if is_target:
            target_factories.append((ref.name, factory))
            splits[ref.name] = split
    if config.max_steps and not targets:
        raise InvalidArgument(field="spec.environments", expected="the target environment after the capability "
                              "environments: GRPO on the gates plays the target's training tasks only",
                              got=[r.name for r in spec.environments],
                              fix="add the target with params split=train, or set config.max_steps 0")
    provenance = config.warm_start_steps > 0 and config.warm_start_labels == "provenance"
    if config.warm_start_steps and not provenance and not targets:
        raise InvalidArgument(field="spec.environments", expected="the target environment after the capability "
                              "environments: the outcome warm start replays every slot on the target's training "
                              "tasks", got=[r.name for r in spec.environments],
                              fix="add the target with params split=train, or set config.warm_start_labels: "
                                  "provenance")
    if provenance and config.base_provenance != "none" and config.base_provenance_uris:
        from services.trainer.gates.provenance import select_base_provenance

        # the same check as the worker's: on the target's training split, and some to label slot 0 with
        select_base_provenance(read_base_trajectories(store, config.base_provenance_uris), target_factories,
                               config, splits)
    # An HTTP-served base agent (the cluster's vLLM) is trained on as an adapter job's is: its served name is
    # loaded as the base weights (the service checks it is a model location it may read). The composition
    # routes every token through its gates, which a LoRA server cannot do, so its episodes play in-process.
    if spec.policy.backend not in ("POLICY_BACKEND_IN_PROCESS", "POLICY_BACKEND_OPENAI_HTTP"):
        raise InvalidArgument(field="spec.policy.backend", expected="POLICY_BACKEND_IN_PROCESS, or "
                              "POLICY_BACKEND_OPENAI_HTTP whose served name is the base model's location (gate "
                              "training loads the base and routes every token through the in-process composition)",
                              got=spec.policy.backend, fix="a scripted policy has no weights: name the base model")
    return config


# ---- worker side ------------------------------------------------------------------------------------
def run_gates(spec: Any, store: ArtifactStore, *, s3: Any, emit: Callable[[str, dict[str, Any]], None],
              should_stop: Callable[[], bool], cache: Path, device: Any) -> int:
    """The worker body of a gates job (returns the process exit code)."""
    from services.trainer.gates.grpo import train_gate_job
    from services.trainer.grpo.models import load_base
    from services.trainer.grpo.trainer import seed_everything
    from trace_common.moe.composed import ComposedMoEModel

    config = parse_config(spec.config, GateGRPOConfig)
    assert isinstance(config, GateGRPOConfig)
    seed_everything(config.seed)
    root = store.root_uri.rstrip("/")
    dir_uris = {name: f"{root}/{adapter_dir_key(store, name, uri)}" for name, uri in spec.adapter_uris.items()}
    refs = [_Ref(r, spec.environment_target) for r in spec.environments]
    assigned, targets = assign_environments(list(dir_uris), refs)
    base_trajectories = read_base_trajectories(store, config.base_provenance_uris) \
        if config.warm_start_steps and config.warm_start_labels == "provenance" and config.base_provenance != "none" \
        else []
    allowed = worker_model_roots(spec)
    base, tokenizer, label = load_base(spec.policy["model"], cache_dir=cache, s3=s3, dtype=config.dtype, device=device,
                                       allowed=allowed)
    dirs = [materialize(uri, allowed=allowed, cache_dir=cache, s3=s3, field="adapter_uris") for uri in dir_uris.values()]
    composed = ComposedMoEModel.from_adapter_dirs(base, dirs, names=list(dir_uris))
    result = train_gate_job(config, composed, tokenizer, capability_envs={a: r.factory for a, r in assigned.items()},
                            target_envs=[(r.name, r.factory) for r in targets], adapter_uris=dir_uris,
                            base_trajectories=base_trajectories,
                            splits={**{a: r.split for a, r in assigned.items() if r.split},
                                    **{r.name: r.split for r in targets if r.split}},
                            base_model=spec.policy["model"], store=store, prefix=spec.prefix,
                            capability=spec.capability, on_event=emit, should_stop=should_stop,
                            resume=spec.resume_from or True)
    if should_stop() and result.stop_reason == "stop requested":
        emit("error", {"code": "CANCELLED", "message": f"stopped on request after {result.iterations} GRPO "
                       "iteration(s); the last checkpoint is kept for resuming"})
        return 1
    if result.composition is None:
        raise FailedPrecondition(f"gate training wrote no composition ({result.stop_reason})")
    emit("result", {"iterations": result.iterations, "policy_version": result.iterations,
                    "stop_reason": result.stop_reason, "adapter_uri": "", "outputs": result.outputs,
                    "composition_uri": result.composition.manifest_uri, "model": label})
    return 0


class _Ref:
    """An EnvironmentRefModel dict as the worker receives it, with its factory."""

    def __init__(self, data: Mapping[str, Any], environment_target: str = ""):
        self.name = str(data["name"])
        self.version = str(data.get("version") or "")
        self.params = dict(data.get("params") or {})
        self.split = str(self.params.pop("split", "") or "")
        self._factory = env_factory({"name": self.name, "version": self.version, "params": self.params},
                                    environment_target)

    def factory(self):
        return self._factory()
