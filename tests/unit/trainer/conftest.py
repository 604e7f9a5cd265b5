"""The trainer tests run GRPO too: same one-thread rule as tests/unit/grpo (determinism)."""

from tests.unit.grpo.conftest import _one_thread  # noqa: F401  (autouse fixture)
