"""Domain exceptions of TRACE and the gRPC status code each one maps to.

Domain code raises these; it never imports grpc. One server interceptor
(`trace_common.grpc.interceptors.ErrorMappingInterceptor`) turns them into statuses, so
clients get the documented code and the message -- never a stack trace.

Messages follow one rule: say which field or thing was wrong, what was expected, and how
to fix it. `InvalidArgument` builds that shape for you.
"""

from __future__ import annotations

from typing import ClassVar


class TraceError(Exception):
    """Base of all domain errors. `code` is the gRPC status code *name* it maps to."""

    code: ClassVar[str] = "INTERNAL"

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class InvalidArgument(TraceError):
    """The caller sent something malformed; retrying the same request cannot succeed."""

    code = "INVALID_ARGUMENT"

    def __init__(self, reason: str = "", *, field: str | None = None, expected: str | None = None,
                 fix: str | None = None, got: object = None):
        if field is not None:
            parts = [f"{field}: "]
            if expected:
                parts.append(f"expected {expected}")
            if got is not None:
                shown = repr(got)
                parts.append(f", got {shown[:120] + '...' if len(shown) > 120 else shown}")
            if reason:
                parts.append(f"{'; ' if expected or got is not None else ''}{reason}")
            if fix:
                parts.append(f". {fix}")
            reason = "".join(parts)
        super().__init__(reason)
        self.field = field


class PermissionDenied(TraceError):
    """The caller asked for something the operator did not allow (an outbound URL, a credential,
    a model outside an endpoint profile); retrying the same request cannot succeed. The message
    names the field and says what the request may name instead."""

    code = "PERMISSION_DENIED"

    def __init__(self, reason: str, *, field: str | None = None, fix: str | None = None):
        text = f"{field}: {reason}" if field else reason
        super().__init__(f"{text}. {fix}" if fix else text)
        self.field = field


class NotFound(TraceError):
    """A named thing (job, artifact, environment, composition) does not exist."""

    code = "NOT_FOUND"


class AlreadyExists(TraceError):
    code = "ALREADY_EXISTS"


class FailedPrecondition(TraceError):
    """The request is well-formed but the system is not in a state to serve it."""

    code = "FAILED_PRECONDITION"


class Unavailable(TraceError):
    """A dependency (artifact store, LLM endpoint, vLLM) cannot be reached; retry later."""

    code = "UNAVAILABLE"


class ResourceExhausted(TraceError):
    """A limit was hit (queue full, request too large, sandbox limit)."""

    code = "RESOURCE_EXHAUSTED"


class ContextExhausted(ResourceExhausted):
    """A policy backend's conversation no longer fits the model's context window. Not a failure
    of the backend: after the agent's first turn the episode loop (trace_common/env/episode.py)
    ends the episode with termination `context_exhausted`, scored on the state reached as a `max_turns` episode is --
    the agent ran out of its budget in tokens -- and records no error, so calibration, training
    and evaluation treat it as the agent's failure to finish, never as a broken episode."""


class Unauthenticated(TraceError):
    code = "UNAUTHENTICATED"


class DeadlineExceeded(TraceError):
    code = "DEADLINE_EXCEEDED"


class Cancelled(TraceError):
    code = "CANCELLED"


class Unimplemented(TraceError):
    """A capability that a later piece of work provides; the message names what is missing."""

    code = "UNIMPLEMENTED"


class ArtifactCorrupted(TraceError):
    """An artifact's bytes do not match the sha256 recorded when it was written."""

    code = "DATA_LOSS"
