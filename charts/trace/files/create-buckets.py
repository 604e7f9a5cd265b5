"""Create the artifact buckets (run by the chart's post-install/post-upgrade hook Job).

Runs in the analysis image (`python -c`, the minio SDK is a TRACE dependency). The S3 server
may still be starting (the in-chart MinIO comes up with the release), so connection errors are
retried until TRACE_BUCKETS_WAIT_SECONDS; a bucket that already exists is fine (idempotent).
Settings, all from the environment (credentials via secretKeyRef):
TRACE_BUCKETS_NAMES (comma-separated), TRACE_BUCKETS_S3_ENDPOINT, TRACE_BUCKETS_S3_ACCESS_KEY,
TRACE_BUCKETS_S3_SECRET_KEY, TRACE_BUCKETS_S3_REGION, TRACE_BUCKETS_S3_SECURE.
"""

import os
import sys
import time

from minio import Minio
from minio.error import S3Error


def main() -> int:
    env = os.environ
    names = [n.strip() for n in env["TRACE_BUCKETS_NAMES"].split(",") if n.strip()]
    client = Minio(env["TRACE_BUCKETS_S3_ENDPOINT"], access_key=env["TRACE_BUCKETS_S3_ACCESS_KEY"],
                   secret_key=env["TRACE_BUCKETS_S3_SECRET_KEY"],
                   secure=env.get("TRACE_BUCKETS_S3_SECURE", "false").lower() == "true",
                   region=env.get("TRACE_BUCKETS_S3_REGION", "us-east-1"))
    deadline = time.monotonic() + float(env.get("TRACE_BUCKETS_WAIT_SECONDS", "300"))
    for name in names:
        while True:
            try:
                if client.bucket_exists(name):
                    print(f"bucket {name}: exists", flush=True)
                else:
                    client.make_bucket(name)
                    print(f"bucket {name}: created", flush=True)
                break
            except S3Error as err:  # the server answered: retrying will not help
                print(f"bucket {name}: {err.code}: {err.message}", file=sys.stderr, flush=True)
                return 1
            except Exception as err:  # noqa: BLE001 - connection refused/reset while S3 starts
                if time.monotonic() > deadline:
                    print(f"bucket {name}: S3 server unreachable: {err}", file=sys.stderr, flush=True)
                    return 1
                print(f"bucket {name}: waiting for the S3 server ({type(err).__name__})", flush=True)
                time.sleep(3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
