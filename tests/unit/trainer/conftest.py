"""The trainer tests run GRPO too: same one-thread rule as tests/unit/trainer/grpo (determinism)."""

import pytest

from tests.unit.trainer.grpo.conftest import _one_thread  # noqa: F401  (autouse fixture)
from tests.unit.trainer.grpo.helpers import tiny_tokenizer, warm_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The warm-started tiny "pick" model and its tokenizer as a model directory (what a job loads)."""
    d = tmp_path_factory.mktemp("pick-model")
    warm_model("pick").save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d
