"""Fixtures for the tau2 tests: the tau2-bench data, read where it lies.

The data directory is the one $TRACE_TAU2_DATA names (tests/support/tau2_data.py): unset, the
tests that need it skip, saying so; set to a directory without the retail domain, they fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tau2_data import require_tau2_data
from trace_common.domains.tau2.data import Tau2Domain, load_domain


@pytest.fixture(scope="session")
def data_root() -> Path:
    return require_tau2_data()


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
