"""Shared code of the TRACE services: config, errors, artifacts, gRPC bootstrap, metrics.

Services never import each other; they share this package and the generated protos
(`trace_common.proto.trace.v1`).
"""

__version__ = "0.1.0"
