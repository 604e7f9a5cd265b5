"""`tracectl envs`: list capability environments with their validation summary; generate new ones.

  tracectl envs [list] [--capability C] [--all]     registered environments (accepted; --all adds rejected)
  tracectl envs show NAME [--version N]             one record, its tools and failed checks
  tracectl envs generate --capability C [...] [--env store|DIR] [--mode library|llm]
                         [--llm-base-url URL --llm-model M] [--run-id R] [--max-retries N]
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl import exits
from tracectl.connect import Connection, add_connection_args
from tracectl.embedded import allow_from_command
from tracectl.inputs import default_or_count, seed_int
from tracectl.progress import follow, state_name

MODES = {"library": 1, "llm": 2}
STATUS = {0: "?", 1: "ACCEPTED", 2: "REJECTED"}
MODE_NAMES = {0: "?", 1: "library", 2: "llm"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("envs", help="list / show / generate capability environments (validation summary)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog(0, 1, 2, 4, c1="the generation job did not succeed, or the service "
                                           "refused (e.g. show: no such environment)",
                                           c2="bad input, nothing started: a flag, a tau2 --env directory whose "
                                              "task files are unreadable or malformed, or a spec the service "
                                              "refused"))
    p.add_argument("action", nargs="?", choices=("list", "show", "generate"), default="list")
    p.add_argument("name", nargs="?", default="", help="environment name (show)")
    p.add_argument("--version", default="", help="registry version for show (default: latest accepted)")
    p.add_argument("--capability", action="append", default=[],
                   help="list: only this capability; generate: a capability to generate (repeatable)")
    p.add_argument("--all", action="store_true", help="list: include rejected candidates")
    p.add_argument("--env", default="store", help="generate: the target environment (a registered name or a tau2 "
                   "data directory), as in tracectl rollout")
    p.add_argument("--mode", choices=sorted(MODES), default="library", help="generate: library or llm")
    p.add_argument("--llm-base-url", default="", help="generate --mode llm: OpenAI-compatible base URL")
    p.add_argument("--llm-model", default="", help="generate --mode llm: model name")
    p.add_argument("--llm-api-key-env", default="", help="generate --mode llm: env var (of this process) holding "
                   "the API key, for the embedded service; a deployed one uses its endpoint profile's key")
    p.add_argument("--max-retries", type=default_or_count, default=0, help="generate: feedback rounds (0: service default)")
    p.add_argument("--run-id", default="")
    p.add_argument("--seed", type=seed_int, default=0)
    add_connection_args(p)
    p.set_defaults(func=cmd_envs)


def cmd_envs(args: argparse.Namespace) -> int:
    if args.action == "show":
        if not args.name:
            print("tracectl envs show: give an environment NAME", file=sys.stderr)
            return 2
        return cmd_show(args)
    if args.action == "generate":
        if not args.capability:
            print("tracectl envs generate: give at least one --capability", file=sys.stderr)
            return 2
        return cmd_generate(args)
    if len(args.capability) > 1:
        print("tracectl envs list: give at most one --capability", file=sys.stderr)
        return 2
    return cmd_list(args)


def _target_ref(target: str) -> t.EnvironmentRef:
    from tracectl.commands.rollout import environment_ref

    return environment_ref(target)


def _table(records) -> Table:
    table = Table(show_lines=False)
    for col in ("name", "version", "mode", "status", "base mean", "informative", "reasons / code"):
        table.add_column(col)
    for r in records:
        detail = "; ".join(r.rejection_reasons)[:160] if r.rejection_reasons else r.code.uri
        table.add_row(r.name, r.version, MODE_NAMES.get(r.mode, "?"), STATUS.get(r.status, "?"),
                      f"{r.calibration_reward_mean:.2f}", f"{r.calibration_informative_fraction:.0%}", detail)
    return table


def cmd_list(args: argparse.Namespace) -> int:
    E = messages("environment")
    with Connection(args) as conn:
        resp = conn.stub("environment").ListEnvironments(
            E.ListEnvironmentsRequest(capability=(args.capability or [""])[0], include_rejected=args.all))
    console = Console(soft_wrap=True)
    if not resp.environments:
        console.print("no environments registered" + (" (accepted); try --all" if not args.all else ""))
        return 0
    console.print(_table(resp.environments))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    E = messages("environment")
    with Connection(args) as conn:
        resp = conn.stub("environment").GetEnvironment(E.GetEnvironmentRequest(name=args.name, version=args.version))
    console = Console(soft_wrap=True)
    console.print(_table([resp.environment]))
    console.print(f"validation report: {resp.environment.validation_report.uri}")
    console.print("tools: " + ", ".join(json.loads(s.json)["function"]["name"] for s in resp.tools))
    for reason in resp.environment.rejection_reasons:
        console.print(f"  - {reason}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    E = messages("environment")
    spec = E.GenerationSpec(capabilities=[t.Capability(name=c) for c in args.capability],
                            target=_target_ref(args.env), mode=MODES[args.mode], max_retries=args.max_retries,
                            seed=args.seed)
    if args.mode == "llm":
        if not (args.llm_base_url and args.llm_model):
            print("tracectl envs generate: --mode llm needs --llm-base-url and --llm-model", file=sys.stderr)
            return 2
        spec.llm.CopyFrom(t.LlmEndpoint(base_url=args.llm_base_url, model=args.llm_model))
        allow_from_command(args, "environment", "cli-generator", args.llm_base_url, args.llm_api_key_env)
    console = Console(soft_wrap=True)
    with Connection(args) as conn:
        st = conn.stub("environment")
        job = st.CreateGenerationJob(E.CreateGenerationJobRequest(spec=spec, run_id=args.run_id,
                                                                  request_id=new_request_id())).job
        follow(lambda: st.WatchGenerationJob(E.WatchGenerationJobRequest(job_id=job.job_id)), f"envs {job.job_id}")
        resp = st.GetGenerationJob(E.GetGenerationJobRequest(job_id=job.job_id))
    if resp.environments:
        console.print(_table(resp.environments))
    if resp.job.state != t.JOB_STATE_SUCCEEDED:
        print(f"generation {job.job_id} {state_name(resp.job)}: {resp.job.error.code} {resp.job.error.message}",
              file=sys.stderr)
        return 1
    return 0 if all(r.status == 1 for r in resp.environments) else 4
