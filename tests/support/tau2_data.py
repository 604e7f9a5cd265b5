"""Where the tests find the tau2-bench data: one setting, TRACE_TAU2_DATA.

The data is not part of this repository (README, "tau2-bench data", says where to get it). The
tests read it where the product reads it by default: the directory `$TRACE_TAU2_DATA` names, which
holds tau2-bench's `retail/` and `user_simulator/` folders (trace_common/domains/tau2/data.py).
`.ci/run` sets the variable on the project's machines.

* unset: every test that needs the data skips, with `SKIP_REASON` (`require_tau2_data()` inside a
  test or fixture; `needs_tau2` as a mark, for parameters and tests that need the data at
  collection time);
* set to a directory without `retail/tasks.json`: those tests fail, naming the directory -- a
  mis-set setting is an error, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trace_common.domains.tau2.data import DATA_ENV_VAR

SKIP_REASON = (f"tau2 data not found: set {DATA_ENV_VAR} to the directory holding tau2-bench's retail/ and "
               "user_simulator/ (README, 'tau2-bench data')")


def tau2_data_root() -> Path | None:
    """The absolute directory $TRACE_TAU2_DATA names; None when it is unset or empty."""
    value = os.environ.get(DATA_ENV_VAR, "")
    return Path(value).absolute() if value else None


def require_tau2_data() -> Path:
    """The tau2 data root; skips the calling test when the setting is unset, fails it when the setting
    names a directory without the retail domain."""
    root = tau2_data_root()
    if root is None:
        pytest.skip(SKIP_REASON)
    if not (root / "retail" / "tasks.json").is_file():
        pytest.fail(f"{DATA_ENV_VAR}={root} holds no retail/tasks.json: point it at the directory holding "
                    "tau2-bench's retail/ and user_simulator/")
    return root


def tau2_retail_dir() -> Path:
    """`require_tau2_data() / "retail"`: the retail domain directory."""
    return require_tau2_data() / "retail"


#: Skips a test (or one parameter set) when TRACE_TAU2_DATA is unset; evaluated once, at collection.
needs_tau2 = pytest.mark.skipif(tau2_data_root() is None, reason=SKIP_REASON)
