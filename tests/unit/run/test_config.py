"""`tracectl run` configs: every shipped example validates; a bad config fails before any work
with the field and a fix (the closest valid name for a typo), a file that is no YAML mapping
fails in one line, and the CLI exits 2 without creating a run directory. (The GRPO sections,
which only the trainer parses, are in tests/integration/test_cli_bad_input.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trace_common.errors import InvalidArgument
from tracectl.cli import main
from tracectl.run.config import RunConfig, load_config

EXAMPLES = sorted(Path(__file__).resolve().parents[3].joinpath("examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_validate(path):
    cfg = load_config(path)
    assert cfg.run_id and cfg.evaluation.arms


@pytest.mark.parametrize("data, fragment", [
    ({"run_id": "x", "analysis": {"num_runs": 5, "min_passing_runs": 8}}, "min_passing_runs (8) > num_runs (5)"),
    ({"run_id": "x", "analysis": {"mode": "llm"}}, "analysis.llm is missing"),
    ({"run_id": "bad id!"}, "run_id 'bad id!'"),
    ({"run_id": "x", "services": {"trainr": "h:1"}}, "unknown ['trainr']"),
    ({"run_id": "x", "evaluation": {"arms": ["base", "gepa"]}}, "evaluation.gepa"),
    ({"run_id": "x", "rollout": {"limit": 0}}, "rollout.limit"),
    ({"run_id": "x", "evaluation": {"trials": 4}}, "every trial would replay the same episode"),   # store, greedy
    ({"run_id": "x", "evaluation": {"trials": 10}}, "evaluation.trials"),
    ({"run_id": "x", "rollout": {"limt": 3}}, "rollout.limt: unknown field; did you mean 'limit'?"),
    ({"run_id": "x", "services": {"trainr": "h:1"}}, "did you mean 'trainer'?"),
    ({"run_id": "x", "store": {"root": "ftp://host/x"}}, "store.root: "),
    ({"run_id": "x", "store": {"root": "s3://bucket"}}, "store.s3_endpoint is unset"),
    ({"run_id": "x", "evaluation": {"grpo_budgets": [0.5, 2]}}, "lacks 1: the grpo_target arm is GRPO at TRACE's own"),
    ({"run_id": "x", "evaluation": {"grpo_budgets": [0, 1]}}, "give multiples of TRACE's budget in (0, 64]"),
    ({"run_id": "x", "evaluation": {"arms": ["base", "trace_soft", "base"]}}, "lists an arm twice"),
    ({"run_id": "x", "evaluation": {"parallel": 0}}, "evaluation.parallel"),
])
def test_bad_config_names_the_field(tmp_path, monkeypatch, capsys, data, fragment):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidArgument, match="invalid run config") as err:
        load_config(path)
    assert fragment in str(err.value)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--config", str(path)]) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / ".trace").exists()   # nothing started, nothing written


@pytest.mark.parametrize("evaluation, env, probes, budgets", [
    ({}, "store", 100, [0.5, 1.0, 2.0, 4.0]),                       # the built-in target has probe splits
    ({}, "tau2-retail", 0, [0.5, 1.0, 2.0, 4.0]),                   # other targets have none
    ({"probe_limit": 0}, "store", 0, [0.5, 1.0, 2.0, 4.0]),
    ({"probe_limit": 12, "grpo_budgets": [2, 1, 1]}, "tau2-retail", 12, [1.0, 2.0]),   # sorted, once each
    ({"arms": ["base"], "grpo_budgets": [2]}, "store", 100, [2.0]),   # no grpo_target arm: no 1x point needed
])
def test_evaluation_defaults(evaluation, env, probes, budgets):
    cfg = load_config_dict({"run_id": "x", "target": {"env": env}, "evaluation": evaluation})
    assert cfg.evaluation.probes_for(env) == probes and cfg.evaluation.grpo_budgets == budgets
    assert cfg.evaluation.limit == 0 and cfg.evaluation.temperature == 0.0   # the whole split, greedy


def load_config_dict(data):
    from tracectl.run.config import RunConfig

    return RunConfig.model_validate(data)


# One typo'd key and one wrong type in every section tracectl itself validates (the top level too).
SECTION_CASES = [
    ({"run_id": "x", "sed": 1}, "sed: unknown field; did you mean 'seed'?"),
    ({"run_id": "x", "seed": "zero"}, "seed: Input should be a valid integer"),
    ({"run_id": "x", "rollout": {"sample": 2}}, "rollout.sample: unknown field; did you mean 'samples'?"),
    ({"run_id": "x", "rollout": 5}, "rollout: Input should be a valid dictionary"),
    ({"run_id": "x", "analysis": {"min_gaps": 0.1}}, "analysis.min_gaps: unknown field; did you mean 'min_gap'?"),
    ({"run_id": "x", "analysis": {"mode": "diagnostic"}}, "did you mean 'diagnostics'?"),
    ({"run_id": "x", "environments": {"max_retry": 1}}, "environments.max_retry: unknown field; did you mean "
     "'max_retries'?"),
    ({"run_id": "x", "environments": {"calibration_reward_min": "low"}}, "environments.calibration_reward_min: "
     "Input should be a valid number"),
    ({"run_id": "x", "training": {"paralel": 2}}, "training.paralel: unknown field; did you mean 'parallel'?"),
    ({"run_id": "x", "training": {"grpo": [1, 2]}}, "training.grpo: Input should be a valid dictionary"),
    ({"run_id": "x", "gates": {"configs": {}}}, "gates.configs: unknown field; did you mean 'config'?"),
    ({"run_id": "x", "gates": {"config": "warm"}}, "gates.config: Input should be a valid dictionary"),
    ({"run_id": "x", "evaluation": {"arms": ["base", "trace_routng"]}}, "evaluation.arms[1]: Input should be"),
    ({"run_id": "x", "evaluation": {"limit": "all"}}, "evaluation.limit: Input should be a valid integer"),
    ({"run_id": "x", "target": {"user_simulator": {"base_url": "u", "modle": "m"}}},
     "target.user_simulator.modle: unknown field; did you mean 'model'?"),
]


@pytest.mark.parametrize("data, fragment", SECTION_CASES, ids=lambda v: str(v)[:40] if isinstance(v, dict) else "")
def test_every_section_names_the_wrong_field(tmp_path, monkeypatch, capsys, data, fragment):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert err.count("\n") == 1, err                     # one mistake, one line
    assert not (tmp_path / ".trace").exists()


BAD_FILES = [
    ("list", b"- run_id: x\n- rollout: {}\n", "expected a mapping (key: value lines) at the top level, got a list"),
    ("scalar", b"demo\n", "got a string ('demo')"),
    ("number", b"42\n", "got a number (42)"),
    ("non-utf8", b"run_id: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 11)"),
    ("binary", bytes(range(256)), "a binary file (NUL byte at offset 0)"),
    ("empty", b"", "the file is empty"),
    ("blank", b"\n  \n", "the file is empty"),
    ("bad yaml", b"run_id: x\nrollout: {limit: [1}\n", "not valid YAML at line 2"),
    ("duplicate top-level key", b"run_id: x\ntraining: {parallel: 3}\nrun_id: y\n",
     "not valid YAML at line 3, column 1: the key 'run_id' is written twice in one mapping (first at line 1)"),
    ("duplicate nested key", b"run_id: x\ntraining:\n  parallel: 3\n  parallel: 1\n",
     "line 4, column 3: the key 'parallel' is written twice in one mapping (first at line 3)"),
    ("directory", None, "cannot read it"),
    ("missing", "absent", "cannot read it"),
]


@pytest.mark.parametrize("name, content, fragment", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_file_that_is_no_yaml_mapping_is_one_line(tmp_path, monkeypatch, capsys, name, content, fragment):
    path = tmp_path / "run.yaml"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgument, match="--config") as err:
        load_config(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert main(["run", "--config", str(path)]) == 2
    out, err_text = capsys.readouterr()
    assert err_text.count("\n") == 1 and fragment in err_text and "Traceback" not in out + err_text
    assert not (tmp_path / ".trace").exists()


@pytest.mark.parametrize("grpo", [
    {"max_resample_rounds": 2, "guidance_fraction": 0.25, "early_stop_uninformative_iterations": 3},
    {},
])
def test_grpo_on_the_target_plays_exactly_its_budget_points(grpo):
    """Unguided, never stopped early, and never re-collecting: each checkpoint chosen by iteration
    (curve_iterations) then plays its nominal m x B episodes, not up to (1 + rounds) times them."""
    from tracectl.run.config import grpo_target_config

    out = grpo_target_config(grpo)
    assert (out["guidance_fraction"], out["early_stop_uninformative_iterations"], out["max_resample_rounds"]) == (
        0.0, 0, 0)


@pytest.mark.parametrize(("search", "error"), [
    ({}, None),
    ({"minibatch_size": 1, "val_size": 1}, None),
    ({"minibatch": 1}, "minibatch"),                 # a typo of minibatch_size
    ({"minibatch_size": 0}, "minibatch_size"),
])
def test_gepa_search_is_checked_as_the_arm_parses_it(search, error):
    from pydantic import ValidationError

    from tracectl.evaluation.gepa import GepaSettings

    data = {"run_id": "g", "evaluation": {"gepa_search": search}}
    if error is None:
        cfg = RunConfig.model_validate(data)
        assert GepaSettings.model_validate(cfg.evaluation.gepa_search).minibatch_size == search.get("minibatch_size", 3)
        # unset, it stays out of the evaluation stage's hash (runs recorded before the field keep theirs)
        assert ("gepa_search" in cfg.section("evaluation")["parts"][0]) == bool(search)
    else:
        with pytest.raises(ValidationError, match=error):
            RunConfig.model_validate(data)


def test_an_inline_merge_key_still_loads(tmp_path):
    """The duplicate-key check flattens merge keys first, as PyYAML's own constructor does."""
    from tracectl.inputs import read_yaml_mapping

    path = tmp_path / "run.yaml"
    path.write_text("run_id: x\ntraining: {<<: {parallel: 3}, executor: local}\n")
    assert read_yaml_mapping(path, "--config") == {"run_id": "x", "training": {"parallel": 3, "executor": "local"}}
