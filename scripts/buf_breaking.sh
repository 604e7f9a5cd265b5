#!/usr/bin/env bash
# `buf breaking` of protos/ against the previous commit of main that had protos (CI runs this).
# The base is the first-parent commit before HEAD: on a clean checkout of main that is main's
# previous state. With no earlier protos (first commit) there is nothing to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(git rev-parse -q --verify HEAD~1 2>/dev/null || true)
if [ -z "$base" ] || ! git cat-file -e "$base:protos/buf.yaml" 2>/dev/null; then
  echo "buf breaking: no earlier protos on main to compare with"
  exit 0
fi
cd protos
../.tools/bin/buf breaking --against "../.git#ref=${base},subdir=protos"
echo "buf breaking: no breaking change against ${base:0:12}"
