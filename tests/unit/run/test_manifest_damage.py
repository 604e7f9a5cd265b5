"""A run manifest that cannot be trusted -- bytes that fail their recorded sha256, or bytes that pass
it but are no manifest -- stops `tracectl run` and `tracectl report` with one line saying how to get
going again (exit 3), before any service starts, and the damaged file is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trace_common.artifacts import open_store
from trace_common.errors import ArtifactCorrupted
from tracectl.cli import main
from tracectl.run.manifest import Manifest

QUICK = Path(__file__).resolve().parents[3] / "examples" / "quick.yaml"


def _tamper(path: Path) -> None:          # the bytes change behind the store's back: sha256 mismatch
    path.write_bytes(path.read_bytes().replace(b'"pending"', b'"pendinG"', 1))


def _not_json(store, key: str) -> None:   # written through the store (sha256 matches) but no manifest
    store.put_bytes(key, b"\x00\xffnot a manifest")


def _wrong_shape(store, key: str) -> None:
    store.put_bytes(key, b'{"run_id": "quick", "stages": {"rollout": {"status": "exploded"}}}')


DAMAGE = [
    ("sha256 mismatch", lambda store, key, path: _tamper(path), "fail the sha256 check"),
    ("not json", lambda store, key, path: _not_json(store, key), "does not parse as a run manifest"),
    ("wrong shape", lambda store, key, path: _wrong_shape(store, key), "does not parse as a run manifest"),
]


@pytest.fixture
def damaged(tmp_path, request):
    name, damage, fragment = request.param
    root = tmp_path / ".trace"
    store = open_store(root.resolve().as_uri())
    Manifest(run_id="quick", config={}).save(store)
    key = Manifest.key("quick")
    path = root / key
    damage(store, key, path)
    return store, path, path.read_bytes(), fragment


@pytest.mark.parametrize("damaged", DAMAGE, ids=[d[0] for d in DAMAGE], indirect=True)
def test_load_says_what_to_delete(damaged):
    store, path, _, fragment = damaged
    with pytest.raises(ArtifactCorrupted) as err:
        Manifest.load(store, "quick")
    text = str(err.value)
    assert fragment in text and path.as_uri() in text and "\n" not in text
    assert "Delete it and its .sha256 file" in text and "--run-id" in text


@pytest.mark.parametrize("command", ["run", "report"])
@pytest.mark.parametrize("damaged", DAMAGE, ids=[d[0] for d in DAMAGE], indirect=True)
def test_run_and_report_stop_with_exit_3(tmp_path, monkeypatch, capsys, damaged, command):
    _, path, before, fragment = damaged
    cfg = tmp_path / "quick.yaml"
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(QUICK.read_text()), "store": {"root": "file://./.trace"}}))
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--config", str(cfg)] if command == "run" else ["report", "quick", "--root", "file://./.trace"]
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in out + err, err
    assert path.read_bytes() == before                       # nothing rewritten
    assert sorted(p.name for p in path.parent.iterdir()) == [".trace-lock", "manifest.json", "manifest.json.sha256"]
    assert not (tmp_path / ".trace" / "embedded.json").exists()   # no service was started


def test_deleting_the_manifest_as_told_lets_the_run_start_again(tmp_path):
    store = open_store((tmp_path / ".trace").resolve().as_uri())
    Manifest(run_id="quick").save(store)
    path = tmp_path / ".trace" / Manifest.key("quick")
    _tamper(path)
    with pytest.raises(ArtifactCorrupted):
        Manifest.load(store, "quick")
    path.unlink()
    path.with_name("manifest.json.sha256").unlink()
    assert Manifest.load(store, "quick") is None             # a fresh run: every stage runs again


@pytest.mark.parametrize("message, stage", [
    ("file:///s/runs/q/rollouts/part-000.jsonl: content sha256 ab does not match", "rollout"),
    ("file:///s/runs/q/adapters/refunds/v3/adapter_model.safetensors: content sha256 ab does not match", "adapters"),
    ("file:///s/runs/q/eval/arm-base.jsonl: content sha256 ab does not match", "evaluation"),   # a unit (partial)
    ("file:///s/elsewhere.jsonl: content sha256 ab does not match", None),
])
def test_a_damaged_artifact_names_the_stage_to_rerun(message, stage):
    from tracectl.commands.run import with_rerun

    m = Manifest(run_id="q")
    m.stages["rollout"].outputs = {"trajectories": "file:///s/runs/q/rollouts/part-000.jsonl"}
    m.stages["adapters"].outputs = {"refunds": "file:///s/runs/q/adapters/refunds/v3/adapter_model.safetensors"}
    m.stages["evaluation"].partial = {"arm base": {"uri": "file:///s/runs/q/eval/arm-base.jsonl"}}
    assert m.stage_naming(message) == stage
    hint = with_rerun(message, m, "q.yaml")
    assert hint == message if stage is None else hint.endswith(f"`tracectl run --config q.yaml --from {stage}`")
