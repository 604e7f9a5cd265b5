"""`tracectl run` configs: every shipped example validates; a bad config fails before any work
with the field and a fix, and the CLI exits 2 without creating a run directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trace_common.errors import InvalidArgument
from tracectl.cli import main
from tracectl.run.config import load_config

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
    ({"run_id": "x", "rollout": {"limt": 3}}, "rollout.limt"),
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
