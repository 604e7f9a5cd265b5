"""Generated protobuf/gRPC code for the trace.v1 API. Do not edit: run `make proto`.

The proto package is `trace.v1`; its Python code lives at `trace_common.proto.trace.v1`
with relative imports, so nothing here imports the standard library's `trace` module.
"""
