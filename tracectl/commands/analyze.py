"""`tracectl analyze`: contrastive capability analysis of rollout trajectories.

    tracectl analyze .trace/runs/r1/rollouts/part-000.jsonl --run-id r1            # diagnostics mode
    tracectl analyze s3://trace/runs/r1/rollouts/part-000.jsonl --run-id r1 \\
        --llm-url http://vllm:8000/v1 --llm-model Qwen/Qwen3-8B --target analysis=analysis:50052

Calls AnalysisService over gRPC -- the deployed one given `--target analysis=HOST:PORT` (or
TRACE_ANALYSIS_TARGET), else an embedded stack started in this process with its artifact
store under `--root`. Shows the job's progress, prints the capability table (mode included),
and makes sure report.md, report.json and the PNG plots are in the run directory: the embedded
service writes them to `<root>/runs/<run_id>/analysis/<job_id>/` itself; for a remote service
they are downloaded (sha256-verified) into `--out` (default `./runs/<run_id>/analysis/<job_id>`),
s3:// outputs with the TRACE_ANALYSIS_S3_* credentials.

Rollouts are given as artifact URIs (file://, s3://) or local paths. The analysis service reads
only its own run's rollouts (`runs/<run_id>/rollouts/` of its store; `runs/adhoc/rollouts/` without
--run-id) and the store prefixes its operator lists (TRACE_ANALYSIS_ROLLOUT_ROOTS). So, for the
embedded service, a local file (path or file:// URI) that is not already there is first imported
into the embedded store under `runs/<run_id>/rollouts/` (a store-written one is read sha256-verified
to do so); an s3:// URI is passed as it is. A remote service cannot read local files: there a local
path is refused here, and URIs are passed for that service to decide.

A local rollout file is checked before anything is imported or started: UTF-8 text, one JSON
object per line, not empty. A spec the service refuses (INVALID_ARGUMENT) is shown with the flags
that set its fields (`spec.min_gap` is `--delta`: FLAGS).

Exit status: 0 analysed, 1 the job failed (its code and reason are printed), 2 bad usage (a flag,
an unreadable or malformed rollout file, or a spec the service refused), 3 a stored rollout is
damaged (tracectl/exits.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from urllib.parse import unquote

import grpc
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from trace_common.artifacts import S3Settings, open_store, open_uri
from trace_common.config import settings_class
from trace_common.errors import ArtifactCorrupted, FailedPrecondition, TraceError
from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl import exits
from tracectl.connect import Connection, add_connection_args, parse_targets
from tracectl.embedded import allow_from_command
from tracectl.inputs import check_jsonl, default_or_count, seed_int
from tracectl.progress import follow, state_name

MODES = ("diagnostics", "llm")

#: AnalysisSpec field -> the flag (or argument) of this command that sets it, for the service's messages.
FLAGS = {"rollout_uris": "ROLLOUT", "num_runs": "--runs", "min_passing_runs": "--min-passing-runs",
         "min_coverage": "--rho", "min_gap": "--delta", "max_candidates": "--max-candidates",
         "trajectory_char_budget": "--budget", "llm.base_url": "--llm-url", "llm.model": "--llm-model",
         "llm.timeout_seconds": "--llm-timeout", "llm.max_concurrency": "--llm-concurrency", "run_id": "--run-id"}
_FLAG_RE = re.compile(r"(?<![\w.-])(?:spec\.)?(" + "|".join(re.escape(f) for f in sorted(FLAGS, key=len, reverse=True))
                      + r")(?!\w)")


def with_flags(message: str) -> str:
    """A service message about the spec, with each field named by the flag the user typed:
    "spec.min_gap: Input should be <= 1" -> "--delta: Input should be <= 1"."""
    return _FLAG_RE.sub(lambda m: FLAGS[m.group(1)], message)


class UsageError(Exception):
    """Bad command-line input: printed, exit status 2."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="find the capabilities behind an agent's failures (contrastive analysis)",
                       description=__doc__.split("\n\n")[2], formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog(0, 1, 2, 3, c0="analysed", c1="the analysis job failed (its code and "
                                           "reason are printed)",
                                           c2="bad usage, nothing started: a flag, an unreadable or malformed "
                                              "rollout file (binary, not UTF-8, empty, a line that is not a JSON "
                                              "object), or a spec the service refused (named by its flag)",
                                           c3="a stored rollout or report file is damaged (sha256 mismatch)"))
    p.add_argument("rollouts", nargs="+", metavar="ROLLOUT", help="trajectory JSONL: file:// or s3:// URI, or path")
    p.add_argument("--mode", choices=MODES, default=None,
                   help="analyst: llm (prompted LLM) or diagnostics (environment diagnostics); "
                        "default llm when --llm-url is given, else diagnostics")
    p.add_argument("--llm-url", default="", help="OpenAI-compatible base URL of the analyst LLM")
    p.add_argument("--llm-model", default="", help="served model name of the analyst LLM")
    p.add_argument("--llm-api-key-env", default="", help="env var (of this process) holding the API key, for the "
                   "embedded service; a deployed one uses its endpoint profile's key (TRACE_ANALYSIS_ENDPOINTS)")
    p.add_argument("--llm-timeout", type=float, default=0.0, help="seconds per LLM request (0: service default)")
    p.add_argument("--llm-concurrency", type=default_or_count, default=0, help="LLM requests in flight (0: service default)")
    p.add_argument("--runs", type=default_or_count, default=0, help="N labeling runs (default 10)")
    p.add_argument("--min-passing-runs", type=default_or_count, default=0, help="K runs a capability must pass (default 8)")
    p.add_argument("--rho", type=float, default=0.0, help="coverage threshold (default 0.10)")
    p.add_argument("--delta", type=float, default=0.0, help="contrastive gap threshold (default 0.20)")
    p.add_argument("--max-candidates", type=default_or_count, default=0, help="candidates from discovery (default 10)")
    p.add_argument("--budget", type=default_or_count, default=0, help="characters per compacted trajectory (default 6000)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--run-id", default="", help="pipeline run the analysis belongs to (decides the report folder)")
    p.add_argument("--out", type=Path, default=None,
                   help="also put the report files here (default: the run directory)")
    add_connection_args(p)
    p.set_defaults(func=cmd_analyze)


def _local_rollout(path: Path, root: Path, run_id: str, remote: bool, taken: set[str]) -> str:
    """The URI the analysis service reads `path` by: the file itself when it already lies in the
    embedded store under this run's rollouts, else a copy imported there (key not in `taken`)."""
    if not path.exists():  # (a directory, FIFO or device: check_rollout says which, without reading it)
        raise UsageError(f"rollout {path}: no such file; give a file:// or s3:// URI or an existing JSONL path")
    check_rollout(path)
    stored = Path(f"{path}.sha256").is_file()  # written by an artifact store: its reads are verified
    if remote:
        if stored:
            return path.resolve().as_uri()
        raise UsageError(f"rollout {path}: a local file is not readable by the remote analysis service; upload "
                         "it to the artifact store (s3://...) and pass its URI")
    store = open_store(root.resolve().as_uri())
    runs = f"runs/{run_id or 'adhoc'}/rollouts"
    own = (root.resolve() / runs).resolve()
    if stored and path.resolve().is_relative_to(own):
        return path.resolve().as_uri()
    name, n = path.name, 1
    while f"{runs}/{name}" in taken:  # two inputs of one command with one file name
        n += 1
        name = f"{path.stem}-{n}{path.suffix}"
    key = f"{runs}/{name}"
    if stored:  # copy what the store recorded, verified against its sha256
        source, source_key = open_uri(path.resolve().as_uri())
        info = store.put_bytes(key, source.get_bytes(source_key))
    else:
        info = store.put_file(key, path)
    taken.add(key)
    print(f"imported {path} as {info.uri}", file=sys.stderr)
    return info.uri


def check_rollout(path: Path) -> None:
    """InvalidArgument (one line) unless `path` holds trajectories: UTF-8 JSONL of Trajectory records."""
    from trace_common.env import Trajectory

    check_jsonl(path, "rollout", fix="give trajectories written by a rollout job (tracectl rollout)", model=Trajectory)


def rollout_uris(items: list[str], root: Path, run_id: str, remote: bool) -> list[str]:
    uris: list[str] = []
    taken: set[str] = set()
    for item in items:
        if item.startswith("s3://") or (remote and item.startswith("file://")):
            local = Path(unquote(item.removeprefix("file://")))
            if item.startswith("file://") and local.is_file():
                check_rollout(local)   # readable here too: checked before any job
            uris.append(item)
        else:
            local = Path(unquote(item.removeprefix("file://"))) if item.startswith("file://") else Path(item)
            uris.append(_local_rollout(local, root, run_id, remote, taken))
    return uris


def build_spec(args: argparse.Namespace, uris: list[str]):
    A = messages("analysis")
    mode = args.mode or ("llm" if args.llm_url else "diagnostics")
    llm = None
    if mode == "llm":
        if not (args.llm_url and args.llm_model):
            raise UsageError("--mode llm needs --llm-url and --llm-model (the analyst's OpenAI-compatible endpoint)")
        llm = t.LlmEndpoint(base_url=args.llm_url, model=args.llm_model,
                            timeout_seconds=args.llm_timeout, max_concurrency=args.llm_concurrency)
    return A.AnalysisSpec(
        rollout_uris=uris, mode=A.ANALYST_MODE_LLM if mode == "llm" else A.ANALYST_MODE_DIAGNOSTICS, llm=llm,
        num_runs=args.runs, min_passing_runs=args.min_passing_runs, min_coverage=args.rho, min_gap=args.delta,
        max_candidates=args.max_candidates, seed=args.seed, trajectory_char_budget=args.budget)


def results_table(resp, num_runs: int) -> Table:
    A = messages("analysis")
    mode = A.AnalystMode.Name(resp.mode).removeprefix("ANALYST_MODE_").lower()
    table = Table(title=f"Capabilities (analyst mode: {mode})")
    table.add_column("capability", no_wrap=True)
    table.add_column("decision", no_wrap=True)
    for col in ("runs passed", "Cov mean±std", "Δ mean±std", "failed tasks"):
        table.add_column(col, justify="right")
    for r in resp.results:
        decision = "[green]retained[/]" if r.retained else f"rejected: {r.rejection_reason}"
        table.add_row(r.capability.name, decision, f"{r.passing_runs}/{num_runs}",
                      f"{r.coverage_mean:.2f}±{r.coverage_std:.2f}", f"{r.gap_mean:+.2f}±{r.gap_std:.2f}",
                      str(len(r.capability.failed_task_ids)))
    return table


def _s3_from_env() -> S3Settings | None:
    s = settings_class("analysis")()
    if not s.s3_endpoint:
        return None
    return S3Settings(endpoint=s.s3_endpoint, access_key=s.s3_access_key or "-",
                      secret_key=s.s3_secret_key or SecretStr(""), region=s.s3_region, secure=s.s3_secure)


def fetch_outputs(outputs, dest: Path) -> list[Path]:
    """Copy the job's outputs into `dest` (sha256-verified); files already there are kept."""
    written = []
    s3 = None
    for out in outputs:
        name = out.uri.rsplit("/", 1)[1]
        target = dest / name
        if out.uri.startswith("file://") and Path(out.uri.removeprefix("file://")).resolve() == target.resolve():
            written.append(target)
            continue
        if out.uri.startswith("s3://") and s3 is None:
            s3 = _s3_from_env()
            if s3 is None:
                raise FailedPrecondition(f"{out.uri}: set TRACE_ANALYSIS_S3_ENDPOINT, _S3_ACCESS_KEY and _S3_SECRET_KEY "
                                 "to download the report, or read it from the bucket directly")
        store, key = open_uri(out.uri, s3=s3 if out.uri.startswith("s3://") else None)
        dest.mkdir(parents=True, exist_ok=True)
        store.get_file(key, target)
        written.append(target)
    return written


def cmd_analyze(args: argparse.Namespace) -> int:
    A = messages("analysis")
    remote = "analysis" in parse_targets(args.target)
    # Piped output (logs, CI) gets a table wide enough for every column; a terminal its own width.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)
    try:
        build_spec(args, [])   # flag mistakes first: nothing is imported for a command that cannot run
        uris = rollout_uris(args.rollouts, args.root, args.run_id, remote)
        spec = build_spec(args, uris)
    except (UsageError, TraceError) as err:
        print(f"tracectl analyze: {err}", file=sys.stderr)
        return exits.for_error(err) if isinstance(err, TraceError) else exits.BAD_INPUT
    allow_from_command(args, "analysis", "cli-analyst", args.llm_url, args.llm_api_key_env)
    with Connection(args) as conn:
        st = conn.stub("analysis")
        try:
            job = st.CreateAnalysisJob(A.CreateAnalysisJobRequest(spec=spec, run_id=args.run_id,
                                                                  request_id=new_request_id())).job
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            print(f"tracectl analyze: INVALID_ARGUMENT: {with_flags(err.details() or '')}", file=sys.stderr)
            return exits.BAD_INPUT
        follow(lambda: st.WatchAnalysisJob(A.WatchAnalysisJobRequest(job_id=job.job_id)), f"analysis {job.job_id}")
        resp = st.GetAnalysisJob(A.GetAnalysisJobRequest(job_id=job.job_id))
    if resp.job.state != t.JOB_STATE_SUCCEEDED:
        print(f"analysis {job.job_id} {state_name(resp.job)}: {resp.job.error.code} {resp.job.error.message}",
              file=sys.stderr)
        return exits.CORRUPTED if resp.job.error.code == "DATA_LOSS" else exits.FAILED
    console.print(results_table(resp, args.runs or 10))
    retained = [r.capability.name for r in resp.results if r.retained]
    console.print(f"retained: [bold]{', '.join(retained) or 'none'}[/]")
    folder = Path("runs") / (args.run_id or "adhoc") / "analysis" / job.job_id
    if not remote:
        folder = args.root / (f"runs/{args.run_id}" if args.run_id else "") / "analysis" / job.job_id
    dest = args.out or folder
    try:
        files = fetch_outputs(resp.job.outputs, dest)
    except TraceError as err:
        print(f"tracectl analyze: could not fetch the report: {err}", file=sys.stderr)
        return exits.CORRUPTED if isinstance(err, ArtifactCorrupted) else exits.FAILED
    console.print(f"report: {dest / 'report.md'} ({len(files)} files in {dest})")
    return 0
