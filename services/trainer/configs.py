"""Which model parses a training job's hyper-parameters, and the check a client runs before any
work starts (TrainerService.ValidateTrainingConfig).

A `tracectl run` config carries the GRPO config of its adapters (`training.grpo`) and of its
gates (`gates.config`) as plain mappings: tracectl does not import the trainer. Those sections
used to meet their models only when the adapters stage created its first job, after rollouts,
analysis and environment synthesis had run. `validate_training_config` parses them with the
very models a job uses (`GRPOConfig`, `GateGRPOConfig`) and names each mistake the way the
caller's input names it (`field_path`, e.g. "training.grpo.num_generatoins"), with the closest
valid field name for an unknown key (`trace_common.suggest`).

Semantics:
    model = GRPOConfig if kind == ADAPTER else GateGRPOConfig if kind == GATES else InvalidArgument(kind)
    config = model(coerce_struct_ints(values))     # what CreateTrainingJob would train with
    error  -> InvalidArgument("<field_path>.<field>: <why>[; did you mean '<closest field>'?]; ...")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from services.trainer.gates.config import GateGRPOConfig
from services.trainer.grpo.config import ALIASES, GRPOConfig
from trace_common.errors import InvalidArgument
from trace_common.suggest import did_you_mean, error_line

#: TrainingKind name -> the model its config is parsed with.
MODELS: dict[str, type[GRPOConfig]] = {"TRAINING_KIND_ADAPTER": GRPOConfig, "TRAINING_KIND_GATES": GateGRPOConfig}

#: How GRPOConfig's own unknown-key check words its message (services/trainer/grpo/config.py,
#: `_known_keys`); such a message is replaced by one with the difflib hint. Any other message a
#: model raises for a key it does not declare (GateGRPOConfig's removed fields) is kept as it is.
_GENERIC_UNKNOWN = "unknown GRPO config key"


def config_model(kind: str) -> type[GRPOConfig]:
    try:
        return MODELS[kind]
    except KeyError:
        raise InvalidArgument(field="kind", expected=" or ".join(MODELS), got=kind,
                              fix="ADAPTER for a capability adapter's GRPO config, GATES for gate training's") from None


def coerce_struct_ints(model: type[GRPOConfig], values: Mapping[str, Any] | None) -> dict[str, Any]:
    """A protobuf Struct carries every number as a float: integral floats for int fields become ints."""
    data = dict(values or {})
    for name, field in model.model_fields.items():
        if name in data and field.annotation is int and isinstance(data[name], float) and data[name].is_integer():
            data[name] = int(data[name])
    return data


def _unknown_key_line(msg: str, key: str, model: type[GRPOConfig], where: str) -> str:
    if key in ALIASES:
        return f"{where}.{key}: unknown field; use {ALIASES[key]!r} (TRL's name for it)"
    if msg.startswith(_GENERIC_UNKNOWN):
        return f"{where}.{key}: unknown field{did_you_mean(key, model.model_fields)}"
    return f"{where}.{key}: {msg.removeprefix(f'{key}: ')}"


def _lines(err: ValidationError, data: Mapping[str, Any], model: type[GRPOConfig], where: str) -> list[str]:
    unknown = [k for k in data if k not in model.model_fields]
    lines = []
    for e in err.errors()[:10]:
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        # a model-level check (no location) about a key the model does not declare: name that key
        key = next((k for k in unknown if repr(k) in msg or msg.startswith(f"{k}:")), None) if not e["loc"] else None
        lines.append(_unknown_key_line(msg, key, model, where) if key is not None else error_line(e, model, where))
    return lines


def validate_training_config(kind: str, values: Mapping[str, Any] | None, field_path: str = "") -> GRPOConfig:
    """The config a `kind` job given `values` trains with, or InvalidArgument naming every field
    (first ten) that is wrong under `field_path` (default "config")."""
    model = config_model(kind)
    where = field_path or "config"
    data = coerce_struct_ints(model, values)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise InvalidArgument("; ".join(_lines(err, data, model, where)) +
                              f" (fields and ranges: {model.__module__}.{model.__name__})") from None
