"""Calibration with the real base policy (services/environment/calibration_policy.py): a real tiny
transformers model in-process and an OpenAI-compatible endpoint play library environments running
in sandbox workers; refs that cannot name a model fail with the field; a failed load is not cached;
the scripted stand-in is always flagged as such.

The in-process model is random (tests/unit/trainer/helpers.py `save_store_model`): it never makes a
valid tool call, so calibration measures mean 0 and rejects the candidate -- which is what these
tests check, numbers included. The HTTP endpoint is tests/support/fake_openai.py (transport only).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.environment.calibration import CalibrationPolicyFailed, CalibrationTimedOut
from services.environment.calibration_policy import CalibrationSampling, ModelCalibration, check_ref
from services.environment.service import Environments
from services.environment.settings import EnvironmentSettings
from services.environment.validation import ValidationConfig, validate
from tests.support.fake_openai import FakeOpenAI, completion
from tests.unit.trainer.helpers import save_store_model
from trace_common.endpoints import Endpoints
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unimplemented
from trace_common.model_refs import ModelRoots
from trace_common.specs import PolicyRefModel

from .helpers import SANDBOX, bundled, target

#: Small enough for seconds: 3 groups of 4 episodes, 2-turn budget for the trivial checks' sake.
CAL = ValidationConfig(seeds=2, trivial_episodes=2, groups=3, group_size=4)
SAMPLING = CalibrationSampling(temperature=1.0, max_tokens=12)
IN_PROCESS, HTTP, SCRIPTED = "POLICY_BACKEND_IN_PROCESS", "POLICY_BACKEND_OPENAI_HTTP", "POLICY_BACKEND_SCRIPTED"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_store_model(tmp_path_factory.mktemp("calibration-model") / "tiny")


def _ref(backend: str = IN_PROCESS, **kw) -> PolicyRefModel:
    return PolicyRefModel(backend=backend, **kw)


def _checked(ref: PolicyRefModel) -> PolicyRefModel:
    """An HTTP ref as the environment service passes it on: checked against an endpoint profile of its URL."""
    if ref.backend != HTTP:
        return ref
    return Endpoints({"fake": {"base_url": ref.endpoint}}).policy(ref, "spec.calibration_policy")


def _calibrate(ref: PolicyRefModel, family: str, target_name: str, sampling: CalibrationSampling = SAMPLING,
               cal: ValidationConfig = CAL):
    """Prepare the maker, validate one library bundle with it, release; returns (report, maker, calibration)."""
    calibration = ModelCalibration(sampling, allowed=_allowed())
    maker = calibration(_checked(ref))
    try:
        asyncio.run(maker.prepare())
        policy = maker.policy
        report = validate(bundled(family, target_name), target(target_name), cal, SANDBOX, maker(), label=family)
        asyncio.run(maker.release())
    finally:
        asyncio.run(calibration.close())
    return report, policy


def _calibration_check(report):
    return next(c for c in report.checks if c.name == "calibration")


# -- the in-process transformers policy -------------------------------------------------------------

@pytest.mark.parametrize(("family", "target_name"), [("precondition_verification", "store"),
                                                     ("tool_call_precision", "tau2-retail")])
def test_in_process_model_calibrates_a_library_environment(model_dir, family, target_name):
    ref = _ref(model=str(model_dir))
    report, policy = _calibrate(ref, family, target_name)
    check = _calibration_check(report)
    rewards = check.details["rewards"]
    assert len(rewards) == CAL.groups and all(len(g) == CAL.group_size for g in rewards)  # [groups, group_size]
    assert all(0.0 <= r <= 1.0 for g in rewards for r in g)
    # every earlier check passed: the candidate is good, only the (random) base policy cannot learn it
    assert [c.name for c in report.checks if not c.passed] == ["calibration"]
    assert report.status == "REJECTED"
    mean = report.numbers["calibration_mean"]
    assert report.reasons[0].startswith(f"calibration: base policy {model_dir} mean reward {mean:.2f} outside the "
                                        "band [0.20, 0.60]"), report.reasons
    assert report.calibration_policy == str(model_dir)
    assert report.calibration_policy_info == {"backend": IN_PROCESS, "model": str(model_dir),
                                              "scripted_stand_in": False, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                              "max_tokens": 12}
    # one request per turn; concurrent episodes shared forward passes
    assert policy.stats.requests >= CAL.groups * CAL.group_size
    assert max(policy.batch_sizes) > 1, policy.batch_sizes
    json.loads(report.to_json())


def test_greedy_calibration_makes_no_group_informative(model_dir):
    """At temperature 0 every sample of a seed is the same episode: no group can be informative."""
    report, _ = _calibrate(_ref(model=str(model_dir)), "precondition_verification", "store",
                           CalibrationSampling(temperature=0.0, max_tokens=8))
    assert report.numbers["informative_fraction"] == 0.0
    assert "only 0% of groups informative (need 50%)" in _calibration_check(report).reason
    assert all(len(set(g)) == 1 for g in _calibration_check(report).details["rewards"])


# -- the OpenAI-compatible HTTP policy ----------------------------------------------------------------

CALL = {"id": "x", "type": "function",
        "function": {"name": "find_user_id_by_email", "arguments": json.dumps({"email": "nobody@example.com"})}}


@pytest.mark.parametrize(("reply", "min_turns"), [
    ({"json": completion("I am sorry, I cannot help.")}, 1),  # a message ends each episode after one turn
    ({"json": completion("", [CALL])}, 2),                      # tool calls every turn: several turns
])
def test_http_policy_calibrates_through_the_endpoint(reply, min_turns):
    srv = FakeOpenAI(default=reply)
    try:
        ref = _ref(HTTP, model="served-base", endpoint=srv.base_url)
        report, policy = _calibrate(ref, "precondition_verification", "store")
    finally:
        srv.close()
    episodes = CAL.groups * CAL.group_size
    assert len(srv.requests) >= min_turns * episodes
    first = srv.requests[0]
    assert first["model"] == "served-base" and first["temperature"] == 1.0 and first["max_tokens"] == 12
    assert {t["function"]["name"] for t in first["tools"]} == set(report.candidate["tools"])
    assert len({r["seed"] for r in srv.requests}) > 1  # per-episode sampling seeds
    assert report.calibration_policy_info == {"backend": HTTP, "model": "served-base", "endpoint": srv.base_url,
                                              "scripted_stand_in": False, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                              "max_tokens": 12}
    check = _calibration_check(report)
    assert not check.passed and "outside the band" in check.reason
    assert policy.stats.failed_requests == 0


@pytest.mark.parametrize("reply", [{"status": 500, "json": {"error": "down"}}, {"raw": b"<html>nope</html>"}])
def test_http_backend_failure_fails_calibration_not_the_candidate(reply):
    srv = FakeOpenAI(default=reply)
    try:
        with pytest.raises(CalibrationPolicyFailed) as err:
            _calibrate(_ref(HTTP, model="served-base", endpoint=srv.base_url), "precondition_verification", "store")
    finally:
        srv.close()
    assert err.value.code == "UNAVAILABLE"
    assert "calibration policy 'served-base' failed" in str(err.value) and "policy backend" in str(err.value)


REFUSAL = {"status": 400, "json": {"error": {"message": "This model's maximum context length is 4096 tokens. "
                                             "However, you requested 4200 tokens.", "type": "BadRequestError"}}}


@pytest.mark.parametrize("first_turn_fits, fragment", [
    # a base agent whose conversation outgrows its context has failed the episode (its budget in tokens
    # ran out): scored like a max_turns episode, never an error that rejects the candidate whatever its
    # mean (a 1-in-64 overflow did that to an in-band candidate)
    (True, "outside the band"),
    # a first prompt that does not fit is a set-up error no agent could act on: said, as any episode error
    (False, "ContextExhausted"),
])
def test_episodes_that_outgrow_the_context(first_turn_fits, fragment):
    def respond(body):
        if first_turn_fits and len(body["messages"]) <= 2:     # system + user: the first turn fits
            return {"json": completion("", [CALL])}
        return REFUSAL
    srv = FakeOpenAI(respond=respond)
    try:
        report, _ = _calibrate(_ref(HTTP, model="served-base", endpoint=srv.base_url), "precondition_verification",
                               "store")
    finally:
        srv.close()
    check = _calibration_check(report)
    assert not check.passed and fragment in check.reason
    assert ("ContextExhausted" in check.reason) is (not first_turn_fits)
    assert report.numbers["calibration_mean"] == 0.0


def test_episodes_past_the_deadline_fail_calibration_not_the_candidate():
    """A slow model must not be read as a 0 reward (every environment would be rejected as too hard)."""
    srv = FakeOpenAI(default={"json": completion("", [CALL])}, latency=0.3)  # several turns of 0.3 s each
    try:
        with pytest.raises(CalibrationTimedOut) as err:
            _calibrate(_ref(HTTP, model="slow-base", endpoint=srv.base_url), "precondition_verification", "store",
                       cal=CAL.model_copy(update={"episode_deadline_s": 0.5}))
    finally:
        srv.close()
    assert err.value.code == "DEADLINE_EXCEEDED"
    msg = str(err.value)
    assert "calibration episodes of 'slow-base' ran past their 0.5 s deadline" in msg
    assert "TRACE_ENVIRONMENT_VALIDATION_EPISODE_DEADLINE_S" in msg  # says how to fix it


# -- bad refs -------------------------------------------------------------------------------------------

def _allowed() -> ModelRoots:
    """The environment service's rule as the settings read it (tests/conftest.py lists the test temp dirs)."""
    return ModelRoots.of(EnvironmentSettings())


#: An operator's rule for the cheap checks: a store and one root of each kind.
ROOTS = ModelRoots(store="file:///srv/trace-store", roots=("file:///srv/models", "s3://bucket/models"),
                   setting="TRACE_ENVIRONMENT_MODEL_ROOTS")


@pytest.mark.parametrize(("kwargs", "error", "fragment", "fix"), [
    ({"model": "no-such-agent"}, PermissionDenied, "spec.calibration_policy.model: 'no-such-agent'", "MODEL_ROOTS"),
    ({"model": "/nonexistent/trace-model"}, PermissionDenied, "allowed: a built-in base agent (micro", "MODEL_ROOTS"),
    ({"model": "file:///tmp"}, PermissionDenied, "file:///srv/models, s3://bucket/models", "MODEL_ROOTS"),
    ({"model": "/srv/models/none"}, NotFound, "spec.calibration_policy.model '/srv/models/none' has no config.json",
     "save_pretrained"),
    ({"model": "micro", "adapter_uri": "file:///tmp"}, PermissionDenied, "spec.calibration_policy.adapter_uri",
     "MODEL_ROOTS"),
    ({"backend": HTTP, "model": "served"}, InvalidArgument, "spec.calibration_policy.endpoint", "http://vllm:8000/v1"),
    ({"backend": SCRIPTED, "model": "x"}, InvalidArgument, "spec.calibration_policy.backend",
     "POLICY_BACKEND_IN_PROCESS or"),
])
def test_refs_that_cannot_name_a_model_are_refused(kwargs, error, fragment, fix):
    ref = _ref(**{"backend": IN_PROCESS, **kwargs})
    with pytest.raises(error) as err:
        check_ref(ref, ROOTS)
    assert fragment in str(err.value) and fix in str(err.value)  # names the field and says how to fix it


@pytest.mark.parametrize("kwargs", [{"model": "micro"}, {"model": "smollm2"}, {"model": "s3://bucket/models/m"},
                                    {"backend": HTTP, "model": "served", "endpoint": "http://vllm:8000/v1"}])
def test_loadable_looking_refs_pass_the_cheap_check(kwargs):
    check_ref(_ref(**{"backend": IN_PROCESS, **kwargs}), ROOTS)  # no loading happens here (micro is not built)


def _broken(kind: str, good: Path, root: Path) -> Path:
    d = root / kind
    d.mkdir()
    if kind == "garbage_config":
        (d / "config.json").write_text("{not json")
    elif kind == "no_weights":
        for f in good.iterdir():
            if not f.name.endswith(".safetensors"):
                (d / f.name).write_bytes(f.read_bytes())
    elif kind == "truncated_weights":
        for f in good.iterdir():
            data = f.read_bytes()
            (d / f.name).write_bytes(data[: len(data) // 3] if f.name.endswith(".safetensors") else data)
    return d


@pytest.mark.parametrize("kind", ["garbage_config", "no_weights", "truncated_weights"])
def test_a_model_that_cannot_load_is_a_failed_precondition_and_not_cached(model_dir, tmp_path, kind):
    bad = _broken(kind, model_dir, tmp_path)
    calibration = ModelCalibration(SAMPLING, allowed=_allowed())
    try:
        maker = calibration(_ref(model=str(bad)))  # config.json exists: the cheap check passes
        with pytest.raises(FailedPrecondition) as err:
            asyncio.run(maker.prepare())
        assert str(err.value).startswith(f"spec.calibration_policy.model: cannot load the calibration policy "
                                         f"'{bad}'")
        assert "save_pretrained" in str(err.value)
        assert calibration.host.loaded() == 0
        with pytest.raises(FailedPrecondition, match="not loaded"):
            maker()
        good = calibration(_ref(model=str(model_dir)))  # the host still works
        asyncio.run(good.prepare())
        assert good().info.model == str(model_dir)
        asyncio.run(good.release())
    finally:
        asyncio.run(calibration.close())


@pytest.mark.parametrize(("keep_idle", "loaded_after"), [(0, 0), (1, 1)])
def test_makers_share_one_loaded_policy(model_dir, keep_idle, loaded_after):
    calibration = ModelCalibration(CalibrationSampling(keep_idle=keep_idle), allowed=_allowed())
    try:
        ref = _ref(model=str(model_dir))
        a, b = calibration(ref), calibration(ref)

        async def both():
            await asyncio.gather(a.prepare(), b.prepare())
            assert a.policy is b.policy and calibration.host.loaded() == 1
            await a.release()
            assert calibration.host.loaded() == 1  # b still holds it
            await b.release()
        asyncio.run(both())
        assert calibration.host.loaded() == loaded_after
    finally:
        asyncio.run(calibration.close())


# -- the service's choice of calibration policy ------------------------------------------------------

@pytest.mark.parametrize(("ref", "expected"), [
    (None, {"backend": SCRIPTED, "model": "skill-mixture@0.3", "scripted_stand_in": True, "note": "fallback"}),
    (_ref(SCRIPTED, model="skill-mixture@0.5"),
     {"backend": SCRIPTED, "model": "skill-mixture@0.5", "scripted_stand_in": True, "note": "requested"}),
])
def test_scripted_calibration_is_always_flagged(tmp_path, ref, expected):
    envs = Environments(EnvironmentSettings(artifact_root=tmp_path.as_uri()))
    try:
        info = envs.calibration_maker(ref)().describe()
    finally:
        asyncio.run(envs.close())
    assert info["note"].startswith(expected.pop("note"))
    assert {k: info[k] for k in expected} == expected


@pytest.mark.parametrize(("wired", "error", "fragment"), [
    (False, Unimplemented, "calibration_factories"),
    (True, PermissionDenied, "spec.calibration_policy.model"),
])
def test_a_model_ref_needs_the_model_calibration_wired_in(tmp_path, wired, error, fragment):
    calibration = ModelCalibration(SAMPLING, allowed=_allowed()) if wired else None
    envs = Environments(EnvironmentSettings(artifact_root=tmp_path.as_uri()), calibration_factories=calibration)
    try:
        with pytest.raises(error, match=fragment):
            envs.calibration_maker(_ref(model="no-such-agent"))
    finally:
        asyncio.run(envs.close())
