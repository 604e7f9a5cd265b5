"""Fixtures for the tau2 tests: the shared tau2-bench data, read where it lies.

The data directory is $TRACE_TAU2_DATA, else ../shared/tau2 next to the repository root.
It is always present on the project's machines, so a missing directory FAILS the tests
that need it (never a skip).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trace_common.domains.tau2.data import Tau2Domain, load_domain

REPO_ROOT = Path(__file__).resolve().parents[3]


def tau2_data_root() -> Path:
    env = os.environ.get("TRACE_TAU2_DATA")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "tau2")


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = tau2_data_root()
    if not (root / "retail" / "tasks.json").is_file():
        pytest.fail(f"tau2 data not found at {root} (set TRACE_TAU2_DATA to the directory holding retail/)")
    return root


@pytest.fixture(scope="session")
def retail(data_root: Path):
    """The retail domain. Teardown guards copy-on-write: after every test that used it, the
    shared pristine DB must still equal a freshly validated one (else the session errors)."""
    domain: Tau2Domain = load_domain(data_root, "retail")
    yield domain
    if "pristine_db" in domain.__dict__:
        assert domain.pristine_db == domain.validated_db(), "a tool mutated the shared pristine DB"


@pytest.fixture(scope="session")
def initial_db(retail: Tau2Domain):
    """An initial-state DB, shared read-only (tests compare against it; nothing may mutate it)."""
    return retail.fresh_db()
