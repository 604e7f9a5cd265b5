"""The environment service over gRPC (embedded stack): library and llm generation jobs, the
registry, episodes served from sandbox workers, containment while serving, `tracectl envs`.
The fake generators are allowed as endpoint profiles of the embedded service while a test runs
(tests/support/endpoints.py), as an operator's TRACE_ENVIRONMENT_ENDPOINTS would."""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.environment.metrics import M
from tests.support.endpoints import Listener, allowed
from tests.support.fake_openai import FakeOpenAI, completion
from tests.unit.environment.helpers import RESET_ANCHOR, bundled, make_env, patched, target, tau2_retail_dir
from trace_common.artifacts import open_uri
from trace_common.env import Message, run_episode
from trace_common.env.remote import RemoteEnvironment
from trace_common.grpc.client import Endpoint, messages, open_channel
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.cli import main as tracectl_main

pytestmark = pytest.mark.integration
E = messages("environment")
FAMILIES = ("structured_data_reasoning", "multi_step_task_completion", "precondition_verification",
            "tool_call_precision")


def _generate(stub, spec, run_id="envtest"):
    job = stub.CreateGenerationJob(E.CreateGenerationJobRequest(spec=spec, run_id=run_id)).job
    states = [m.job.state for m in stub.WatchGenerationJob(E.WatchGenerationJobRequest(job_id=job.job_id),
                                                           timeout=300)]
    return stub.GetGenerationJob(E.GetGenerationJobRequest(job_id=job.job_id)), states


def _scripted(actions):
    from services.environment.baseline_policies import ActionScript

    return ActionScript(actions)


@pytest.fixture(scope="module")
def library_job(embedded_stack):
    spec = E.GenerationSpec(capabilities=[t.Capability(name=c) for c in FAMILIES], target=t.EnvironmentRef(name="store"),
                            mode=E.GENERATION_MODE_LIBRARY)
    return _generate(embedded_stack.stub("environment"), spec)


def test_library_job_registers_accepted_environments(embedded_stack, library_job):
    resp, states = library_job
    assert states[-1] == t.JOB_STATE_SUCCEEDED, resp.job.error
    assert sorted(r.name for r in resp.environments) == sorted(FAMILIES)
    for record in resp.environments:
        assert record.status == E.VALIDATION_STATUS_ACCEPTED and record.mode == E.GENERATION_MODE_LIBRARY
        assert 0.2 <= record.calibration_reward_mean <= 0.6 and record.calibration_informative_fraction >= 0.5
        assert f"/runs/envtest/environments/{record.capability}/v" in record.code.uri
        store, key = open_uri(record.validation_report.uri)
        report = json.loads(store.get_bytes(key))  # sha256-verified read
        assert report["status"] == "ACCEPTED" and report["mode"] == "GENERATION_MODE_LIBRARY"
        assert report["isolation"]["network"] in ("netns", "seccomp")
        code_store, code_key = open_uri(record.code.uri)
        assert code_store.stat(code_key).sha256 == record.code.sha256
    kinds = sorted(o.kind for o in resp.job.outputs)
    assert kinds.count("environment-manifest") == 4 and kinds.count("validation-report") == 4
    assert resp.job.metrics["accepted"] == 4
    assert M.registry.get_sample_value("trace_environment_validations_total",
                                       {"mode": "library", "status": "accepted"}) >= 4


def test_list_and_get_environments(embedded_stack, library_job):
    stub = embedded_stack.stub("environment")
    listed = {r.name for r in stub.ListEnvironments(E.ListEnvironmentsRequest()).environments}
    assert set(FAMILIES) <= listed
    only = stub.ListEnvironments(E.ListEnvironmentsRequest(capability="tool_call_precision")).environments
    assert {r.capability for r in only} == {"tool_call_precision"}
    got = stub.GetEnvironment(E.GetEnvironmentRequest(name="precondition_verification"))
    assert [json.loads(s.json) for s in got.tools] == target("store").tool_schemas  # all of the target's tools


@pytest.mark.parametrize("family", FAMILIES)
def test_episodes_served_by_seed_reach_the_oracle_reward(embedded_stack, library_job, family):
    env = RemoteEnvironment(embedded_stack.stub("environment"), family)
    local = make_env(family, "store")  # trusted library code: computes the oracle's actions here
    for seed in (1_000_001, 1_000_002):
        traj = run_episode(env, _scripted(local.script(seed, skilled=True)), seed)
        assert traj.reward == 1.0 and env.done
        obs_local = local.reset(seed)
        assert [m.content for m in traj.messages[:2]] == [m.content for m in obs_local.messages]  # same instance
        assert traj.messages[0].content.startswith(target("store").system_prompt)
    unskilled = run_episode(env, _scripted(local.script(1_000_003, skilled=False)), 1_000_003)
    assert unskilled.reward < 1.0
    env.close()


def test_step_after_close_and_bad_actions(embedded_stack, library_job):
    stub = embedded_stack.stub("environment")
    r = stub.ResetEpisode(E.ResetEpisodeRequest(environment=t.EnvironmentRef(name="tool_call_precision"), seed=3))
    out = stub.StepEpisode(E.StepEpisodeRequest(episode_id=r.episode_id, tool_call=t.ToolCall(
        id="c9", name="get_order_details", arguments_json="{not json")))
    assert out.observation.role == "tool" and out.observation.tool_call_id == "c9"
    assert out.observation.content.startswith("Error") and not out.done
    with pytest.raises(grpc.RpcError) as err:
        stub.StepEpisode(E.StepEpisodeRequest(episode_id=r.episode_id))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stub.CloseEpisode(E.CloseEpisodeRequest(episode_id=r.episode_id))
    with pytest.raises(grpc.RpcError) as err:
        stub.StepEpisode(E.StepEpisodeRequest(episode_id=r.episode_id, message="hi"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_tau2_target_library_job(embedded_stack):
    spec = E.GenerationSpec(capabilities=[t.Capability(name="argument_formatting")],
                            target=t.EnvironmentRef(name="tau2-retail", uri="file://" + tau2_retail_dir()),
                            mode=E.GENERATION_MODE_LIBRARY)
    resp, states = _generate(embedded_stack.stub("environment"), spec, run_id="envtau2")
    assert states[-1] == t.JOB_STATE_SUCCEEDED, resp.job.error
    (record,) = resp.environments
    assert record.name == "argument_formatting" and record.status == E.VALIDATION_STATUS_ACCEPTED
    r = embedded_stack.stub("environment").ResetEpisode(E.ResetEpisodeRequest(
        environment=t.EnvironmentRef(name="argument_formatting", version=record.version), seed=10))
    assert r.messages[0].content.startswith(target("tau2-retail").system_prompt)
    assert r.messages[1].role == "assistant" and r.messages[1].content == "Hi! How can I help you today?"
    assert len(r.tools) == 16
    embedded_stack.stub("environment").CloseEpisode(E.CloseEpisodeRequest(episode_id=r.episode_id))


GOOD = bundled("precondition_verification", "store")
#: drops the target's cancel tool: the surface check rejects it
WRONG_TOOL = patched(GOOD, '        return copy.deepcopy(self.surface["tool_schemas"])\n',
                     '        return copy.deepcopy(self.surface["tool_schemas"])[:-1]\n')
#: passes every check (the trap hides outside the dev seeds); at seed 1_000_013 reset hoards memory
TRAPPED = patched(GOOD, RESET_ANCHOR, "        if seed == 1_000_013:\n            hoard = [bytearray(1 << 30)"
                                      " for _ in range(64)]\n" + RESET_ANCHOR)


def _llm_spec(fake, name, retries):
    return E.GenerationSpec(capabilities=[t.Capability(name=name, description="check before writing",
                                                       evidence=["cancelled a delivered order"])],
                            target=t.EnvironmentRef(name="store"), mode=E.GENERATION_MODE_LLM,
                            llm=t.LlmEndpoint(base_url=fake.base_url, model="fake-generator"), max_retries=retries)


@pytest.mark.parametrize(("name", "replies", "retries", "status", "attempts"), [
    ("llm_check_before_write", [WRONG_TOOL, GOOD], 2, E.VALIDATION_STATUS_ACCEPTED, 2),
    ("llm_hopeless", [WRONG_TOOL, "no code, sorry"], 1, E.VALIDATION_STATUS_REJECTED, 2),
])
def test_llm_job_validates_what_the_model_writes(embedded_stack, name, replies, retries, status, attempts):
    fake = FakeOpenAI(script=[{"json": completion(f"```python\n{r}```" if "TARGET_TOOLKIT" in r else r)}
                              for r in replies])
    try:
        with allowed(embedded_stack, fake.base_url, services=("environment",)):
            resp, states = _generate(embedded_stack.stub("environment"), _llm_spec(fake, name, retries),
                                     run_id="envllm")
        assert len(fake.requests) == attempts
    finally:
        fake.close()
    assert states[-1] == t.JOB_STATE_SUCCEEDED, resp.job.error
    (record,) = resp.environments
    assert record.mode == E.GENERATION_MODE_LLM and record.status == status
    store, key = open_uri(record.validation_report.uri)
    report = json.loads(store.get_bytes(key))
    assert len(report["attempts"]) == attempts and report["mode"] == "GENERATION_MODE_LLM"
    if status == E.VALIDATION_STATUS_REJECTED:
        assert any("extract" in r for r in record.rejection_reasons)
        listed = embedded_stack.stub("environment").ListEnvironments(E.ListEnvironmentsRequest(include_rejected=True))
        assert name in {r.name for r in listed.environments}
        with pytest.raises(grpc.RpcError) as err:
            embedded_stack.stub("environment").ResetEpisode(E.ResetEpisodeRequest(
                environment=t.EnvironmentRef(name=name), seed=1))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_generator_profile_is_called_with_its_key(embedded_stack, monkeypatch):
    monkeypatch.setenv("TRACE_TEST_GENERATOR_KEY", "sk-generator-profile")
    with Listener(reply="no code, sorry") as srv:
        with allowed(embedded_stack, srv.base_url, name="generator", api_key_env="TRACE_TEST_GENERATOR_KEY",
                     services=("environment",)):
            spec = _llm_spec(srv, "llm_profiled", 0)
            spec.llm.CopyFrom(t.LlmEndpoint(profile="generator", model="fake-generator"))
            resp, states = _generate(embedded_stack.stub("environment"), spec, run_id="envprofile")
        assert states[-1] == t.JOB_STATE_SUCCEEDED, resp.job.error
        assert srv.authorizations() == {"Bearer sk-generator-profile"}


def test_a_violating_episode_leaves_the_service_healthy(embedded_stack):
    fake = FakeOpenAI(script=[{"json": completion(f"```python\n{TRAPPED}```")}])
    try:
        with allowed(embedded_stack, fake.base_url, services=("environment",)):
            resp, states = _generate(embedded_stack.stub("environment"), _llm_spec(fake, "llm_trapped", 0),
                                     run_id="envtrap")
    finally:
        fake.close()
    assert resp.environments[0].status == E.VALIDATION_STATUS_ACCEPTED  # the trap hides outside the dev seeds
    stub = embedded_stack.stub("environment")
    before = M.registry.get_sample_value("trace_environment_sandbox_violations_total", {"kind": "memory"}) or 0
    with pytest.raises(grpc.RpcError) as err:
        stub.ResetEpisode(E.ResetEpisodeRequest(environment=t.EnvironmentRef(name="llm_trapped"), seed=1_000_013))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "memory" in err.value.details()
    assert M.registry.get_sample_value("trace_environment_sandbox_violations_total", {"kind": "memory"}) == \
        before + 1
    with open_channel(Endpoint(embedded_stack.targets["environment"])) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="")).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    ok = stub.ResetEpisode(E.ResetEpisodeRequest(environment=t.EnvironmentRef(name="llm_trapped"), seed=1_000_014))
    assert ok.episode_id
    stub.CloseEpisode(E.CloseEpisodeRequest(episode_id=ok.episode_id))


@pytest.mark.parametrize(("spec", "code", "fragment"), [
    (E.GenerationSpec(capabilities=[t.Capability(name="empathy")], target=t.EnvironmentRef(name="store"),
                      mode=E.GENERATION_MODE_LIBRARY), "FAILED_PRECONDITION", "no environment for capability"),
    (E.GenerationSpec(capabilities=[t.Capability(name="tool_call_precision")], target=t.EnvironmentRef(name="ghost"),
                      mode=E.GENERATION_MODE_LIBRARY), "NOT_FOUND", "ghost"),
    (E.GenerationSpec(capabilities=[t.Capability(name="tool_call_precision")], target=t.EnvironmentRef(name="store"),
                      mode=E.GENERATION_MODE_LIBRARY, calibration_policy=t.PolicyRef(
                          backend=t.POLICY_BACKEND_IN_PROCESS, model="no-such-agent")), "PERMISSION_DENIED",
     "spec.calibration_policy.model"),
    (E.GenerationSpec(capabilities=[t.Capability(name="tool_call_precision")], target=t.EnvironmentRef(name="store"),
                      mode=E.GENERATION_MODE_LIBRARY, calibration_policy=t.PolicyRef(
                          backend=t.POLICY_BACKEND_SCRIPTED, model="expert")), "INVALID_ARGUMENT", "skill-mixture"),
])
def test_bad_generation_requests_fail_before_a_job_exists(embedded_stack, spec, code, fragment):
    with pytest.raises(grpc.RpcError) as err:
        embedded_stack.stub("environment").CreateGenerationJob(E.CreateGenerationJobRequest(spec=spec))
    assert err.value.code().name == code and fragment in err.value.details()


def test_tracectl_envs_lists_with_validation_summary(embedded_stack, library_job, capsys):
    address = f"environment={embedded_stack.targets['environment']}"
    assert tracectl_main(["envs", "list", "--all", "--target", address]) == 0
    out = capsys.readouterr().out
    for family in FAMILIES:
        assert family[:8] in out
    assert "ACCEPTED" in out
    assert tracectl_main(["envs", "show", "precondition_verification", "--target", address]) == 0
    assert ", ".join(target("store").tool_names()) in capsys.readouterr().out


@pytest.mark.parametrize("max_turns", [1, 40])   # ended by the turn limit / by the environment
def test_remote_episodes_are_released_when_the_driver_finishes(embedded_stack, max_turns):
    """The trainer plays service-held environments through RemoteEnvironment: every episode the
    driver finishes -- done or cut by max_turns -- is closed on the service, none left open."""
    from trace_common.env.remote import remote_factory

    client = embedded_stack.stub("environment")
    E_ = messages("environment")
    job = client.CreateGenerationJob(E_.CreateGenerationJobRequest(spec=E_.GenerationSpec(
        capabilities=[t.Capability(name="precondition_verification")], target=t.EnvironmentRef(name="store"),
        mode=E_.GENERATION_MODE_LIBRARY))).job
    list(client.WatchGenerationJob(E_.WatchGenerationJobRequest(job_id=job.job_id), timeout=600))
    factory = remote_factory(embedded_stack.targets["environment"], "precondition_verification")
    table = embedded_stack.domain("environment").episodes       # this stack's open episodes
    for seed in range(3):
        env, seen = factory(), []

        def policy(msgs, tools, env=env, seen=seen):
            seen.append(env.episode_id)
            assert env.episode_id in table.episodes                 # open while it is played
            return Message.assistant("I cannot help.")
        traj = run_episode(env, policy, seed, max_turns)
        assert traj.termination.value in ("done", "max_turns")
        assert seen and env.episode_id == "" and seen[0] not in table.episodes   # released at the end


# -- hostile modules through the service (issue #19) --------------------------------------------------

def test_accepted_reports_name_the_layers_that_held(embedded_stack, library_job):
    resp, _ = library_job
    store, key = open_uri(resp.environments[0].validation_report.uri)
    report = json.loads(store.get_bytes(key))
    iso = report["isolation"]
    assert report["static_check_advisory"] is True
    assert iso["backend"] == "process" and iso["missing"] == [] and not iso["allowed_weak"]
    assert {"pidns", "netns", "mount_ro", "fs_root", "proc_private", "uid", "uid_distinct", "rlimits",
            "seccomp"} <= set(iso["held"])
    assert iso["fs_root"] and "/dev/null" in iso["fs_root_binds"]  # the report names the root the code saw


def test_a_static_check_bypass_is_rejected_and_the_check_called_advisory(embedded_stack):
    bypass = patched(GOOD, RESET_ANCHOR, "        if seed == 1_000_013:\n            __builtins__['__import__']"
                                         "('os').fork()\n" + RESET_ANCHOR)
    fake = FakeOpenAI(script=[{"json": completion(f"```python\n{bypass}```")}] * 2)
    try:
        with allowed(embedded_stack, fake.base_url, services=("environment",)):
            resp, states = _generate(embedded_stack.stub("environment"), _llm_spec(fake, "llm_bypass", 1),
                                     run_id="envbypass")
    finally:
        fake.close()
    assert states[-1] == t.JOB_STATE_SUCCEEDED, resp.job.error
    (record,) = resp.environments
    assert record.status == E.VALIDATION_STATUS_REJECTED
    assert any(r.startswith("static:") and "use of __builtins__" in r for r in record.rejection_reasons)
    store, key = open_uri(record.validation_report.uri)
    assert json.loads(store.get_bytes(key))["static_check_advisory"] is True


def _register_accepted(domain, name: str, source: str, tools: list) -> None:
    """Index a module as if it had passed validation: what a module that slips past the advisory
    static check gets. The kernel layers must contain it while it is served."""
    domain.registry.register(run_id="hostile", capability=name, mode="GENERATION_MODE_LLM", source=source,
                             report={"status": "ACCEPTED", "reasons": [], "numbers": {}, "isolation": {}},
                             target={"name": "store"}, tool_schemas=tools)


def test_hostile_modules_served_by_the_service_harm_no_other_worker(embedded_stack):
    """The hostile-environment table (tests/unit/environment/test_hostile_envs.py) through the real
    service over gRPC: a victim episode is opened first; each hostile module, served as if it had
    been accepted, fails RESOURCE_EXHAUSTED naming its violation; the victim episode keeps
    answering and the service stays SERVING."""
    from pathlib import Path

    from tests.unit.environment.test_hostile_envs import (
        BAIT_TMP,
        CASES,
        PASSWD_ROOT,
        REJECT,
        SECRET,
        plant_bait,
    )
    from tests.unit.environment.test_hostile_envs import module as hostile

    stub, domain = embedded_stack.stub("environment"), embedded_stack.domain("environment")
    tools = make_env("precondition_verification", "store").tool_schemas()
    _register_accepted(domain, "hostile_victim", GOOD, tools)
    victim = stub.ResetEpisode(E.ResetEpisodeRequest(environment=t.EnvironmentRef(name="hostile_victim"), seed=4))
    victim_pid = domain.episodes.episodes[victim.episode_id].worker.transport.worker_pid
    bait = plant_bait(Path(embedded_stack.root), domain.episodes.episodes[victim.episode_id].worker.transport.scratch)
    probe = t.ToolCall(id="c1", name="get_order_details", arguments_json='{"order_id": "#W0000000"}')
    try:
        for name, body, full, _kernel in CASES:
            assert full[0] == REJECT  # with every layer on, each case is rejected
            _register_accepted(domain, f"hostile_{name}", hostile(body, victim_pid, bait), [])
            with pytest.raises(grpc.RpcError) as err:
                stub.ResetEpisode(E.ResetEpisodeRequest(environment=t.EnvironmentRef(name=f"hostile_{name}"), seed=1))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, err.value.details())
            assert f"sandbox violation ({full[1]})" in err.value.details(), (name, err.value.details())
            assert SECRET not in err.value.details() and PASSWD_ROOT not in err.value.details(), name
            out = stub.StepEpisode(E.StepEpisodeRequest(episode_id=victim.episode_id, tool_call=probe))
            assert out.observation.role == "tool" and not out.done, name     # the victim still answers
            assert domain.episodes.episodes[victim.episode_id].worker.transport.worker_pid == victim_pid
    finally:
        stub.CloseEpisode(E.CloseEpisodeRequest(episode_id=victim.episode_id))
        Path(bait[BAIT_TMP]).unlink(missing_ok=True)
    with open_channel(Endpoint(embedded_stack.targets["environment"])) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="")).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_host_files_are_not_in_the_sandbox_with_the_audit_hook_off(embedded_stack, monkeypatch):
    """Issue #28: the hostile table's file-read cases served by the real service with its workers'
    audit hook off (what TRACE_ENVIRONMENT_SANDBOX_AUDIT_HOOK=false sets, applied to the running
    service here), so only the kernel layers stand between the module and a bait file in the shared
    temp dir, the password file, a rollout file in this stack's own artifact store and a file in the
    victim episode's scratch dir. Each module fails to load with what it read in its error text (how
    the attack reached the validation report): the caller sees FAILED_PRECONDITION saying the file
    is not there, never its content."""
    from pathlib import Path

    from tests.unit.environment.test_hostile_envs import (
        ABSENT,
        BAIT_TMP,
        CASES,
        PASSWD_ROOT,
        SECRET,
        plant_bait,
    )
    from tests.unit.environment.test_hostile_envs import module as hostile

    stub, domain = embedded_stack.stub("environment"), embedded_stack.domain("environment")
    monkeypatch.setattr(domain.episodes, "sandbox", domain.sandbox.model_copy(update={"audit_hook": False}))
    tools = make_env("precondition_verification", "store").tool_schemas()
    _register_accepted(domain, "bait_victim", GOOD, tools)
    victim = stub.ResetEpisode(E.ResetEpisodeRequest(environment=t.EnvironmentRef(name="bait_victim"), seed=4))
    worker = domain.episodes.episodes[victim.episode_id].worker
    assert not worker.isolation["audit_hook"] and worker.isolation["fs_root"]
    bait = plant_bait(Path(embedded_stack.root), worker.transport.scratch)
    reads = [(name, body) for name, body, _full, _kernel in CASES if name.startswith("read_")]
    try:
        assert len(reads) == 4
        for name, body in reads:
            _register_accepted(domain, f"bait_{name}", hostile(body, 0, bait), [])
            with pytest.raises(grpc.RpcError) as err:
                stub.ResetEpisode(E.ResetEpisodeRequest(environment=t.EnvironmentRef(name=f"bait_{name}"), seed=1))
            details = err.value.details()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, (name, details)
            assert "exfiltrated" in details and ABSENT in details, (name, details)
            assert SECRET not in details and PASSWD_ROOT not in details, (name, details)
    finally:
        stub.CloseEpisode(E.CloseEpisodeRequest(episode_id=victim.episode_id))
        Path(bait[BAIT_TMP]).unlink(missing_ok=True)
