"""Composition artifacts: write a trained composition to the artifact store, load one back.

A composition artifact is two objects under one prefix (e.g. `runs/<run>/moe/`):

* `gates.safetensors` -- the gate weights (`<layer>.weight` [K+1, H], `<layer>.bias` [K+1]) with
  metadata: format, num_layers, hidden_size, num_slots and the adapter names in slot order;
* `composition.json` -- the manifest `{format, base_model, adapters: [{name, uri}], gates_uri,
  hidden_size, num_layers, num_slots, gate_parameters, routing_share, training}`, written last so
  a manifest never points at gates that are not there yet.

`load_composition(uri, allowed=...)` turns a manifest URI (or an in-memory spec: base, adapters, gates)
into a ready-to-run model + tokenizer. Every reference it names -- the manifest, the base model, each
adapter, the gates -- must first pass the caller's `trace_common.model_refs.ModelRoots` (PermissionDenied
naming the field, before anything is read or downloaded); the gates are read through their store, so
their sha256 sidecar is verified. Everything is validated before anything is returned, with errors
that name the mismatch: an adapter trained on another base, gates trained for another hidden size,
layer count or adapter list, a base whose config.json no loader reads, a missing or damaged file.
The caller's previous model is never touched, so a service can keep serving it when a load fails.

Routing modes (`PolicyRef.routing`; the inference service's `CompositionSpec.routing` enum names them,
mapped in `trace_common.specs.COMPOSITION_ROUTING`):

* `token` (default) -- the TRACE semantics: per-token, per-layer top-1 over base + K adapters.
* `per_request` -- the same model; the generator picks one slot per request from the gates' mean
  routing over the prompt (`choose_adapter_per_request`) and forces it for the whole generation.
  What an engine with per-request LoRA selection (vLLM `--enable-lora`) can serve.
* `merged` -- one adapter folded into the base weights (`merge_single_adapter`); the adapter is
  `merged_adapter` or, by default, the adapter with the largest `routing_share` recorded by gate
  training. What any engine can serve, at the cost of all routing.
* `soft_trajectory` -- the ablation of the reference code's default (`soft_routing`): the same model
  and the same gates, applied softly and per request: per layer, the mean gate softmax over the
  prompt's tokens weights every adapter's delta on every token of the request (slot 0's weight = no
  adapter). The gates were trained for hard per-token top-1 routing; this mode changes only how
  they are applied, so it measures the routing choice, not another training.

Accuracy trade-off (what the integrator measures on the eval): `token` is the trained model;
`per_request` loses within-request switching (a request needing two capabilities gets one);
`merged` loses all input dependence (every request gets the same adapter); `soft_trajectory` loses
within-request switching and blends the adapters instead of choosing one.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from trace_common.artifacts import ArtifactStore, S3Settings, open_uri
from trace_common.errors import InvalidArgument, NotFound, TraceError
from trace_common.hf_load import load_causal_lm
from trace_common.model_refs import ModelRoots, fetch_file, materialize
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.config import MoEConfig

FORMAT = "trace-moe-composition/v1"
GATES_FILE = "gates.safetensors"
MANIFEST_FILE = "composition.json"
BASE_SLOT_NAME = "base"

Routing = Literal["token", "per_request", "merged", "soft_trajectory"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class AdapterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Capability name; the expert's name in routing traces.")
    uri: str = Field(min_length=1, description="PEFT adapter directory: artifact URI or local path.")


class CompositionManifest(BaseModel):
    """`composition.json`: everything needed to rebuild the composed model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["trace-moe-composition/v1"] = FORMAT
    base_model: str = Field(min_length=1, description="Base model: HF dir, artifact URI or built-in agent name.")
    adapters: list[AdapterEntry] = Field(min_length=1, description="Slot k = adapters[k-1]; slot 0 is the base.")
    gates_uri: str = Field(min_length=1, description="URI of gates.safetensors.")
    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_slots: int = Field(ge=2, description="K + 1.")
    gate_parameters: int = Field(ge=1, description="L * (H * (K+1) + (K+1)).")
    routing_share: list[float] = Field(
        default_factory=list,
        description="Fraction of (layer, token) decisions per slot measured by gate training on its held-out "
                    "tokens; picks the adapter of the `merged` export. Empty when unknown.")
    training: dict[str, Any] = Field(default_factory=dict, description="Gate training summary (steps, accuracy).")

    @field_validator("adapters")
    @classmethod
    def _distinct(cls, v: list[AdapterEntry]) -> list[AdapterEntry]:
        names = [a.name for a in v]
        if len(set(names)) != len(names) or BASE_SLOT_NAME in names:
            raise ValueError(f"adapter names must be distinct and not {BASE_SLOT_NAME!r} (slot 0); got {names}")
        return v

    @property
    def adapter_names(self) -> list[str]:
        return [a.name for a in self.adapters]


@dataclass(frozen=True)
class CompositionArtifact:
    """Where `write_composition` put the artifact."""

    manifest_uri: str
    gates_uri: str
    manifest: CompositionManifest


@dataclass
class LoadedComposition:
    """A model ready to generate, with what it was built from.

    `composed` is the routed model (`token`, `per_request`, `soft_trajectory`); for `merged` it is None and `model`
    is the plain merged base. `expert_names[slot]` names slot 0 ("base") and the adapters.
    """

    model: torch.nn.Module
    tokenizer: Any
    routing: Routing
    composed: ComposedMoEModel | None
    expert_names: list[str]
    base_dir: Path
    adapter_dirs: dict[str, Path]
    num_layers: int
    hidden_size: int
    gate_parameters: int
    manifest: CompositionManifest | None = None
    merged_adapter: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


# ---- gates file ----------------------------------------------------------------------------------
def gates_metadata(model: ComposedMoEModel, routing_share: Sequence[float] = ()) -> dict[str, str]:
    meta = {"format": FORMAT, "num_layers": str(model.num_layers), "hidden_size": str(model.hidden_size),
            "num_slots": str(model.num_slots), "adapters": json.dumps(list(model.adapter_names))}
    if routing_share:
        meta["routing_share"] = json.dumps([float(x) for x in routing_share])
    return meta


def save_gates(model: ComposedMoEModel, path: str | Path, routing_share: Sequence[float] = ()) -> Path:
    """Write the gates of `model` as safetensors with the metadata `read_gates` checks (and, when
    known, the routing share per slot, so a gates file alone can pick the `merged` export's adapter)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in model.gate_state_dict().items()}, str(path),
              metadata=gates_metadata(model, routing_share))
    return path


def _unreadable_gates(path: Path, exc: Exception) -> InvalidArgument:
    return InvalidArgument(field="gates_uri", expected=f"a {GATES_FILE} written by gate training",
                           reason=f"{path.name} is not a readable safetensors file ({exc})")


def read_gates(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a gates file; InvalidArgument when it is not one.

    The header's metadata is read and checked before any tensor: a request may name any safetensors
    file of the store as its gates (an adapter's or a whole model's), and such a file is refused
    without being loaded into memory."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:   # reads the header only
            meta = dict(handle.metadata() or {})
    except (SafetensorError, OSError, ValueError) as exc:
        raise _unreadable_gates(path, exc) from exc
    if meta.get("format") != FORMAT:
        raise InvalidArgument(field="gates_uri", expected=f"gates with metadata format={FORMAT!r}",
                              got=meta.get("format"), fix="write gates with trace_common.moe.composition_io.save_gates")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise _unreadable_gates(path, exc) from exc
    return tensors, meta


def check_gates(meta: Mapping[str, str], *, adapter_names: Sequence[str], num_layers: int, hidden_size: int) -> None:
    """Gates must have been trained for this base (L, H) and this adapter list, in this order."""
    try:
        trained_names = json.loads(meta.get("adapters", "[]"))
        layers, hidden = int(meta.get("num_layers", "-1")), int(meta.get("hidden_size", "-1"))
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(field="gates_uri", reason=f"gate metadata is malformed ({exc})") from exc
    if hidden != hidden_size:
        raise InvalidArgument(field="gates_uri", expected=f"gates for hidden size {hidden_size} (this base)",
                              got=hidden, fix="load the base model the gates were trained on")
    if layers != num_layers:
        raise InvalidArgument(field="gates_uri", expected=f"gates for {num_layers} layers (this base)",
                              got=layers, fix="load the base model the gates were trained on")
    if list(trained_names) != list(adapter_names):
        unknown = [n for n in adapter_names if n not in trained_names]
        missing = [n for n in trained_names if n not in adapter_names]
        detail = []
        if unknown:
            detail.append(f"unknown adapter(s) {unknown} (the gates have no slot for them)")
        if missing:
            detail.append(f"missing adapter(s) {missing}")
        if not detail:
            detail.append("same adapters in a different order")
        raise InvalidArgument(field="adapters", expected=f"the gates' adapter list in slot order {trained_names}",
                              got=list(adapter_names), reason="; ".join(detail),
                              fix="list exactly the adapters the gates were trained with, in the same order")


# ---- writing -------------------------------------------------------------------------------------
def write_composition(store: ArtifactStore, prefix: str, model: ComposedMoEModel, *, base_model: str,
                      adapter_uris: Mapping[str, str], routing_share: Sequence[float] = (),
                      training: Mapping[str, Any] | None = None) -> CompositionArtifact:
    """Write `<prefix>/gates.safetensors` then `<prefix>/composition.json` (the manifest, last)."""
    missing = [n for n in model.adapter_names if n not in adapter_uris]
    if missing:
        raise InvalidArgument(field="adapter_uris", expected=f"a URI for every adapter {list(model.adapter_names)}",
                              got=sorted(adapter_uris), reason=f"missing {missing}")
    with tempfile.TemporaryDirectory(prefix="trace-gates-") as tmp:
        gates_info = store.put_file(f"{prefix}/{GATES_FILE}", save_gates(model, Path(tmp) / GATES_FILE, routing_share))
    manifest = CompositionManifest(
        base_model=base_model, adapters=[AdapterEntry(name=n, uri=adapter_uris[n]) for n in model.adapter_names],
        gates_uri=gates_info.uri, hidden_size=model.hidden_size, num_layers=model.num_layers,
        num_slots=model.num_slots, gate_parameters=model.num_gate_parameters(),
        routing_share=[float(x) for x in routing_share], training=dict(training or {}))
    info = store.put_bytes(f"{prefix}/{MANIFEST_FILE}", manifest.model_dump_json(indent=1).encode())
    return CompositionArtifact(manifest_uri=info.uri, gates_uri=gates_info.uri, manifest=manifest)


# ---- reading -------------------------------------------------------------------------------------
def read_manifest(uri: str, s3: S3Settings | None = None, *, allowed: ModelRoots,
                  field: str = "composition_uri") -> CompositionManifest:
    """The manifest at `uri`, read through its store (sha256-verified); PermissionDenied first when
    `allowed` refuses `uri`."""
    r = allowed.resolve(uri, field)
    if r.kind == "built_in":
        raise InvalidArgument(field=field, expected=f"the URI of a {MANIFEST_FILE}", got=uri)
    if r.root:
        from trace_common.artifacts import open_store

        store, key = open_store(r.root, s3), r.key
    else:
        store, key = open_uri(r.path.as_uri() if r.path is not None else r.uri, s3)
    raw = store.get_bytes(key)
    try:
        return CompositionManifest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidArgument(field="composition_uri", expected=f"a {MANIFEST_FILE} ({FORMAT})",
                              reason=f"{'.'.join(map(str, first['loc'])) or 'manifest'}: {first['msg']}") from exc


def default_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "trace-compositions"


def load_composition(source: str | CompositionManifest | None = None, *, base_model: str | None = None,
                     adapters: Sequence[tuple[str, str]] | None = None, gates_uri: str = "",
                     routing: Routing = "token", merged_adapter: str | None = None,
                     cache_dir: str | Path | None = None, s3: S3Settings | None = None, dtype: str = "float32",
                     device: str | torch.device = "cpu", moe_config: MoEConfig | None = None,
                     allowed: ModelRoots) -> LoadedComposition:
    """Build a composition from a manifest URI / manifest, or from (base_model, adapters, gates_uri).

    `allowed` decides which references may be read (the service's `ModelRoots.of(settings)`); every one
    is checked before anything is read. With no adapters the plain base is served (slot 0 only). With
    adapters and no gates, exactly one adapter is allowed and every token goes to it. Every check
    happens before returning (module docstring); errors are `PermissionDenied` / `InvalidArgument` /
    `NotFound` / `ArtifactCorrupted` naming the problem.
    """
    from transformers import AutoTokenizer

    if routing not in get_args(Routing):
        raise InvalidArgument(field="routing", expected=" | ".join(get_args(Routing)), got=routing)
    if dtype not in _DTYPES:
        raise InvalidArgument(field="dtype", expected=" | ".join(_DTYPES), got=dtype)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    manifest: CompositionManifest | None = None
    if source is not None:
        manifest = source if isinstance(source, CompositionManifest) else read_manifest(source, s3, allowed=allowed)
        base_model = manifest.base_model
        adapters = [(a.name, a.uri) for a in manifest.adapters]
        gates_uri = manifest.gates_uri
    if not base_model:
        raise InvalidArgument(field="base_model", expected="a model directory, artifact URI or built-in agent name")
    adapters = list(adapters or [])
    names = [n for n, _ in adapters]
    if len(set(names)) != len(names) or BASE_SLOT_NAME in names:
        raise InvalidArgument(field="adapters", expected=f"distinct names other than {BASE_SLOT_NAME!r}", got=names)
    if adapters and not gates_uri and routing == "soft_trajectory":
        raise InvalidArgument(field="gates_uri", expected="gates: soft_trajectory routing weights the adapters by the "
                              "gates' mean softmax over the prompt", fix="give the gates.safetensors written by gate "
                              "training, or use routing token / merged for a single adapter")
    if len(adapters) > 1 and not gates_uri and routing != "merged":
        raise InvalidArgument(field="gates_uri", expected=f"gates for a composition of {len(adapters)} adapters",
                              fix="give the gates.safetensors written by gate training (or a single adapter)")
    if routing == "merged" and adapters:
        from trace_common.moe.export import refuse_merge_into

        refuse_merge_into(dtype, field="routing", expected=f"token, per_request or soft_trajectory with {dtype} weights",
                          got=routing, remedy="route the adapter (routing token with one adapter applies it "
                                              "unmerged) or serve float32 weights")

    # every reference is decided before any is read (a refused adapter leaves nothing downloaded)
    allowed.resolve(base_model, "base_model")
    for name, uri in adapters:
        allowed.resolve(uri, f"adapters.{name}")
    if gates_uri:
        allowed.resolve(gates_uri, "gates_uri")
    base_dir = materialize(base_model, allowed=allowed, cache_dir=cache / "dirs", s3=s3, field="base_model")
    if not (base_dir / "config.json").is_file():
        raise NotFound(f"base_model {base_model!r} has no config.json; give a directory written by save_pretrained")
    adapter_dirs = {name: materialize(uri, allowed=allowed, cache_dir=cache / "dirs", s3=s3, field=f"adapters.{name}")
                    for name, uri in adapters}
    gates_path = fetch_file(gates_uri, cache, s3, allowed=allowed, field="gates_uri") if gates_uri else None
    gates = read_gates(gates_path) if gates_path is not None else None

    try:  # a config.json no loader reads (unknown model_type, not JSON, unreadable files) is the caller's input
        tokenizer = AutoTokenizer.from_pretrained(base_dir)
        base = load_causal_lm(base_dir, dtype=_DTYPES[dtype], device=device).eval()
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 -- see _unloadable
        raise _unloadable(exc, field="base_model", expected="a Hugging Face model directory (config.json with a "
                          "model_type transformers knows, weights, tokenizer) written by save_pretrained") from None
    config = base.config
    num_layers, hidden = int(config.num_hidden_layers), int(config.hidden_size)
    if gates is not None:
        check_gates(gates[1], adapter_names=names, num_layers=num_layers, hidden_size=hidden)
    experts = [BASE_SLOT_NAME, *names]
    common = dict(tokenizer=tokenizer, expert_names=experts, base_dir=base_dir, adapter_dirs=adapter_dirs,
                  num_layers=num_layers, hidden_size=hidden, manifest=manifest)

    if routing == "merged" and adapters:
        from trace_common.moe.export import merge_single_adapter

        share = list(manifest.routing_share) if manifest is not None else []
        if not share and gates is not None:
            share = json.loads(gates[1].get("routing_share", "[]"))
        chosen = merged_adapter or _adapter_by_share(share, names)
        if chosen not in adapter_dirs:
            raise InvalidArgument(field="merged_adapter", expected=f"one of {names}", got=chosen)
        merged = merge_single_adapter(base, adapter_dirs[chosen], name=chosen).eval()
        return LoadedComposition(model=merged, routing="merged", composed=None, gate_parameters=0,
                                 merged_adapter=chosen, **common)
    if not adapters:
        return LoadedComposition(model=base, routing=routing, composed=None, gate_parameters=0, **common)
    try:  # an adapter directory whose files no loader reads is the caller's input too
        composed = ComposedMoEModel.from_adapter_dirs(base, [adapter_dirs[n] for n in names], names=names,
                                                      config=moe_config)
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 -- see _unloadable
        raise _unloadable(exc, field="adapters", expected="PEFT adapter directories (adapter_config.json, "
                          "adapter_model.safetensors) written by the trainer") from None
    if gates is not None:
        try:
            composed.load_gate_state_dict({k: v.float() for k, v in gates[0].items()})
        except TraceError:
            composed.remove()
            raise
    else:
        composed.set_forcing(1)  # a single adapter without gates: every token to it
    composed.eval()
    return LoadedComposition(model=composed, routing=routing, composed=composed,
                             gate_parameters=composed.num_gate_parameters(), **common)


def _unloadable(exc: Exception, *, field: str, expected: str) -> InvalidArgument:
    """The caller's model files do not load: INVALID_ARGUMENT naming `field`, never INTERNAL.

    Every exception is mapped, not a list of types: the loaders behind one directory (transformers'
    config classes, huggingface_hub's strict dataclasses, safetensors, tokenizers, peft) each raise
    their own (ValueError, OSError, KeyError, TypeError, SafetensorError, StrictDataclass*Error, ...),
    and an adversarial review found three that escaped a list as INTERNAL."""
    detail = str(exc).splitlines()[0][:300] if str(exc) else ""
    return InvalidArgument(field=field, expected=expected, reason=f"it does not load ({type(exc).__name__}: {detail})")


def _adapter_by_share(share: list[float], names: list[str]) -> str:
    if len(names) == 1:
        return names[0]
    if len(share) != len(names) + 1:
        raise InvalidArgument(field="merged_adapter", expected=f"one of {names}",
                              reason="the composition records no routing share to pick the merged adapter by",
                              fix="name the adapter to merge")
    best = max(range(1, len(share)), key=lambda i: share[i])
    return names[best - 1]
