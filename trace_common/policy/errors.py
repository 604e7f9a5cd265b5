"""The typed error a policy backend raises when it cannot produce a reply.

`PolicyUnavailable` is a `trace_common.errors.Unavailable` (gRPC UNAVAILABLE), so a job
that cannot reach its model fails with the right status; `kind` is a short, bounded label
(for metrics and for the failed episode's record) and `reason` the full explanation.
"""

from __future__ import annotations

from typing import Literal

from trace_common.errors import Unavailable

FailureKind = Literal["timeout", "connection", "http_error", "bad_response", "backend_error"]


class PolicyUnavailable(Unavailable):
    """The backend failed to answer (after its bounded retries)."""

    def __init__(self, reason: str, *, kind: FailureKind = "backend_error", status: int | None = None):
        super().__init__(f"policy backend {kind}: {reason}")
        self.kind = kind
        self.status = status
