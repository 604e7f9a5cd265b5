"""Bad input to every tracectl command that reads a file, and a mistake in every section of a run
config, against real services (the session's embedded stack, reached with --target / `services:`).

Each bad file -- the wrong top-level shape, a scalar, non-UTF-8 text, binary bytes, an empty file --
gives exit status 2 (tracectl/exits.py) with one line on stderr naming the flag and the file, no
traceback, nothing written, and no job on any service. So does a non-file or an over-cap file in
its place (/dev/zero, a FIFO, a directory, a sparse file one byte over the reader's cap), without
being read (bounded memory, no hang), and a YAML alias bomb of a few hundred bytes in a run config
(refused at its first alias, before anything expands: bounded memory); `tracectl report` on a manifest.json that is a directory or a
FIFO says the stored data is damaged (exit 3, one line). Each config mistake (a typo'd key and a
wrong type per section, `training.grpo` and `gates.config` included, which only the trainer can
parse) is refused before the first stage: exit 2, the field named by its dotted path with the
closest valid name where one exists, no manifest, no job. Below: `run --check`, the trainer's
ValidateTrainingConfig RPC itself, and the tau2 data directory of a run config.
"""

from __future__ import annotations

import json
import os
import resource
import uuid
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from tests.unit.run.test_config import SECTION_CASES
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.cli import main

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
QUICK = yaml.safe_load((REPO / "examples" / "quick.yaml").read_text())
JOB_SERVICES = {"rollout": "RolloutJobs", "analysis": "AnalysisJobs", "environment": "GenerationJobs",
                "trainer": "TrainingJobs"}

#: (name, bytes for a reader of mappings, bytes for a reader of lists, bytes for a JSONL reader, fragment)
CONTENTS = [
    ("wrong shape", b"[1, 2]\n", b'{"role": "user", "content": "hi"}\n', b"[1, 2]\n", None),
    ("scalar", b"42\n", b"42\n", b"42\n", None),
    ("non-utf8", b'{"k": "caf\xe9"}\n', b'[{"role": "caf\xe9"}]\n', b'{"task_id": "caf\xe9"}\n', "not UTF-8 text"),
    ("binary", bytes(range(256)), bytes(range(256)), bytes(range(256)), "binary file"),
    ("empty", b"", b"", b"", "empty"),
]
#: what each reader says about the wrong shape and about a scalar
SHAPE = {"mapping": ("got a list", "got a number"), "list": ("got a mapping", "got a number"),
         "jsonl": ("line 1 is a list", "line 1 is a number")}


def _command(kind: str, path: Path, stack, run_id: str) -> tuple[list[str], str]:
    """(argv with the bad file in place, the flag the message must name)."""
    tg = stack.targets
    if kind == "run":
        return ["run", "--config", str(path)], "--config"
    if kind == "report":
        return ["report", run_id, "--config", str(path)], "--config"
    if kind == "train":
        return ["train", "--capability", "c", "--config", str(path), "--run-id", run_id,
                "--target", f"trainer={tg['trainer']}"], "--config"
    if kind == "analyze":
        return ["analyze", str(path), "--run-id", run_id, "--target", f"analysis={tg['analysis']}"], "rollout"
    if kind == "messages-file":
        return ["route-trace", "--messages-file", str(path), "--target", tg["inference"]], "--messages-file"
    if kind == "tools-file":
        return ["route-trace", "--message", "hi", "--tools-file", str(path), "--target", tg["inference"]], \
            "--tools-file"
    if kind == "rollout":
        return ["rollout", "--env", str(path.parent), "--run-id", run_id, "--target",
                f"rollout={tg['rollout']}"], "--env"
    if kind == "envs":
        return ["envs", "generate", "--capability", "c", "--env", str(path.parent), "--run-id", run_id,
                "--target", f"environment={tg['environment']}"], "--env"
    if kind == "tau2":
        return ["tau2", "replay-gold", "--data", str(path.parent), "--out", str(path.parent.parent / "gold.json"),
                "--no-progress"], "--data"
    raise AssertionError(kind)


#: command -> (which reader, file name)
READERS = {"run": ("mapping", "run.yaml"), "report": ("mapping", "run.yaml"), "train": ("mapping", "grpo.json"),
           "analyze": ("jsonl", "rollout.jsonl"), "messages-file": ("list", "conv.json"),
           "tools-file": ("list", "tools.json"), "rollout": ("list", "data/tasks.json"),
           "envs": ("list", "data/tasks.json"), "tau2": ("list", "data/tasks.json")}
#: commands whose bad file is a tau2 data directory's tasks.json
TAU2_DIRS = {"rollout", "envs", "tau2"}


def _jobs(stack, run_id: str) -> dict[str, int]:
    out = {}
    for service, stem in JOB_SERVICES.items():
        pb = messages(service)
        resp = getattr(stack.stub(service), f"List{stem}")(getattr(pb, f"List{stem}Request")(
            filter=t.JobFilter(run_id=run_id), page_size=100))
        out[service] = len(resp.jobs)
    return out


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("content", CONTENTS, ids=[c[0] for c in CONTENTS])
@pytest.mark.parametrize("command", sorted(READERS))
def test_a_bad_file_is_one_line_and_starts_nothing(tmp_path, monkeypatch, capsys, embedded_stack, command, content):
    name, as_mapping, as_list, as_jsonl, fragment = content
    reader, filename = READERS[command]
    path = tmp_path / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"mapping": as_mapping, "list": as_list, "jsonl": as_jsonl}[reader]
    if command in TAU2_DIRS:   # a tau2 data directory whose tasks.json is the bad file (policy.md is fine)
        (path.parent / "policy.md").write_text("# policy\n")
    path.write_bytes(data)
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    argv, flag = _command(command, path, embedded_stack, run_id)
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert "Traceback" not in out + err
    assert err.count("\n") == 1 and flag in err and str(path.name) in err, err
    if fragment is None:
        fragment = SHAPE[reader][0 if name == "wrong shape" else 1]
    assert fragment in err, err
    assert _files(tmp_path) == before                        # nothing written (no store, no report, no --out)
    assert _jobs(embedded_stack, run_id) == dict.fromkeys(JOB_SERVICES, 0)


def _special(kind: str, path: Path, reader: str) -> str:
    """Put a non-file or an over-cap file at `path`; the fragment the one-line error must hold."""
    from tracectl.inputs import CONFIG_MAX_BYTES, DATA_MAX_BYTES

    if kind == "dev-zero":                      # endless bytes: never read
        path.symlink_to("/dev/zero")
        return "a character device, not a regular file"
    if kind == "fifo":                          # no writer: opening it would block forever
        os.mkfifo(path)
        return "a FIFO (named pipe), not a regular file"
    if kind == "directory":
        path.mkdir()
        return "a directory, not a file"
    cap = DATA_MAX_BYTES if reader == "jsonl" or path.name == "tasks.json" else CONFIG_MAX_BYTES
    with open(path, "wb") as f:                 # sparse: over the cap without writing it
        f.truncate(cap + 1)
    return "too large: over the cap of"


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge", "directory"])
@pytest.mark.parametrize("command", sorted(READERS))
def test_a_non_file_or_huge_file_is_one_line_without_reading_it(tmp_path, monkeypatch, capsys, embedded_stack,
                                                                  command, kind):
    reader, filename = READERS[command]
    path = tmp_path / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    if command in TAU2_DIRS:
        (path.parent / "policy.md").write_text("# policy\n")
    fragment = _special(kind, path, reader)
    if command in TAU2_DIRS and kind != "huge":   # a data directory whose tasks.json is no file is no data directory
        fragment = "tasks.json"
    run_id = f"odd-{uuid.uuid4().hex[:8]}"
    argv, flag = _command(command, path, embedded_stack, run_id)
    monkeypatch.chdir(tmp_path)
    before, peak = _files(tmp_path), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert "Traceback" not in out + err and err.count("\n") == 1 and flag in err and fragment in err, err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 64 * 1024   # KiB: nothing big was read
    assert _files(tmp_path) == before
    assert _jobs(embedded_stack, run_id) == dict.fromkeys(JOB_SERVICES, 0)


def _alias_bomb(levels: int = 9, width: int = 10) -> bytes:
    """A few hundred bytes of YAML whose aliases compose into width**levels scalars (10**9 here)."""
    rows = ["training:", "  grpo:", f"    l0: &l0 [{', '.join(['lol'] * width)}]"]
    rows += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return ("\n".join(rows) + "\n").encode()


#: commands that read a YAML run config
YAML_READERS = sorted(c for c, (reader, name) in READERS.items() if name.endswith(".yaml"))


@pytest.mark.parametrize("command", YAML_READERS)
def test_a_yaml_alias_bomb_is_one_line_with_bounded_memory(tmp_path, monkeypatch, capsys, embedded_stack, command):
    path = tmp_path / READERS[command][1]
    path.write_bytes(_alias_bomb())
    assert path.stat().st_size < 1024                         # far under the byte cap: only aliases make it big
    run_id = f"bomb-{uuid.uuid4().hex[:8]}"
    argv, flag = _command(command, path, embedded_stack, run_id)
    monkeypatch.chdir(tmp_path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert "Traceback" not in out + err and err.count("\n") == 1 and flag in err and path.name in err, err
    assert "YAML alias (*l0) at line 4" in err and "write the repeated value out in full" in err, err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 64 * 1024   # KiB: nothing was expanded
    assert _jobs(embedded_stack, run_id) == dict.fromkeys(JOB_SERVICES, 0)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_report_on_a_manifest_that_is_not_a_file_is_damaged_data(tmp_path, capsys, kind):
    manifest = tmp_path / "store" / "runs" / "odd" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    if kind == "directory":
        (manifest / "inner").mkdir(parents=True)
    else:
        os.mkfifo(manifest)
    code = main(["report", "odd", "--root", (tmp_path / "store").as_uri()])
    out, err = capsys.readouterr()
    assert code == 3, (code, err)                                   # tracectl/exits.py: stored data is damaged
    assert "Traceback" not in out + err and err.count("\n") == 1, err
    assert "manifest.json is damaged: it is not a regular file" in err and "Delete it" in err, err


# -- a mistake in every section of a run config --------------------------------------------------------------
#: mistakes only a service can see: the trainer parses the GRPO configs, the rollout service knows the targets
GRPO_CASES = [
    ({"training": {"grpo": {"num_generatoins": 4}}},
     "training.grpo.num_generatoins: unknown field; did you mean 'num_generations'?"),
    ({"training": {"grpo": {"max_steps": "three"}}}, "training.grpo.max_steps: Input should be a valid integer"),
    ({"training": {"grpo": {"lr": 0.001}}}, "training.grpo.lr: unknown field; use 'learning_rate'"),
    ({"training": {"grpo": {"scale_rewards": "groups"}}}, "training.grpo.scale_rewards: Input should be 'group', "
     "'batch' or 'none'; did you mean 'group'?"),
    ({"gates": {"config": {"warm_start_step": 5}}},
     "gates.config.warm_start_step: unknown field; did you mean 'warm_start_steps'?"),
    ({"gates": {"config": {"heldout_fraction": "most"}}}, "gates.config.heldout_fraction: Input should be a valid "
     "number"),
    ({"training": {"grpo": {"warmup_steps": 5, "max_steps": 3}}}, "training.grpo: warmup_steps=5 must be below"),
    # what only the rollout service knows: its environments and their splits
    ({"target": {"env": "stor"}}, "target.env: expected an environment the rollout service plays"),
    ({"target": {"env": "stor"}}, "got 'stor'. Did you mean 'store'?"),
    ({"rollout": {"split": "trian"}}, "rollout.split: expected a split of store (dev, test, train), got 'trian'. "
     "Did you mean 'train'?"),
    ({"evaluation": {"split": "tset"}}, "evaluation.split: expected a split of store (dev, test, train), got 'tset'. "
     "Did you mean 'test'?"),
]


def _run_config(tmp_path: Path, stack, change: dict, run_id: str) -> Path:
    cfg = json.loads(json.dumps(QUICK))
    for section, value in change.items():
        if isinstance(value, dict) and isinstance(cfg.get(section), dict):
            for key, sub in value.items():
                if isinstance(sub, dict) and isinstance(cfg[section].get(key), dict):
                    cfg[section][key] = {**cfg[section][key], **sub}
                else:
                    cfg[section][key] = sub
        else:
            cfg[section] = value
    cfg.update(run_id=run_id, services=dict(stack.targets), store={"root": "file://./store"})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _merge(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "run_id"}


@pytest.mark.parametrize("change, fragment", [(_merge(d), f) for d, f in SECTION_CASES] + GRPO_CASES,
                         ids=lambda v: json.dumps(v)[:50] if isinstance(v, dict) else "")
def test_a_config_mistake_is_refused_before_the_first_stage(tmp_path, monkeypatch, capsys, embedded_stack,
                                                              change, fragment):
    run_id = f"cfg-{uuid.uuid4().hex[:8]}"
    path = _run_config(tmp_path, embedded_stack, change, run_id)
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--config", str(path)])
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert fragment in err and "invalid run config" in err and "Traceback" not in out + err, err
    assert not (tmp_path / "store" / "runs" / run_id / "manifest.json").exists()
    assert _jobs(embedded_stack, run_id) == dict.fromkeys(JOB_SERVICES, 0)


def test_check_validates_and_runs_nothing(tmp_path, monkeypatch, capsys, embedded_stack):
    run_id = f"chk-{uuid.uuid4().hex[:8]}"
    path = _run_config(tmp_path, embedded_stack, {}, run_id)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--config", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "valid run config" in out and "training.grpo" in out and "gates.config" in out
    assert "grpo_target" in out                              # the arm's unguided variant was checked too
    assert not (tmp_path / "store" / "runs" / run_id).exists()
    assert _jobs(embedded_stack, run_id) == dict.fromkeys(JOB_SERVICES, 0)


@pytest.mark.parametrize("uri", ["/nonexistent/tau2/retail", ""])
def test_a_run_on_tau2_data_that_is_not_there_names_target_uri(tmp_path, monkeypatch, capsys, uri):
    cfg = {**QUICK, "run_id": "tau2-missing", "target": {"env": "tau2-retail", "uri": uri}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACE_TAU2_DATA", str(tmp_path / "no-such-data"))
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "target.uri" in err and "--data" not in err and "TRACE_TAU2_DATA" in err, err
    assert not (tmp_path / ".trace").exists()                # refused before any service started


# -- the RPC itself --------------------------------------------------------------------------------------------
def _struct(values: dict) -> t.Config:
    s = Struct()
    s.update(values)
    return t.Config(values=s)


@pytest.mark.parametrize("kind, values, path, fragment", [
    (1, {"num_generatoins": 4}, "training.grpo", "training.grpo.num_generatoins: unknown field; did you mean "
                                                 "'num_generations'?"),
    (2, {"warm_start_step": 5}, "gates.config", "gates.config.warm_start_step: unknown field; did you mean "
                                                "'warm_start_steps'?"),
    (1, {"max_steps": 2.5}, "", "config.max_steps: Input should be a valid integer"),
    (0, {}, "", "kind: expected TRAINING_KIND_ADAPTER or TRAINING_KIND_GATES"),
    (7, {}, "", "kind: expected TRAINING_KIND_ADAPTER or TRAINING_KIND_GATES, got '7'"),
])
def test_validate_training_config_refuses_with_the_field(embedded_stack, kind, values, path, fragment):
    T = messages("trainer")
    with pytest.raises(grpc.RpcError) as err:
        embedded_stack.stub("trainer").ValidateTrainingConfig(T.ValidateTrainingConfigRequest(
            kind=kind, config=_struct(values), field_path=path))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in err.value.details()


@pytest.mark.parametrize("kind, values, expected", [
    (1, {"max_steps": 3, "num_generations": 4}, {"max_steps": 3, "num_generations": 4, "guidance_fraction": 0.0}),
    (2, {}, {"warm_start_steps": 100, "base_provenance": "successful"}),
])
def test_validate_training_config_returns_the_normalized_config(embedded_stack, kind, values, expected):
    T = messages("trainer")
    resp = embedded_stack.stub("trainer").ValidateTrainingConfig(T.ValidateTrainingConfigRequest(
        kind=kind, config=_struct(values)))
    got = MessageToDict(resp.config.values)
    assert {k: got[k] for k in expected} == expected
    assert len(got) > 20                                      # every field, defaults included


@pytest.mark.parametrize("content", [b"[1, 2]", b"42", b"\xff\xfe", bytes(range(256)), b"", b'{"pid": 1}'],
                         ids=["list", "scalar", "non-utf8", "binary", "empty", "no targets"])
def test_status_on_a_damaged_embedded_json_says_no_stack(tmp_path, capsys, content):
    (tmp_path / "embedded.json").write_bytes(content)
    assert main(["status", "--root", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "no running embedded stack found" in err and err.count("\n") == 1 and "Traceback" not in out + err
