"""`ArtifactInfo`, the record every store operation returns.

It lives in a module of its own so that the backend-independent API (`base`) and the local-file
plumbing both backends share (`localio`) can name it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ArtifactInfo:
    """One stored object: its full URI, key within its store, recorded sha256 (hex) and size."""

    uri: str
    key: str
    sha256: str
    size: int
