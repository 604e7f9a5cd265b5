"""Artifact store vs the raw `minio` SDK, against one `rclone serve s3` server.

    .venv/bin/python -m bench.artifact_store            # full run, rewrites its RESULTS.md section
    .venv/bin/python -m bench.artifact_store --quick --no-write

For each size, four operations, each timed through TRACE's S3 store and through the plain
SDK client doing the same transfer the way its documentation shows:

    put       store.put_bytes(key, data)      vs client.put_object(bucket, key, BytesIO(data), len)
    get       store.get_bytes(key)            vs client.get_object(...).read()
    put_file  store.put_file(key, path)       vs client.fput_object(bucket, key, path)
    get_file  store.get_file(key, dest)       vs client.fget_object(bucket, key, dest)
              (each call first deletes its previous download, inside the timed region)

TRACE does strictly more work (sha256 of every byte, recorded at write and verified at read;
temp file + rename on download), so ratios near 1 mean that work is hidden, not skipped.
Reads of >= 4 MiB hash beside the transfer on helper threads (trace_common/artifacts/integrity.py);
that hides the hash only while a core is free, so the section records the load average before
and after the run: on a machine other work keeps busy, read the CPU columns.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

from bench.harness import (
    Case,
    Row,
    command_line,
    human_size,
    print_row,
    process_cpu_seconds,
    render,
    run_case,
    write_section,
)
from tests.support.s3 import start_rclone_s3
from trace_common.artifacts import open_store

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB]
# Repetitions per size: enough that the median of the small sizes is stable (each call is
# ~1 ms there), few enough that the 256 MiB rows finish in about a minute.
REPS = {4 * KiB: 300, 64 * KiB: 200, 1 * MiB: 80, 16 * MiB: 15, 256 * MiB: 7}
OPS = ["put", "get", "put_file", "get_file"]
TARGET = 0.9


def cases(size: int, reps: int, ops: list[str], store, client, bucket: str, work: Path,
          server_cpu) -> list[Case]:
    data = os.urandom(size)
    src = work / f"src-{size}"
    src.write_bytes(data)
    tkey, pkey = f"bench/trace/{size}", f"bench/peer/{size}"
    tdest, pdest = work / f"trace-out-{size}", work / f"peer-out-{size}"

    def fresh(dest: Path, download):
        # Download to a path that does not exist yet (the usual case: a new cache entry).
        # Replacing an existing file costs TRACE more on ext4: its atomic rename over the old
        # file triggers auto_da_alloc's flush of the new data, while fget_object deletes the old
        # file first and renames onto a free name (not atomic: the path is briefly missing).
        def call():
            dest.unlink(missing_ok=True)
            return download()

        return call

    def peer_get() -> bytes:
        resp = client.get_object(bucket, pkey)
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    table = {
        "put": (lambda: store.put_bytes(tkey, data), lambda: client.put_object(bucket, pkey, io.BytesIO(data), size)),
        "get": (lambda: store.get_bytes(tkey), peer_get),
        "put_file": (lambda: store.put_file(tkey, src), lambda: client.fput_object(bucket, pkey, str(src))),
        "get_file": (fresh(tdest, lambda: store.get_file(tkey, tdest)),
                     fresh(pdest, lambda: client.fget_object(bucket, pkey, str(pdest)))),
    }
    # Both objects must exist before the first timed read.
    store.put_bytes(tkey, data)
    client.put_object(bucket, pkey, io.BytesIO(data), size)
    return [Case(op, size, *table[op], reps=reps, server_cpu=server_cpu) for op in ops]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=SIZES,
                    help="comma-separated byte sizes (default: 4 KiB .. 256 MiB)")
    ap.add_argument("--ops", type=lambda s: s.split(","), default=OPS, help=f"subset of {','.join(OPS)}")
    ap.add_argument("--reps-scale", type=float, default=1.0, help="multiply the repetition counts")
    ap.add_argument("--quick", action="store_true", help="reps-scale 0.2, for a smoke run")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = ap.parse_args(argv)
    scale = 0.2 if args.quick else args.reps_scale

    rows: list[Row] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trace-bench-") as tmp:
        work = Path(tmp)
        server = start_rclone_s3(work / "s3")
        try:
            bucket = server.make_bucket("bench")
            store = open_store(f"s3://{bucket}", s3=server.settings)
            client = server.client()
            for size in args.sizes:
                reps = max(3, round(REPS.get(size, 10) * scale))
                for case in cases(size, reps, args.ops, store, client, bucket, work,
                                  process_cpu_seconds(server.process.pid)):
                    row = run_case(case)
                    rows.append(row)
                    print_row(row)
                # the store's verified read must return what was written (guards the fast paths)
                assert store.get_bytes(f"bench/trace/{size}") == (work / f"src-{size}").read_bytes()
                for p in work.glob(f"*-{size}"):
                    p.unlink()
        finally:
            server.stop()

    load_after = os.getloadavg()
    misses = [f"{r.op} {human_size(r.nbytes)}" for r in rows if r.ratio < TARGET]
    notes = [
        "Load average (1/5/15 min) before the run: " + "/".join(f"{x:.1f}" for x in load_before)
        + ", after: " + "/".join(f"{x:.1f}" for x in load_after)
        + f" on {len(os.sched_getaffinity(0))} usable cores (the bench's own client and server keep one to one and a half of them busy).",
        "TRACE = trace_common.artifacts S3 store (sha256 computed at write and carried as x-amz-meta-sha256, "
        "verified on every read, get_file via temp file + rename); peer = plain `minio.Minio(..., "
        "region='us-east-1')` with SDK defaults, no integrity checks beyond the SDK's own.",
        "Server: `rclone serve s3` on 127.0.0.1 over a temp dir; both clients in the same process, "
        "calls interleaved trace/peer/peer/trace; medians over reps.",
        "ratio = peer median time / TRACE median time; paired ratio = median of per-repetition ratios; "
        "spread = interquartile range / median of each side's times; CPU columns = mean CPU per call of "
        "this process (all threads) and of the rclone server; CPU ratio = peer total CPU / TRACE total CPU. "
        "When the cores are saturated, wall time follows total CPU, so the CPU columns show what each "
        "side costs independent of the load.",
    ]
    if misses:
        notes.append("Below target: " + ", ".join(misses) + " (see the analysis below the table in bench/README.md).")
    body = render("Artifact store: TRACE S3 store vs raw minio SDK", command_line("bench.artifact_store"),
                  "minio Python SDK 7.2 (put_object / get_object().read() / fput_object / fget_object)",
                  rows, TARGET, notes)
    print()
    print(body)
    if not args.no_write:
        write_section("artifact_store", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
