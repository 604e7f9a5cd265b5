"""The bearer-token check every TRACE surface shares: the gRPC auth interceptor and the inference
service's OpenAI-compatible HTTP API refuse a call with the same rule and the same words.

A call is accepted when its `authorization` value is `Bearer <token>` (the scheme in any case,
one or more spaces after it) and `<token>` equals the service's token. Both sides are hashed
with sha256 before `hmac.compare_digest`, so the comparison takes the same time whatever the
length or content of the guess. Tokens themselves are validated at start-up
(`trace_common.config.check_token`): a blank one never reaches this class.
"""

from __future__ import annotations

import hashlib
import hmac

MISSING = "missing 'authorization: Bearer <token>'; pass the service's auth token"
INVALID = "invalid bearer token; check the token the server was started with"


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class BearerToken:
    """One service's expected token; `refusal(header)` says why a header is refused, or None."""

    def __init__(self, token: str):
        if not token or token != token.strip():
            raise ValueError("BearerToken needs a non-blank token without surrounding whitespace")
        self._expected = _digest(token.encode())

    def refusal(self, header: str | bytes | None) -> str | None:
        """None when `header` (the authorization value) carries the token, else the reason."""
        if header is None:
            return MISSING
        try:   # aiohttp decodes a header's non-UTF-8 bytes as surrogates: encode them back, never raise
            raw = header.encode("utf-8", "surrogateescape") if isinstance(header, str) else header
        except UnicodeEncodeError:   # a lone surrogate that stands for no byte: no token looks like that
            raw = b"\xff"
        scheme, _sep, credential = raw.partition(b" ")
        credential = credential.lstrip(b" ")
        if scheme.lower() != b"bearer" or not credential:
            # still compare, so a malformed header costs the same as a wrong token
            hmac.compare_digest(_digest(raw), self._expected)
            return INVALID
        return None if hmac.compare_digest(_digest(credential), self._expected) else INVALID
