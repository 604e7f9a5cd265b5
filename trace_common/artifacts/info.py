"""`ArtifactInfo`, the record every store operation returns.

It lives in a module of its own so that the backend-independent API (`base`) and the local-file
plumbing both backends share (`localio`) can name it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ArtifactInfo:
    """One stored object: its full URI, key within its store, recorded sha256 (hex) and size.

    `corruption` is "" for every object a store operation wrote or verified. Only `list` returns
    others: an object listed with no valid recorded digest (written behind the store's back, e.g.
    by `mc cp` or `cp`, or whose record was lost) carries `sha256=""` and, here, the
    ArtifactCorrupted message that reading it raises, so one such object neither hides nor fails
    the rest of a listing; the caller decides (skip it, or read it and report the fix)."""

    uri: str
    key: str
    sha256: str
    size: int
    corruption: str = ""
