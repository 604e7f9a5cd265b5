"""The trainer tests run GRPO too: same one-thread rule as tests/unit/trainer/grpo (determinism)."""

from tests.unit.trainer.grpo.conftest import _one_thread  # noqa: F401  (autouse fixture)
