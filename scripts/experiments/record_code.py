"""What code wrote an experiment record: the checked-out commit, and whether the experiment code
(`scripts/`, `trace_common/`) was as committed then. Shared by the dev-experiment scripts here (run
with this directory on sys.path) so every record states it alike."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def code_state() -> dict[str, Any]:
    """{"commit": HEAD, "code_as_committed": no uncommitted change under scripts/ or trace_common/}."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "scripts", "trace_common"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "code_as_committed": not dirty}
