"""`tracectl train`: train a capability adapter with GRPO and follow it with a progress bar.

    tracectl train --capability precondition_verification --env store \\
        --env-param task_types=precondition_check --model micro --set max_steps=50 --set learning_rate=2e-4
    tracectl train --watch JOB_ID | --cancel JOB_ID | --checkpoints JOB_ID | --list

Hyper-parameters are GRPO config fields (TRL names, see services/trainer/grpo/config.py), given
with `--set key=value` (values parsed as JSON when they are JSON, else as strings) and/or a
JSON file (`--config`). The bar shows iterations done of max_steps with the last iteration's
mean reward, pass rate and informative-group fraction; the job's adapter URI is printed at
the end. A `--config` file that is unreadable, not UTF-8, not JSON or not a JSON object, and a
`--set` without '=', are refused before anything starts. Exit status: 0 when the job SUCCEEDED,
1 otherwise, 2 bad input (a flag, the --config file, or a config the trainer refused, the
field named with the closest valid name) -- tracectl/exits.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from google.protobuf.struct_pb2 import Struct
from rich.console import Console

from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl import exits
from tracectl.commands.rollout import environment_ref
from tracectl.connect import Connection, add_connection_args
from tracectl.embedded import allow_data_from_command, allow_models_from_command
from tracectl.inputs import read_json
from tracectl.progress import follow, state_name

EXECUTORS = {"local": 1, "kubernetes": 2}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a capability adapter with GRPO (progress bar)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog(0, 1, 2, c0="the job SUCCEEDED (or --list/--cancel/--checkpoints/--detach "
                                           "answered)", c1="the job did not succeed, or the trainer refused",
                                           c2="bad input, nothing started: a flag, the --config file, or a config "
                                              "field the trainer refused (named, with the closest valid name)"))
    p.add_argument("--capability", default="", help="capability name (snake_case), e.g. precondition_verification")
    p.add_argument("--env", default="store", help="environment name or tau2 data directory (default: store)")
    p.add_argument("--env-param", action="append", default=[], metavar="KEY=VALUE",
                   help="environment parameter (repeatable), e.g. task_types=precondition_check")
    p.add_argument("--model", default="micro", help="base model: built-in agent, model dir or artifact URI")
    p.add_argument("--adapter", default="", help="PEFT adapter URI merged into the base before training")
    p.add_argument("--config", type=Path, help="JSON file of GRPO config fields")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="GRPO config field (repeatable)")
    p.add_argument("--executor", choices=sorted(EXECUTORS), default="local")
    p.add_argument("--resume-from", default="", help="checkpoint URI to resume from (ListCheckpoints)")
    p.add_argument("--run-id", default="")
    p.add_argument("--detach", action="store_true", help="print the job id and return without following")
    p.add_argument("--watch", metavar="JOB_ID", help="follow an existing job")
    p.add_argument("--cancel", metavar="JOB_ID", help="cancel a job")
    p.add_argument("--checkpoints", metavar="JOB_ID", help="list a job's checkpoints")
    p.add_argument("--list", action="store_true", help="list training jobs")
    add_connection_args(p)
    p.set_defaults(func=cmd_train)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def config_struct(args: argparse.Namespace) -> Struct:
    values: dict = {}
    if args.config:
        values.update(read_json(args.config, "--config", dict, fix='give a JSON object of GRPO config fields, '
                                'e.g. {"max_steps": 50, "learning_rate": 0.0002}'))
    for item in args.set:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(field="--set", expected="KEY=VALUE", got=item, fix="e.g. --set max_steps=50")
        values[key] = _value(val)
    s = Struct()
    s.update(values)
    return s


def build_spec(args: argparse.Namespace):
    T = messages("trainer")
    if not args.capability:
        raise InvalidArgument(field="--capability", expected="a capability name to start a training job",
                              fix="e.g. --capability precondition_verification (or --watch/--list/--cancel)")
    env = environment_ref(args.env)
    for item in args.env_param:
        key, sep, val = item.partition("=")
        if not sep:
            raise InvalidArgument(field="--env-param", expected="KEY=VALUE", got=item,
                                  fix="e.g. --env-param task_types=precondition_check")
        env.params[key] = val
    return T.TrainingSpec(kind=T.TRAINING_KIND_ADAPTER, capability=args.capability, environments=[env],
                          policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model=args.model,
                                             adapter_uri=args.adapter),
                          config=t.Config(values=config_struct(args)), executor=EXECUTORS[args.executor],
                          resume_from_uri=args.resume_from)


def follow_training(stub, job_id: str, console: Console):
    """Watch until the job ends (re-watching past a stream deadline), a line per iteration with its
    reward; returns the final Job."""
    T = messages("trainer")
    return follow(lambda: stub.WatchTrainingJob(T.WatchTrainingJobRequest(job_id=job_id)), f"train {job_id}",
                  console, describe=_iteration_line)


def _iteration_line(msg) -> tuple[str, str]:
    job = msg.job
    stage = state_name(job).lower() if job.state != t.JOB_STATE_RUNNING else job.progress.stage
    if not msg.HasField("iteration"):
        return stage, ""
    v = msg.iteration.values
    return stage, (f"reward {v.get('reward_mean', 0):.3f}  pass {v.get('pass_rate', 0):.2f}  "
                   f"informative {v.get('informative_group_fraction', 0):.2f}  {v.get('step_seconds', 0):.1f}s/it")


def cmd_train(args: argparse.Namespace) -> int:
    T = messages("trainer")
    console = Console(stderr=True, soft_wrap=True)
    creates = not (args.list or args.cancel or args.checkpoints or args.watch)
    spec = build_spec(args) if creates else None   # bad input is refused before any service starts
    if creates:  # a local --model / --adapter directory: the embedded trainer may load it
        allow_models_from_command(args, args.model, args.adapter)
        env = spec.environments[0]
        data = env.params.get("data") or env.uri.removeprefix("file://")
        if data:  # a tau2 --env directory (or --env-param data=DIR): the embedded trainer may read it
            allow_data_from_command(args, data)
    with Connection(args) as conn:
        st = conn.stub("trainer")
        if args.list:
            for job in st.ListTrainingJobs(T.ListTrainingJobsRequest()).jobs:
                print(f"{job.job_id}\t{state_name(job)}\t{job.progress.completed}/{job.progress.total}\t"
                      f"{job.labels.get('capability', '')}{job.progress.message}")
            return 0
        if args.cancel:
            job = st.CancelTrainingJob(T.CancelTrainingJobRequest(job_id=args.cancel)).job
            print(f"{job.job_id} {state_name(job)}")
            return 0
        if args.checkpoints:
            for c in st.ListCheckpoints(T.ListCheckpointsRequest(job_id=args.checkpoints)).checkpoints:
                print(f"{c.iteration}\t{c.artifact.uri}")
            return 0
        if args.watch:
            job_id = args.watch
        else:
            job = st.CreateTrainingJob(T.CreateTrainingJobRequest(
                spec=spec, run_id=args.run_id, labels={"capability": args.capability},
                request_id=new_request_id())).job
            job_id = job.job_id
            if args.detach:
                print(job_id)
                return 0
        final = follow_training(st, job_id, console)
        resp = st.GetTrainingJob(T.GetTrainingJobRequest(job_id=job_id))
    job = resp.job
    if job.state != t.JOB_STATE_SUCCEEDED:
        print(f"train {job_id} {state_name(job)}: {job.error.code} {job.error.message or job.progress.message}",
              file=sys.stderr)
        return 1
    console.print(f"train {job_id} SUCCEEDED after {job.progress.completed} iterations "
                  f"({final.progress.message if final else ''})")
    for out in job.outputs:
        print(f"{out.kind}\t{out.uri}")
    return 0
