"""Rollout service overhead: the same episodes played through the rollout service over gRPC vs a
direct in-process asyncio loop.

Both sides play the same N episodes of the built-in `store` domain (tasks = the first N seeds of
its `test` split, one sample each) with the same fake policy: the rollout service's SCRIPTED
backend `expert:perfect@20ms` (services/rollout/policies.py), i.e. the scripted store expert's
action after a 20 ms `asyncio.sleep` per turn, standing in for a model call. The policy costs
the same on both sides, so the difference is what the service adds.

  * service (TRACE side): `CreateRolloutJob`, then `WatchRolloutJob` until the job ends. The
    time covers job creation, planning, episode playing under the job's concurrency limit,
    metrics, and publishing trajectories.jsonl + summary.json to the file:// artifact store.
    Two ways to run the service (`--stack`, both by default):
      - `process`: `python -m services.rollout` as its own process, as it is deployed; the bench
        process is only its gRPC client. The target is judged on these rows.
      - `embedded`: the embedded stack (all five services in the bench's own process on a
        background thread, `tracectl.embedded.BackgroundStack`), as `tracectl run` uses it. The
        episode loop then shares one interpreter lock with the bench's gRPC client and the other
        four servers.
  * direct (peer): the loop a script would write without the service -- `run_episode_async`
    (the SDK's episode driver) for each seed under an `asyncio.Semaphore(concurrency)`, on a
    fresh `asyncio.run` -- which then saves its trajectories as a script must to use them:
    `write_jsonl` to a local file, the same JSONL the service publishes. The target is judged
    against this peer: serialising the trajectories is output any rollout pays, not service
    overhead (it is ~0.1 ms of CPU per episode here, ~4 % of the CPU-bound loop at
    concurrency 64).
  * direct, in memory (shown beside it): the same loop keeping trajectories in memory only,
    so the table also shows what producing the artifact costs.

Rows: concurrency 1, 16 and 64 (`--concurrency`). Each row plays `--tasks` tasks x S samples,
S = ceil(`--waves` x concurrency / tasks), so every row is at least `--waves` full waves of
concurrent episodes: a job the size of one wave would measure the job's fixed start/publish
cost, not the per-turn loop the target is about. Reported: episodes/s of each side (medians of
interleaved repetitions after one warm-up run of each, bench/harness.py), the ratio
service/direct throughput and the overhead service time / direct time - 1.
Target (issue #3): overhead <= 5 % of turn time at every concurrency, i.e. ratio >= 1/1.05.
At concurrency 64 the loop is CPU-bound on a 2-core machine (episodes wait for the
interpreter, not for the 20 ms policy), so there the ratio compares CPU per episode.

    .venv/bin/python -m bench.rollout_overhead [--tasks 64] [--waves 4] [--reps 5] [--concurrency 1 16 64]
        [--stack process embedded] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from bench.harness import Case, Row, command_line, run_case, write_section
from bench.harness import machine as machine_info
from services.rollout.policies import ScriptedFactory
from services.rollout.runner import sampling_seed
from trace_common.env import get_spec, run_episode_async, write_jsonl
from trace_common.grpc.client import Endpoint, messages, open_channel
from trace_common.grpc.client import stub as make_stub
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.embedded import BackgroundStack

MAX_OVERHEAD = 0.05
TARGET = 1 / (1 + MAX_OVERHEAD)  # throughput ratio service/direct
POLICY = "expert:perfect@20ms"
R = messages("rollout")


def seeds(n: int) -> list[int]:
    split = get_spec("store").factory().splits()["test"]
    return list(split[:n])


def direct(task_seeds: list[int], samples: int, concurrency: int, out: Path | None = None) -> list[float]:
    """Play the episodes with the SDK driver on a fresh loop, save them to `out` as JSONL
    (None: keep them in memory); returns their rewards."""
    spec = get_spec("store")

    async def main() -> list[float]:
        factory = ScriptedFactory(POLICY, "store")
        sem = asyncio.Semaphore(concurrency)

        async def one(seed: int, k: int) -> float:
            async with sem:
                env = spec.factory()
                policy = factory.for_episode(env, seed, k, sampling_seed(0, seed, k))
                return await run_episode_async(env, policy, seed, policy=factory.info, sample_index=k)

        try:
            trajs = await asyncio.gather(*(one(s, k) for s in task_seeds for k in range(samples)))
        finally:
            await factory.close()
        if out is not None:
            write_jsonl(trajs, out)
        return [t.reward for t in trajs]

    return asyncio.run(main())


@contextmanager
def rollout_stub(stack: str, root: Path):
    """A rollout stub: `python -m services.rollout` in its own process, or the embedded stack."""
    if stack == "embedded":
        with BackgroundStack(root) as s:
            yield s.stub("rollout")
        return
    # ports 0: the service picks free ones and prints them on its "ready:" line (services/launch.py)
    env = dict(os.environ, TRACE_ROLLOUT_HOST="127.0.0.1", TRACE_ROLLOUT_PORT="0", TRACE_ROLLOUT_METRICS_PORT="0",
               TRACE_ROLLOUT_ARTIFACT_ROOT=root.resolve().as_uri(), TRACE_ROLLOUT_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "services.rollout"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        while "ready:" not in (line := proc.stdout.readline()):
            if not line and proc.poll() is not None:
                raise RuntimeError(f"the rollout service exited with {proc.returncode} before it was ready")
        with open_channel(Endpoint(line.split("grpc=")[1].split()[0], None)) as channel:
            yield make_stub("rollout", channel)
    finally:
        proc.terminate()
        proc.wait(30)


def service(stub, tasks: int, samples: int, concurrency: int) -> float:
    """One rollout job of the same episodes; returns its mean reward."""
    n = tasks * samples
    spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model=POLICY),
                         tasks=R.TaskSelection(split="test", limit=tasks), samples_per_task=samples,
                         concurrency=concurrency)
    job = stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id="bench")).job
    final = [m.job for m in stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job.job_id), timeout=900)][-1]
    if final.state != t.JOB_STATE_SUCCEEDED:
        raise RuntimeError(f"rollout job {job.job_id} ended {t.JobState.Name(final.state)}: {final.error.message}")
    resp = stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=job.job_id))
    if resp.summary.episodes != n:
        raise RuntimeError(f"job played {resp.summary.episodes} episodes, expected {n}")
    return resp.summary.reward_mean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=64, help="tasks per run (first seeds of the test split)")
    parser.add_argument("--waves", type=int, default=4, help="minimum full waves of concurrent episodes per run")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions per concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--stack", nargs="+", choices=["process", "embedded"], default=["process", "embedded"],
                        help="how the service runs (module docstring)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update bench/RESULTS.md")
    args = parser.parse_args(argv)

    task_seeds = seeds(args.tasks)
    rows: list[tuple[str, int, int, Row]] = []
    for mode in args.stack:
        with tempfile.TemporaryDirectory(prefix="trace-bench-rollout-") as root, \
                rollout_stub(mode, Path(root)) as stub:
            # same outcome on both sides (the perfect expert solves every task): the work is the same
            want = statistics.fmean(direct(task_seeds, 2, 16))
            got = service(stub, args.tasks, 2, 16)
            if abs(want - got) > 1e-9:
                raise RuntimeError(f"service mean reward {got} != direct {want}: the sides play different episodes")
            out = Path(root) / "direct.jsonl"
            for c in args.concurrency:
                samples = -(-args.waves * c // args.tasks)
                n = args.tasks * samples
                row = run_case(Case(op=f"{mode} concurrency {c}", nbytes=n, reps=args.reps, warmup=1,
                                    trace=lambda c=c, s=samples: service(stub, args.tasks, s, c),
                                    peer=lambda c=c, s=samples, out=out: direct(task_seeds, s, c, out)))
                mem = run_case(Case(op=f"{mode} concurrency {c} (in memory)", nbytes=n, reps=args.reps, warmup=0,
                                    trace=lambda c=c, s=samples: service(stub, args.tasks, s, c),
                                    peer=lambda c=c, s=samples: direct(task_seeds, s, c)))
                rows.append((mode, c, n, row, mem))
                print(f"{mode:8s} concurrency {c:3d}: {n} episodes  service {n / row.trace_median:7.2f} eps/s  "
                      f"direct {n / row.peer_median:7.2f} eps/s  ratio {row.ratio:.3f} "
                      f"(paired {row.pair_ratio:.3f}); in memory {n / mem.peer_median:7.2f} eps/s  ratio "
                      f"{mem.ratio:.3f}", flush=True)

    # The target is about the service as deployed (its own process); embedded rows are shown beside it.
    judged = "process" if "process" in args.stack else "embedded"
    worst = min(r.ratio for mode, _, _, r, _ in rows if mode == judged)
    lines = [
        "## Rollout service overhead (bench/rollout_overhead.py)",
        "",
        f"- command: `{command_line('bench.rollout_overhead')}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine_info()}; load average (1/5/15 min) at the end: "
        + "/".join(f"{x:.1f}" for x in os.getloadavg()),
        f"- work: the first {args.tasks} seeds of the built-in store domain's test split x enough samples for "
        f"{args.waves} full waves of concurrent episodes; policy SCRIPTED `{POLICY}` (scripted expert + 20 ms "
        "sleep per turn) on both sides",
        "- TRACE side: a rollout job over gRPC (loopback), create -> watch until done, trajectories published "
        "to the file:// store; stack `process` = `python -m services.rollout` as its own process (as deployed), "
        "`embedded` = all five services inside the bench process (as `tracectl run` uses them)",
        "- peer: a direct asyncio loop over `run_episode_async` with the same policy (no service) that saves its "
        "trajectories with `write_jsonl` to a local file (the JSONL the service publishes); the same loop keeping "
        "them in memory only is shown beside it (`in-memory` columns: what producing the artifact costs)",
        f"- target: overhead (service time / direct time - 1) <= {MAX_OVERHEAD:.0%} at every concurrency, "
        f"i.e. throughput ratio >= {TARGET:.3f} (medians of {args.reps} interleaved repetitions)",
        "",
        "| stack | concurrency | episodes | service eps/s | direct eps/s | ratio | overhead | paired ratio "
        "| spread S / D | target | in-memory direct eps/s | in-memory ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for mode, c, n, r, mem in rows:
        ok = "ok" if r.ratio >= TARGET else "**MISS**"
        lines.append(f"| {mode} | {c} | {n} | {n / r.trace_median:.2f} | {n / r.peer_median:.2f} | {r.ratio:.3f} | "
                     f"{1 / r.ratio - 1:+.1%} | {r.pair_ratio:.3f} | "
                     f"{Row.spread(r.trace_s):.0%} / {Row.spread(r.peer_s):.0%} | {ok} | "
                     f"{n / mem.peer_median:.2f} | {mem.ratio:.3f} |")
    lines += ["", f"- worst ratio of the {judged} rows (the judged ones): {worst:.3f}, overhead {1 / worst - 1:+.1%} (target <= {MAX_OVERHEAD:.0%}: "
              f"{'met' if worst >= TARGET else 'MISSED'})"]
    noisy = [f"{mode} {c}" for mode, c, _, r, _ in rows if max(Row.spread(r.trace_s), Row.spread(r.peer_s)) > 0.3]
    if noisy:
        lines.append(f"- rows {', '.join(noisy)} have an interquartile spread > 30 %: other "
                     "load on the machine moved them more than the service did; rerun with more --reps on a quiet "
                     "machine before reading their ratio")
    body = "\n".join(lines) + "\n"
    print(body)
    if not args.no_write:
        write_section("rollout_overhead", body)
    return 0 if worst >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
