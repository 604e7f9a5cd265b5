"""A shipped base-agent artifact (checksummed files + build record) made from a tiny real build:
it installs when the current code produces its key, is refused naming the file or digest that
differs and the rebuild command, and its recorded losses are reproduced by a replay. And a second
process that wants an agent another process is building says whose build it waits for."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from trace_common.agents import MicroConfig, SFTConfig, WarmStartData, read_meta, resolve_base_agent, shipped
from trace_common.agents.cache import cached_build, config_hash
from trace_common.agents.progress import BuildEvent
from trace_common.agents.resolve import provenance_of
from trace_common.errors import ArtifactCorrupted, FailedPrecondition, NotFound
from trace_common.grpc.jobs_rpc import job_to_proto
from trace_common.jobs import JobManager
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.progress import follow

TOY = MicroConfig(hidden_size=64, num_layers=1, intermediate_size=64, num_kv_heads=1, vocab_size=512,
                  data=WarmStartData(episodes=8), sft=SFTConfig(steps=3, batch_size=2, copy_steps=5,
                                                                copy_batch_size=4, max_seq_len=4096))
REBUILD = shipped.REBUILD_COMMAND["micro"]


@pytest.fixture(scope="module")
def toy_artifact(tmp_path_factory):
    """A real tiny build written out as a shipped artifact: (artifact dir, its cache dir)."""
    cache = tmp_path_factory.mktemp("cache")
    model_dir = resolve_base_agent("micro", cache, config=TOY)
    dest = tmp_path_factory.mktemp("shipped") / "micro"
    shipped.write_artifact(model_dir, read_meta(model_dir), dest)
    return dest, cache


def copy_of(artifact: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "micro"
    shutil.copytree(artifact, out)
    return out


def edit_record(artifact: Path, change) -> None:
    path = artifact / shipped.RECORD_NAME
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def test_record_lists_checksummed_files_losses_and_provenance(toy_artifact):
    artifact, _ = toy_artifact
    record = shipped.read_record(artifact)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(record["files"])
    assert all(shipped.sha256_file(artifact / n) == f["sha256"] for n, f in record["files"].items())
    assert len(record["loss_trace"]) == 8 and record["examples_digest"]
    prov = record["provenance"]
    assert set(prov["code"]) == set(shipped_code := ("agents/micro.py", "agents/sft.py", "agents/tokenizer.py",
                                                     "policy/chat.py", "policy/toolcalls.py")), shipped_code
    assert record["key"] == config_hash("micro", TOY, prov) and record["rebuild"] == REBUILD
    assert {"held_out_token_accuracy", "held_out_turn_exact"} <= set(record["metrics"])
    assert record["environment"]["torch"]


def test_check_replays_the_first_steps(toy_artifact):
    artifact, _ = toy_artifact
    summary = shipped.check("micro", artifact=artifact, steps=4, require_default=False)
    assert summary["steps"] == 4 and len(summary["losses"]) == 4
    assert summary["losses"] == pytest.approx(summary["recorded"], abs=1e-4)


@pytest.mark.parametrize(("tamper", "error", "names"), [
    (lambda a: (a / "model.safetensors").write_bytes((a / "model.safetensors").read_bytes()[:-1] + b"\0"),
     ArtifactCorrupted, "model.safetensors"),
    (lambda a: (a / "notes.txt").write_text("x"), ArtifactCorrupted, "notes.txt"),
    (lambda a: (a / "tokenizer.json").unlink(), ArtifactCorrupted, "tokenizer.json is missing"),
    (lambda a: edit_record(a, lambda r: r["loss_trace"].__setitem__(1, r["loss_trace"][1] + 0.01)),
     FailedPrecondition, "step 2: replayed"),
    (lambda a: edit_record(a, lambda r: r.__setitem__("examples_digest", "0" * 64)),
     FailedPrecondition, "tokenized training examples differ"),
    (lambda a: edit_record(a, lambda r: rekey(r, data_digest="0" * 64)),
     FailedPrecondition, "other training data"),
    (lambda a: edit_record(a, lambda r: rekey(r, code={**r["provenance"]["code"], "agents/sft.py": "0" * 64})),
     FailedPrecondition, "trace_common/agents/sft.py"),
    (lambda a: (a / shipped.RECORD_NAME).unlink(), NotFound, "build_record.json is missing"),
], ids=["weights byte", "extra file", "missing file", "loss trace", "examples", "data digest", "code digest",
        "no record"])
def test_check_names_what_differs_and_the_rebuild_command(toy_artifact, tmp_path, tamper, error, names):
    artifact = copy_of(toy_artifact[0], tmp_path)
    tamper(artifact)
    with pytest.raises(error) as info:
        shipped.check("micro", artifact=artifact, steps=4, require_default=False)
    assert names in info.value.reason and REBUILD in info.value.reason


def test_check_refuses_an_artifact_of_another_config_than_the_default(toy_artifact):
    with pytest.raises(FailedPrecondition, match="default MicroConfig"):
        shipped.check("micro", artifact=toy_artifact[0], steps=1)


def rekey(record: dict, **provenance) -> None:
    """What a build on other data / code would have recorded: its provenance and the key it makes."""
    record["provenance"] = {**record["provenance"], **provenance}
    record["key"] = config_hash("micro", MicroConfig.model_validate(record["config"]), record["provenance"])


def never_build(_out, _progress):
    raise AssertionError("built although an artifact or another process's build should have been used")


def test_a_matching_artifact_is_installed_verified_instead_of_built(toy_artifact, tmp_path):
    artifact, cache = toy_artifact
    prov, _ = provenance_of("micro", TOY, cache)
    events: list[BuildEvent] = []
    model_dir = cached_build(tmp_path, "micro", TOY, never_build, provenance=prov, shipped=artifact,
                             progress=events.append)
    meta = read_meta(model_dir)
    assert meta["source"] == "shipped" and meta["hash"] == shipped.read_record(artifact)["key"]
    assert [e.phase for e in events] == ["installing", "done"]
    for name, f in shipped.read_record(artifact)["files"].items():
        assert shipped.sha256_file(model_dir / name) == f["sha256"]


def test_a_stale_artifact_is_not_used_and_the_build_says_why(toy_artifact, tmp_path):
    artifact = copy_of(toy_artifact[0], tmp_path / "a")
    edit_record(artifact, lambda r: rekey(r, data_digest="0" * 64))
    prov, _ = provenance_of("micro", TOY, toy_artifact[1])
    events: list[BuildEvent] = []

    def build(out, progress):
        (out / "config.json").write_text("{}")
        return {}
    cached_build(tmp_path / "cache", "micro", TOY, build, provenance=prov, shipped=artifact, progress=events.append)
    start = next(e for e in events if e.phase == "start")
    assert "other training data" in start.message and REBUILD in start.message and "first use" in start.message


HOLDER = """
import sys, time
from pathlib import Path
from trace_common.agents.cache import cached_build
from trace_common.agents.micro import MicroConfig
from trace_common.agents.progress import BuildEvent
cache, flag = Path(sys.argv[1]), Path(sys.argv[2])
def build(out, progress):
    progress(BuildEvent("micro", "copying", step=3, total=10, loss=1.5, elapsed_s=2.0))
    flag.with_name("holding").write_text("1")
    while not flag.exists():
        time.sleep(0.05)
    (out / "config.json").write_text("{}")
    return {"built_by": "holder"}
cached_build(cache, "micro", MicroConfig(), build)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process building `micro` in `tmp_path/cache` until `release()`."""
    cache, flag = tmp_path / "cache", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(cache), str(flag)],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    deadline = time.monotonic() + 60
    while not (tmp_path / "holding").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the holder process did not start its build"
        time.sleep(0.05)
    yield SimpleNamespace(cache=cache, pid=proc.pid, release=lambda: flag.write_text("1"))
    flag.write_text("1")
    proc.wait(30)


def test_a_second_process_says_whose_build_it_waits_for(holder):
    events: list[BuildEvent] = []
    result: dict = {}
    waiter = threading.Thread(target=lambda: result.update(dir=cached_build(
        holder.cache, "micro", MicroConfig(), never_build, progress=events.append, poll_s=0.1)))
    waiter.start()
    deadline = time.monotonic() + 30
    while len([e for e in events if e.phase == "waiting"]) < 3:
        assert time.monotonic() < deadline, events
        time.sleep(0.05)
    waits = [e for e in list(events) if e.phase == "waiting"]  # while the holder builds
    holder.release()
    waiter.join(30)
    assert all(f"pid {holder.pid} on {socket.gethostname()} since " in e.message for e in waits), waits[0]
    assert all("its progress: copying step 3/10 loss 1.5000" in e.message for e in waits)
    assert (waits[0].step, waits[0].total) == (3, 10)
    assert waits[-1].elapsed_s > waits[0].elapsed_s
    assert read_meta(result["dir"])["metrics"] == {"built_by": "holder"}  # found the other's build, built nothing


def test_a_waiting_job_shows_the_wait_in_tracectls_watch(holder):
    """The job-level path of a second `tracectl run`: its rollout job's worker thread waits on the
    lock; the job's progress says so, and tracectl's plain-line watch prints it."""
    async def main():
        jobs = JobManager("rollout")

        async def body(_ctx):
            return await asyncio.to_thread(cached_build, holder.cache, "micro", MicroConfig(), never_build,
                                           poll_s=0.1)
        rec = jobs.submit("rollout", body)
        stream = []
        async for snap in jobs.watch(rec.job_id):
            stream.append(SimpleNamespace(job=job_to_proto(snap)))
            if sum("waiting for the build" in s.job.progress.message for s in stream) == 2:
                holder.release()
        return stream

    stream = asyncio.run(main())
    buf = io.StringIO()
    final = follow(lambda: iter(stream), "base rollouts", out=Console(file=buf, force_terminal=False, width=100))
    lines = buf.getvalue().splitlines()
    waiting = [ln for ln in lines if "waiting for base agent micro" in ln]
    assert waiting and f"by pid {holder.pid}" in waiting[0] and "copying step 3/10" in waiting[0], lines
    assert final.state == t.JOB_STATE_SUCCEEDED
