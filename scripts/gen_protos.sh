#!/usr/bin/env bash
# Regenerates trace_common/proto from protos/ (the one command: `make proto`).
# grpcio-tools writes *_pb2.py / *_pb2_grpc.py / *.pyi under trace/v1/, whose imports say
# `from trace.v1 import ...` -- that would resolve to the standard library's `trace` module.
# protoletariat rewrites them into relative imports so the package lives inside trace_common.
# Usage: scripts/gen_protos.sh [OUT_DIR]   (default trace_common/proto)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-trace_common/proto}"
PY=.venv/bin/python
PROTOL=.tools/protol-venv/bin/protol
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$PY" -m grpc_tools.protoc -I protos \
  --python_out="$work" --grpc_python_out="$work" --pyi_out="$work" \
  --descriptor_set_out="$work/desc.bin" --include_imports \
  protos/trace/v1/*.proto
"$PROTOL" --create-package --in-place --python-out "$work" raw "$work/desc.bin" >/dev/null
rm -f "$work/desc.bin"
rm -rf "$OUT"
mkdir -p "$OUT"
cp -r "$work"/. "$OUT"/
cat > "$OUT/__init__.py" <<'PYEOF'
"""Generated protobuf/gRPC code for the trace.v1 API. Do not edit: run `make proto`.

The proto package is `trace.v1`; its Python code lives at `trace_common.proto.trace.v1`
with relative imports, so nothing here imports the standard library's `trace` module.
"""
PYEOF
echo "generated into $OUT"
