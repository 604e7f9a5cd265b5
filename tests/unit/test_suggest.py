"""trace_common.suggest: the closest valid name for a typo, and pydantic errors as one line each with
that hint, found by walking the model to the failing location (nested, optional, list and dict
fields)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trace_common.suggest import closest, did_you_mean, dotted, error_lines


class Llm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str = ""
    model: str = ""


class Rollout(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: int = 1
    split: str = "train"
    samples: int = 1


class Required(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    base_url: str


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str = "r"
    rollout: Rollout = Rollout()
    llm: Llm | None = None
    mode: Literal["diagnostics", "llm"] = "diagnostics"
    arms: list[Literal["base", "trace_routing"]] = Field(default_factory=list)
    sims: dict[str, Llm] = Field(default_factory=dict)
    sim: Required | None = None


@pytest.mark.parametrize("name, choices, expected", [
    ("limt", ["split", "limit", "samples"], "limit"),          # the closest wins over a merely close one
    ("limt", ["split", "samples"], "split"),                   # 0.67 >= 0.6: still suggested
    ("limt", ["samples", "seed"], None),                       # nothing close
    ("LIMIT", ["limit"], "limit"),                             # case does not count
    ("num_generatoins", ["num_iterations", "num_generations"], "num_generations"),
    ("trainr", ["rollout", "trainer", "inference"], "trainer"),
    ("x", [], None),
])
def test_closest(name, choices, expected):
    assert closest(name, choices) == expected


@pytest.mark.parametrize("name, choices, expected", [
    ("limt", ["limit"], "; did you mean 'limit'?"),
    ("limit", ["limit"], ""),                                  # the name itself is no suggestion
    ("zzz", ["limit"], ""),
])
def test_did_you_mean(name, choices, expected):
    assert did_you_mean(name, choices) == expected


@pytest.mark.parametrize("prefix, loc, expected", [
    ("", ("rollout", "limit"), "rollout.limit"),
    ("", ("arms", 1), "arms[1]"),
    ("training.grpo", ("vllm", "base_url"), "training.grpo.vllm.base_url"),
    ("cfg", (), "cfg"),
])
def test_dotted(prefix, loc, expected):
    assert dotted(prefix, loc) == expected


@pytest.mark.parametrize("data, prefix, expected", [
    ({"rollout": {"limt": 3}}, "", "rollout.limt: unknown field; did you mean 'limit'?"),
    ({"rollot": {}}, "", "rollot: unknown field; did you mean 'rollout'?"),                       # top level
    ({"llm": {"base_ur": "x"}}, "", "llm.base_ur: unknown field; did you mean 'base_url'?"),      # Optional
    ({"sims": {"a": {"modl": "m"}}}, "", "sims.a.modl: unknown field; did you mean 'model'?"),    # dict values
    ({"mode": "diagnostic"}, "", "mode: Input should be 'diagnostics' or 'llm'; did you mean 'diagnostics'?"),
    ({"arms": ["base", "trace_routng"]}, "", "arms[1]: Input should be 'base' or 'trace_routing'; "
     "did you mean 'trace_routing'?"),                                                          # list of Literal
    ({"rollout": {"limit": "many"}}, "cfg", "cfg.rollout.limit: Input should be a valid integer, unable to "
     "parse string as an integer"),                                                             # no hint to give
    ({"rollout": {"qqqq": 1}}, "", "rollout.qqqq: unknown field"),                             # nothing close
    # a misspelt required field is one mistake: the "Field required" of 'model' is not repeated
    ({"sim": {"modle": "m", "base_url": "u"}}, "", "sim.modle: unknown field; did you mean 'model'?"),
])
def test_error_lines_name_the_field_and_the_closest_name(data, prefix, expected):
    with pytest.raises(ValidationError) as err:
        Config.model_validate(data)
    assert error_lines(err.value, Config, prefix) == [expected]


def test_error_lines_are_bounded():
    with pytest.raises(ValidationError) as err:
        Config.model_validate({f"k{i}": i for i in range(15)})
    lines = error_lines(err.value, Config, limit=10)
    assert len(lines) == 11 and lines[-1] == "... and 5 more"


def test_a_missing_field_nobody_misspelt_is_still_reported():
    with pytest.raises(ValidationError) as err:
        Config.model_validate({"sim": {"base_url": "u", "qqqq": 1}})
    assert error_lines(err.value, Config) == ["sim.model: Field required", "sim.qqqq: unknown field"]
