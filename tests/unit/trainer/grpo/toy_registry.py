"""Registers the toy environments (helpers.py) as `toy-pick` and `toy-tool`, for tests that
train through the trainer service's worker processes (`TRACE_TRAINER_ENV_MODULES`)."""

from tests.unit.trainer.grpo.helpers import PickEnv, ToolEnv
from trace_common.env import register

for _name, _cls in (("toy-pick", PickEnv), ("toy-tool", ToolEnv)):
    register(_name, _cls.version, _cls, description=f"test environment {_cls.__name__}")
