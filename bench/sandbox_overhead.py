"""Sandbox overhead: episodes of a library environment in the locked-down worker vs a plain subprocess.

Both sides run the same worker entrypoint (`python -m services.environment.sandbox.worker`)
and the same JSON-over-pipes protocol through `SandboxEnvironment`; the only difference is
the lockdown: the sandbox side has the network and mount namespaces, the uid drop,
rlimits, the seccomp filter and the audit hook (whatever this machine permits -- the
table says which), the peer has none of them (`SandboxConfig(plain=True)`). So the ratio
is the price of isolation, not of process separation.

Rows:
  * `episode <family>`: one oracle episode (reset, every oracle action, result) on a warm
    worker with the module loaded, averaged over `--episodes` seeds per repetition;
  * `worker start`: spawn + handshake + loading the bundled module (paid once per worker;
    the service reuses loaded workers across episodes).

Target: sandbox time / plain time <= 1.5 for the per-episode rows (medians of interleaved
repetitions, see bench/harness.py).

    .venv/bin/python -m bench.sandbox_overhead [--reps 7] [--episodes 20] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics

from bench.harness import Case, Row, command_line, run_case, write_section
from bench.harness import machine as machine_info
from services.environment import library
from services.environment.baseline_policies import ActionScript
from services.environment.sandbox.environment import SandboxEnvironment, load_module
from services.environment.sandbox.parent import SandboxConfig, SandboxWorker
from services.environment.targets import resolve_target
from trace_common.env import run_episode

TARGET = 1.5
SEEDS = range(500_000, 500_500)


def _worker(config: SandboxConfig, source: str) -> tuple[SandboxWorker, object]:
    worker = SandboxWorker(config, label="bench")
    worker.start()
    return worker, load_module(worker, source)


def _episodes(worker: SandboxWorker, module, scripts: dict[int, list[dict]], seeds: list[int]) -> None:
    for seed in seeds:
        env = SandboxEnvironment(worker, module)
        traj = run_episode(env, ActionScript(scripts[seed]), seed, max(env.default_max_turns, len(scripts[seed]) + 1))
        env.close()
        assert traj.reward == 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=20, help="episodes per repetition")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update bench/RESULTS.md")
    args = parser.parse_args(argv)

    store = resolve_target("store")
    sandboxed, plain = SandboxConfig(), SandboxConfig(plain=True)
    rows: list[tuple[str, Row, int]] = []
    isolation: dict = {}
    for family in library.FAMILIES:
        source = library.bundle(family, store.library_params(library.roles(family)))
        local = library.make_env(family, store.library_params(library.roles(family)))
        seeds = list(SEEDS[: args.episodes])
        scripts = {s: local.script(s, skilled=True) for s in seeds}
        w_trace, m_trace = _worker(sandboxed, source)
        w_peer, m_peer = _worker(plain, source)
        isolation = w_trace.isolation
        try:
            row = run_case(Case(op=f"episode {family}", nbytes=1, reps=args.reps,
                                trace=lambda w=w_trace, m=m_trace, sc=scripts, se=seeds: _episodes(w, m, sc, se),
                                peer=lambda w=w_peer, m=m_peer, sc=scripts, se=seeds: _episodes(w, m, sc, se)))
        finally:
            w_trace.close()
            w_peer.close()
        rows.append((row.op, row, args.episodes))
        print(f"{row.op:40s} sandbox {row.trace_median / args.episodes * 1e3:7.2f} ms/episode  "
              f"plain {row.peer_median / args.episodes * 1e3:7.2f} ms/episode  "
              f"ratio {row.trace_median / row.peer_median:.2f}", flush=True)

    source = library.bundle("precondition_verification", store.library_params(library.roles(
        "precondition_verification")))

    def start(config: SandboxConfig) -> None:
        worker, _ = _worker(config, source)
        worker.close()
    row = run_case(Case(op="worker start (spawn + load)", nbytes=1, reps=max(3, args.reps // 2),
                        trace=lambda: start(sandboxed), peer=lambda: start(plain)))
    rows.append((row.op, row, 1))
    print(f"{row.op:40s} sandbox {row.trace_median * 1e3:7.1f} ms  plain {row.peer_median * 1e3:7.1f} ms  "
          f"ratio {row.trace_median / row.peer_median:.2f}", flush=True)

    episode_ratios = [r.trace_median / r.peer_median for op, r, _ in rows if op.startswith("episode")]
    worst = max(episode_ratios)
    layers = ", ".join(k for k in ("netns", "mount_ro", "seccomp", "audit_hook") if isolation.get(k))
    lines = [
        "## Sandbox overhead (bench/sandbox_overhead.py)",
        "",
        f"- command: `{command_line('bench.sandbox_overhead')}`",
        f"- machine: {machine_info()}",
        f"- sandbox layers in force: {layers}; uid {isolation.get('uid')}; network isolation: "
        f"{isolation.get('network')}; rlimits {isolation.get('rlimits')}",
        "- peer: the same worker and JSON protocol in a plain subprocess (`SandboxConfig(plain=True)`: no limits, "
        "namespaces, seccomp or audit hook)",
        f"- target: sandbox time / plain time <= {TARGET:g} per episode (medians of {args.reps} interleaved "
        f"repetitions of {args.episodes} oracle episodes, store target)",
        "",
        "| op | sandbox ms | plain ms | ratio (time) | paired | spread S / P | target |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for op, r, per in rows:
        ratio = r.trace_median / r.peer_median
        paired = statistics.median(t / p for t, p in zip(r.trace_s, r.peer_s, strict=True))
        ok = "n/a (once per worker)" if not op.startswith("episode") else ("ok" if ratio <= TARGET else "**MISS**")
        lines.append(f"| {op} | {r.trace_median / per * 1e3:.2f} | {r.peer_median / per * 1e3:.2f} | {ratio:.2f} | "
                     f"{paired:.2f} | {Row.spread(r.trace_s):.0%} / {Row.spread(r.peer_s):.0%} | {ok} |")
    lines += ["", f"- worst per-episode ratio: {worst:.2f} (target <= {TARGET:g}: "
                  f"{'met' if worst <= TARGET else 'MISSED'})"]
    body = "\n".join(lines) + "\n"
    print(body)
    if not args.no_write:
        write_section("sandbox", body)
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
