"""`tracectl run --config FILE` (the whole loop) and `tracectl report RUN` (re-render the report)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from trace_common.artifacts import open_store
from trace_common.errors import TraceError
from tracectl.connect import Connection
from tracectl.run.config import RunConfig, load_config
from tracectl.run.jobs import JobRunner, StageFailed
from tracectl.run.manifest import STAGES, Manifest
from tracectl.run.pipeline import Pipeline

console = Console(stderr=True)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the whole TRACE loop from a config (resumes completed stages)")
    p.add_argument("--config", type=Path, required=True, help="run config YAML, e.g. examples/demo.yaml")
    p.add_argument("--from", dest="from_stage", choices=STAGES, help="re-run from this stage on")
    p.add_argument("--until", choices=STAGES, help="stop after this stage")
    p.add_argument("--run-id", help="override the config's run_id")
    p.add_argument("--token", default=None, help="bearer token for deployed services ($TRACE_AUTH_TOKEN)")
    p.set_defaults(func=cmd_run)

    r = sub.add_parser("report", help="re-render a run's report from its manifest")
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


def cmd_run(args: argparse.Namespace) -> int:
    import os

    overrides = {"run_id": args.run_id} if args.run_id else None
    try:
        cfg = load_config(args.config, overrides)
    except TraceError as err:
        print(f"tracectl run: {err}", file=sys.stderr)
        return 2
    root, store = _store(cfg)
    manifest = Manifest.load(store, cfg.run_id) or Manifest(run_id=cfg.run_id)
    manifest.config = cfg.model_dump()
    conn_args = argparse.Namespace(target=[f"{k}={v}" for k, v in cfg.services.items()],
                                   token=args.token or os.environ.get("TRACE_AUTH_TOKEN"),
                                   root=Path(root.removeprefix("file://")) if root.startswith("file://") else Path(".trace"))
    if root.startswith("s3://") and not cfg.services:
        # embedded services write to the same S3 store as the pipeline
        conn_args.overrides = {"artifact_root": root, "s3_endpoint": cfg.store.s3_endpoint,
                               "s3_access_key": os.environ.get(cfg.store.s3_access_key_env, ""),
                               "s3_secret_key": os.environ.get(cfg.store.s3_secret_key_env, ""),
                               "s3_secure": cfg.store.s3_secure}
    console.print(f"[bold]TRACE run {cfg.run_id}[/] — artifacts in {root}/runs/{cfg.run_id}/")
    with Connection(conn_args) as conn:
        pipe = Pipeline(cfg, JobRunner(conn), store, manifest)
        try:
            pipe.run(args.from_stage, args.until)
        except (StageFailed, TraceError) as err:
            console.print(f"[red]run {cfg.run_id} stopped: {err}[/]")
            return 1
    rep = manifest.stages["report"]
    if rep.status == "completed":
        console.print(f"report: {rep.outputs.get('markdown')}\n        {rep.outputs.get('html')}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from trace_common.config import ServiceSettings
    from tracectl.run.report import write_report

    cfg = load_config(args.config) if args.config else None
    if cfg is not None:  # the run's own store (s3:// with its credentials, or a file root)
        root, store = _store(cfg)
    else:
        root = ServiceSettings(artifact_root=args.root).artifact_root
        store = open_store(root)
    manifest = Manifest.load(store, args.run_id)
    if manifest is None:
        print(f"tracectl report: no run {args.run_id!r} under {root} (no runs/{args.run_id}/manifest.json)",
              file=sys.stderr)
        return 1
    cfg = cfg or RunConfig.model_validate(manifest.config)
    out = write_report(cfg, manifest, store)
    for name, uri in out["outputs"].items():
        print(f"{name}: {uri}")
    return 0
