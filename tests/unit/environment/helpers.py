"""Shared helpers of the environment-service tests: targets, bundles, in-process play, planted modules.

The tau2 target reads the real tau2-bench retail data from the directory `$TRACE_TAU2_DATA` names
(tests/support/tau2_data.py): unset, the tests that use it skip, saying so; mis-set, they fail.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from services.environment import library
from services.environment.sandbox.config import SandboxConfig
from services.environment.targets import TargetInfo, resolve_target
from services.environment.validation import ValidationConfig
from tests.support import tau2_data
from trace_common.env import Environment, action_from_dict, make

TARGET_NAMES = ("store", "tau2-retail")
#: Validation sized for tests (the service defaults are larger), with the default calibration band.
FAST = ValidationConfig(seeds=4, trivial_episodes=8, groups=10, group_size=6)
SANDBOX = SandboxConfig(call_timeout_s=20.0)


def tau2_retail_dir() -> str:
    return str(tau2_data.tau2_retail_dir())


@cache
def target(name: str) -> TargetInfo:
    if name == "tau2-retail":
        return resolve_target("tau2-retail", uri="file://" + tau2_retail_dir())
    return resolve_target(name)


def target_env(name: str) -> Environment:
    """The target itself (tau2 with a scripted user, so it can be reset offline)."""
    if name == "tau2-retail":
        return make("tau2-retail", data=tau2_retail_dir(), user_replies='["I need help with my order."]')
    return make(name)


def params(family: str, target_name: str) -> dict[str, Any]:
    return target(target_name).library_params(library.roles(family))


@cache
def bundled(family: str, target_name: str) -> str:
    return library.bundle(family, params(family, target_name))


def make_env(family: str, target_name: str, cases: int | None = None) -> Environment:
    return library.make_env(family, params(family, target_name), cases=cases)


def play(env: Environment, seed: int, actions: list[dict[str, Any]]) -> float:
    """Reset, apply the actions until done, return the reward."""
    env.reset(seed)
    for action in actions:
        if env.done:
            break
        env.step(action_from_dict(action))
    return env.reward()


def patched(source: str, old: str, new: str, count: int = 1) -> str:
    """`source` with `old` replaced (asserting it was there exactly `count` times)."""
    assert source.count(old) == count, f"patch anchor found {source.count(old)} times, expected {count}: {old!r}"
    return source.replace(old, new)


#: Where planted changes of a bundle's reset go (kit.py's reset, before the world is built).
RESET_ANCHOR = "        world = self.toolkit.new_world(random.Random(seed))\n"
