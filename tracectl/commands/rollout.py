"""`tracectl rollout`: play a batch of tasks with a policy and print the pass rate (95 % CI)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl import exits
from tracectl.connect import Connection, add_connection_args
from tracectl.embedded import allow_data_from_command, allow_from_command, allow_models_from_command
from tracectl.inputs import DATA_MAX_BYTES, default_or_count, int_flag, positive_int, read_json, seed_int
from tracectl.progress import follow, state_name

BACKENDS = {"scripted": t.POLICY_BACKEND_SCRIPTED, "in-process": t.POLICY_BACKEND_IN_PROCESS,
            "http": t.POLICY_BACKEND_OPENAI_HTTP}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="play tasks with a policy; print pass rate with a 95%% interval",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog(0, 1, 2, c1="the rollout job did not succeed, or the service refused",
                                           c2="bad input, nothing started: a flag, a tau2 --env directory whose "
                                              "tasks.json / split_tasks.json is unreadable or not JSON of the "
                                              "right shape, or a spec the service refused"))
    p.add_argument("--env", default="store", help="environment name, or a tau2 data directory (default: store)")
    p.add_argument("--split", default="test", help="task split (default: test)")
    p.add_argument("--limit", type=int_flag(0, meaning="0: all"), default=0, help="at most this many tasks (0 = all)")
    p.add_argument("--tasks", default="", help="comma-separated task ids instead of a split")
    p.add_argument("--samples", type=positive_int, default=1, help="samples per task (at least 1)")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="in-process", help="policy backend")
    p.add_argument("--model", default="micro", help="model dir / built-in agent / served name / scripted policy")
    p.add_argument("--adapter", default="", help="PEFT adapter URI (in-process) or served adapter name (http)")
    p.add_argument("--endpoint", default="", help="OpenAI-compatible base URL (http backend)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--concurrency", type=default_or_count, default=0, help="episodes at once (0: the service's default)")
    p.add_argument("--max-turns", type=default_or_count, default=0, help="turns per episode (0: the environment's default)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--run-id", default="")
    add_connection_args(p)
    p.set_defaults(func=cmd_rollout)


def environment_ref(env: str) -> t.EnvironmentRef:
    """`--env`: a registered environment name, or a tau2 data directory (its task files are checked
    here, so a damaged one is refused in one line before any job starts)."""
    path = Path(env)
    if "/" in env or path.is_dir():
        if not (path / "tasks.json").is_file():
            raise InvalidArgument(field="--env", expected="a registered environment name or a tau2 data directory "
                                  "(holding tasks.json)", got=env, fix="e.g. --env store or --env $TRACE_TAU2_DATA/retail")
        fix = "restore the file from tau2-bench"
        read_json(path / "tasks.json", "--env", list, fix=fix, max_bytes=DATA_MAX_BYTES)
        if (path / "split_tasks.json").is_file():
            read_json(path / "split_tasks.json", "--env", dict, fix=fix)
        return t.EnvironmentRef(name=f"tau2-{path.resolve().name}", uri=path.resolve().as_uri())
    return t.EnvironmentRef(name=env)


def cmd_rollout(args: argparse.Namespace) -> int:
    R = messages("rollout")
    adapter_kw = {"adapter_name": args.adapter} if args.backend == "http" else {"adapter_uri": args.adapter}
    spec = R.RolloutSpec(
        environment=environment_ref(args.env),
        policy=t.PolicyRef(backend=BACKENDS[args.backend], model=args.model, endpoint=args.endpoint, **adapter_kw),
        tasks=R.TaskSelection(split=args.split, limit=args.limit,
                              task_ids=[x for x in args.tasks.split(",") if x]),
        samples_per_task=args.samples, concurrency=args.concurrency, max_turns=args.max_turns, seed=args.seed,
        sampling=t.SamplingParams(temperature=args.temperature))
    console = Console(soft_wrap=True)
    allow_from_command(args, "rollout", "cli-policy", args.endpoint)
    if args.backend == "in-process":  # a local --model / --adapter directory: the embedded service may load it
        allow_models_from_command(args, args.model, args.adapter)
    if spec.environment.uri:  # a tau2 --env directory: the embedded service may read it
        allow_data_from_command(args, spec.environment.uri.removeprefix("file://"))
    with Connection(args) as conn:
        st = conn.stub("rollout")
        job = st.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id=args.run_id,
                                                            request_id=new_request_id())).job
        final = follow(lambda: st.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id)),
                       f"rollout {job.job_id}")
        resp = st.GetRolloutJob(R.GetRolloutJobRequest(job_id=job.job_id))
    if final is None or resp.job.state != t.JOB_STATE_SUCCEEDED:
        print(f"rollout {job.job_id} {state_name(resp.job)}: {resp.job.error.code} {resp.job.error.message}",
              file=sys.stderr)
        return 1
    s = resp.summary
    console.print(f"pass rate [bold]{s.pass_rate:.3f}[/] (95% CI {s.pass_rate_ci_low:.3f}-{s.pass_rate_ci_high:.3f})"
                  f" over {s.episodes} episodes; mean reward {s.reward_mean:.3f}; errored {s.errored_episodes}")
    for out in resp.job.outputs:
        console.print(f"  {out.kind}: {out.uri}")
    return 0
