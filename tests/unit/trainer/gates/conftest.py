"""The gate warm-start tests use the inference tests' tiny world (tests/unit/inference/tiny.py)."""

from tests.unit.inference.conftest import _single_thread, world  # noqa: F401  (fixtures)
