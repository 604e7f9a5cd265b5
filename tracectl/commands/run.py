"""`tracectl run --config FILE` (the whole loop) and `tracectl report RUN` (re-render the report).

Before any work, `run` checks the whole config: the file itself (a YAML mapping, UTF-8), every
section's fields (a typo gets the closest valid name), and, through the trainer, the GRPO configs
`training.grpo` and `gates.config` (Pipeline.check). `run --check` stops there; for a config that
deploys services or an S3 store it checks offline what it can and then what of the deployment is
reachable from here, listing the rest as skipped (tracectl/run/preflight.py). `run --plan` makes
the offline checks and then prints the episodes, tokens and GPU-hours the run would take
(tracectl/run/plan.py). A run's
manifest that fails its sha256 check or does not parse stops `run` and `report` with the way
out (delete it, or use another --run-id); a damaged artifact that the manifest names is reported
with the stage that wrote it (re-run it with --from). Exit statuses: tracectl/exits.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from trace_common.artifacts import open_store
from trace_common.errors import ArtifactCorrupted, InvalidArgument, TraceError
from trace_common.suggest import error_lines
from tracectl import exits
from tracectl.connect import Connection
from tracectl.embedded import EMBEDDED_ENDPOINTS, allow_data_from_command, allow_models_from_command
from tracectl.run.config import RunConfig, load_config
from tracectl.run.endpoints import run_endpoints
from tracectl.run.jobs import JobRunner, StageFailed
from tracectl.run.manifest import STAGES, Manifest
from tracectl.run.pipeline import Pipeline
from tracectl.run.results import StageOutcome

console = Console(stderr=True)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the whole TRACE loop from a config (resumes completed stages)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=exits.epilog(
                           0, 1, 2, 3, c0="done (--check: the config is valid offline and every reachable network check passed; "
                              "unreachable ones are listed as skipped; --plan: the plan is printed; nothing was run)",
                           c1="a stage failed or a service refused (the manifest records the stage; a re-run "
                              "resumes); --check: a reached store, service or endpoint failed its check",
                           c2="bad config, nothing started: unreadable, not a YAML mapping, or a wrong field "
                              "(named, with the closest valid name), GRPO configs included",
                           c3="the run's manifest.json is damaged (delete it, or use another --run-id), or an "
                              "artifact a stage wrote is (re-run that stage: --from STAGE); the message says "
                              "which"))
    p.add_argument("--config", type=Path, required=True, help="run config YAML, e.g. examples/demo.yaml")
    p.add_argument("--from", dest="from_stage", choices=STAGES, help="re-run from this stage on")
    p.add_argument("--until", choices=STAGES, help="stop after this stage")
    p.add_argument("--run-id", help="override the config's run_id")
    p.add_argument("--token", default=None, help="bearer token for deployed services ($TRACE_AUTH_TOKEN)")
    p.add_argument("--check", action="store_true", help="validate the config and exit without running anything: "
                   "offline (every section; GRPO configs and the target through services embedded here, the code "
                   "a deployed one runs), then what of the deployment is reachable (store, services' health, LLM "
                   "endpoints, the deployed services' own checks); an unreachable address is listed as skipped")
    p.add_argument("--plan", action="store_true", help="make --check's offline checks, then print the episodes, "
                   "tokens and GPU-hours each stage and arm will take (tracectl/run/plan.py); runs nothing")
    p.set_defaults(func=cmd_run)

    r = sub.add_parser("report", help="re-render a run's report from its manifest",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=exits.epilog(
                           0, 1, 2, 3, c1="no such run under the store root (no manifest.json)",
                           c2="bad --config, or the manifest's copy of the config does not validate",
                           c3="the run's manifest.json is damaged (delete it and re-run `tracectl run`), or an "
                              "artifact of the run is (re-run the stage that wrote it: --from STAGE); the "
                              "message says which"))
    r.add_argument("run_id")
    r.add_argument("--config", type=Path, help="the run's config: its store (s3:// too) and report settings "
                   "(default: --root and the config copy in the manifest)")
    r.add_argument("--root", default="file://./.trace", help="artifact store root (default file://./.trace)")
    r.set_defaults(func=cmd_report)


def _store(cfg: RunConfig):
    import os

    from pydantic import SecretStr

    from trace_common.artifacts import S3Settings
    from trace_common.config import ServiceSettings

    root = ServiceSettings(artifact_root=cfg.store.root, s3_endpoint=cfg.store.s3_endpoint).artifact_root
    s3 = None
    if root.startswith("s3://"):
        s3 = S3Settings(endpoint=cfg.store.s3_endpoint, access_key=os.environ.get(cfg.store.s3_access_key_env, ""),
                        secret_key=SecretStr(os.environ.get(cfg.store.s3_secret_key_env, "")),
                        secure=cfg.store.s3_secure)
    return root, open_store(root, s3)


def for_run_config(message: str) -> str:
    """A service's message as a run-config user needs it: the tau2 data directory is `target.uri`
    in a run config (`tracectl run` has no --data flag, unlike `tracectl tau2 replay-gold`)."""
    return message.replace("point --data or $TRACE_TAU2_DATA at",
                           "set target.uri in the run config (or $TRACE_TAU2_DATA where the rollout service runs) "
                           "to")


def with_rerun(message: str, manifest: Manifest, config: object) -> str:
    """A damaged artifact's message, plus the stage to re-run when the manifest says which wrote it."""
    stage = manifest.stage_naming(message)
    if stage is None:
        return message
    return f"{message}. Stage {stage} wrote it: re-run it with `tracectl run --config {config} --from {stage}`"


def cmd_run(args: argparse.Namespace) -> int:
    import os

    overrides = {"run_id": args.run_id} if args.run_id else None
    try:
        cfg = load_config(args.config, overrides)
        endpoints = run_endpoints(cfg)  # what the embedded services may call (tracectl is their operator)
    except TraceError as err:
        print(f"tracectl run: {err}", file=sys.stderr)
        return 2
    if args.check:
        return check_only(args, cfg, endpoints)
    if args.plan:
        return plan_only(args, cfg, endpoints)
    root, store = _store(cfg)
    manifest = Manifest.load(store, cfg.run_id) or Manifest(run_id=cfg.run_id)
    manifest.config = cfg.model_dump()
    conn_args = argparse.Namespace(target=[f"{k}={v}" for k, v in cfg.services.items()],
                                   token=args.token or os.environ.get("TRACE_AUTH_TOKEN"),
                                   root=Path(root.removeprefix("file://")) if root.startswith("file://") else Path(".trace"),
                                   root_flag="store.root")
    if not root.startswith("file://"):   # beside an s3:// store the embedded services keep their state in ./.trace
        conn_args.root_flag = "the embedded services' state directory"
        conn_args.root_fix = (f"Remove or rename {conn_args.root.resolve()}, or run tracectl from a directory where "
                              ".trace can be created")
    if root.startswith("s3://") and not cfg.services:
        # embedded services write to the same S3 store as the pipeline
        conn_args.overrides = {"artifact_root": root, "s3_endpoint": cfg.store.s3_endpoint,
                               "s3_access_key": os.environ.get(cfg.store.s3_access_key_env, ""),
                               "s3_secret_key": os.environ.get(cfg.store.s3_secret_key_env, ""),
                               "s3_secure": cfg.store.s3_secure}
    conn_args.overrides = {**getattr(conn_args, "overrides", {}), EMBEDDED_ENDPOINTS: endpoints}
    data = cfg.target.params.get("data") or cfg.target.uri.removeprefix("file://")
    if data:  # the target's data directory: the embedded rollout and environment services may read it
        allow_data_from_command(conn_args, data)
    if cfg.base_agent.backend == "in-process":  # a local base agent directory: the embedded services may load it
        allow_models_from_command(conn_args, cfg.base_agent.name)
    with Connection(conn_args) as conn:
        pipe = Pipeline(cfg, JobRunner(conn), store, manifest)
        try:  # before any work: nothing is created and no manifest is written when this fails
            pipe.check()
        except InvalidArgument as err:
            print(f"tracectl run: {args.config}: invalid run config: {err}", file=sys.stderr)
            return exits.BAD_INPUT
        console.print(f"[bold]TRACE run {cfg.run_id}[/] — artifacts in {escape(root)}/runs/{cfg.run_id}/")
        try:
            pipe.run(args.from_stage, args.until)
        except ArtifactCorrupted as err:   # an earlier stage's output is damaged: say which stage wrote it
            console.print(f"[red]run {cfg.run_id} stopped: {escape(with_rerun(str(err), manifest, args.config))}[/]")
            return exits.CORRUPTED
        except (StageFailed, TraceError) as err:
            console.print(f"[red]run {cfg.run_id} stopped: {escape(for_run_config(str(err)))}[/]")
            return exits.FAILED
        except grpc.RpcError as err:  # a service refused a stage's request (recorded in the manifest)
            console.print(f"[red]run {cfg.run_id} stopped: {err.code().name}: "
                          f"{escape(for_run_config(err.details() or ''))}[/]")
            return exits.FAILED
    rep = manifest.stages["report"]
    if rep.status == "completed":
        console.print(f"report: {rep.outputs.get('markdown')}\n        {rep.outputs.get('html')}")
    return 0


def check_only(args: argparse.Namespace, cfg: RunConfig, endpoints) -> int:
    """`run --check`: offline checks, then whatever of the deployment is reachable (tracectl/run/preflight.py)."""
    import os

    from tracectl.run.preflight import exit_code, preflight

    data = cfg.target.params.get("data") or cfg.target.uri.removeprefix("file://")
    try:
        found = preflight(cfg, endpoints, token=args.token or os.environ.get("TRACE_AUTH_TOKEN"),
                          open_run_store=_store, data_dirs=[data] if data else [])
    except InvalidArgument as err:
        print(f"tracectl run: {args.config}: invalid run config: {err}", file=sys.stderr)
        return exits.BAD_INPUT
    print("\n".join(found.lines(args.config)))
    return exit_code(found)


def plan_only(args: argparse.Namespace, cfg: RunConfig, endpoints) -> int:
    """`run --plan`: the offline checks of --check, then the plan (tracectl/run/plan.py)."""
    from tracectl.run.plan import plan_command

    data = cfg.target.params.get("data") or cfg.target.uri.removeprefix("file://")
    try:
        plan_command(cfg, endpoints, data_dirs=[data] if data else [], config=args.config)
    except InvalidArgument as err:
        print(f"tracectl run --plan: {args.config}: {err}", file=sys.stderr)   # names the field or variable
        return exits.BAD_INPUT
    return exits.OK


def cmd_report(args: argparse.Namespace) -> int:
    from trace_common.config import ServiceSettings
    from tracectl.run.report import write_report

    cfg = load_config(args.config) if args.config else None
    if cfg is not None:  # the run's own store (s3:// with its credentials, or a file root)
        root, store = _store(cfg)
    else:
        try:
            root = ServiceSettings(artifact_root=args.root).artifact_root
        except ValidationError as err:
            raise InvalidArgument(field="--root", expected="file:///dir, file://./dir or s3://bucket (give --config "
                                  "for an s3:// store: it names the endpoint and credentials)", got=args.root) from err
        store = open_store(root)
    manifest = Manifest.load(store, args.run_id)
    if manifest is None:
        print(f"tracectl report: no run {args.run_id!r} under {root} (no runs/{args.run_id}/manifest.json)",
              file=sys.stderr)
        return 1
    if cfg is None:
        try:
            cfg = RunConfig.model_validate(manifest.config)
        except ValidationError as err:
            raise InvalidArgument(f"run {args.run_id!r}: the manifest's copy of its config does not validate "
                                  f"({'; '.join(error_lines(err, RunConfig, limit=3))}); give the run's config "
                                  "with --config") from None
    try:
        out = write_report(cfg, manifest, store)
    except ArtifactCorrupted as err:
        raise ArtifactCorrupted(with_rerun(str(err), manifest, args.config or "RUN.yaml")) from None
    for name, uri in StageOutcome.model_validate(out).outputs.items():
        print(f"{name}: {uri}")
    return 0
