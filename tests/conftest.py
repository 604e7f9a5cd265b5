"""Shared pytest setup: fixtures for real servers live in tests/support/ and are registered here."""

import json
import os
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.s3", "tests.support.prom", "tests.support.stack", "tests.support.vllm"]

# Tests must never reach a model hub (there is none here, and CI must not depend on one).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _test_model_roots(tmp_path_factory):
    """Tests build the models they name in requests under the session's temp directory and the tiny
    inference worlds' cache (tests/unit/inference/tiny.py TINY_WORLDS): list both as every service's
    operator model roots (TRACE_<SERVICE>_MODEL_ROOTS, trace_common/model_refs.py), as an operator lists
    its model store. A test that checks the rule itself passes its own `model_roots` to the settings."""
    from trace_common.config import SERVICE_NAMES

    roots = json.dumps([str(tmp_path_factory.getbasetemp()), str(Path(tempfile.gettempdir()) / "trace-tiny-worlds")])
    saved = {}
    for service in SERVICE_NAMES:
        var = f"TRACE_{service.upper()}_MODEL_ROOTS"
        saved[var] = os.environ.get(var)
        os.environ[var] = roots
    yield
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
