"""The rehearsal's translation of the rendered chart and the cluster config (tracectl/rehearsal/):
the real chart rendered by the real helm with the cluster example's values, each service's process
environment, vLLM's command and the rewritten run config checked field by field."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from trace_common.config import SERVICE_NAMES
from trace_common.errors import FailedPrecondition, InvalidArgument
from tracectl.rehearsal import local
from tracectl.rehearsal.budgets import TINY, rehearsal_config
from tracectl.rehearsal.chart import render
from tracectl.rehearsal.local import KUBERNETES_ONLY, SERVED_NAME, StandIns, service_env, vllm_command
from tracectl.rehearsal.rehearse import OVERLAY, RELEASE, Paths, rehearse
from tracectl.run.config import RunConfig

REPO = Path(__file__).resolve().parents[3]
VALUES = REPO / "charts" / "trace" / "values-tau2-retail-vllm.yaml"
CLUSTER = REPO / "examples" / "tau2-retail-vllm.yaml"


@pytest.fixture(scope="module")
def rendered():
    return render(Paths().chart, [VALUES, OVERLAY], Paths().helm, release=RELEASE)


@pytest.fixture
def stand(rendered, tmp_path, monkeypatch):
    # Linux's default range, so that the host's own setting cannot change these tests (it has its own below)
    monkeypatch.setattr(local, "ephemeral_range", lambda path=None: (32768, 60999))
    s = StandIns.of(rendered, tmp_path, Path("/host/tau2"))
    s.add_path("/data/tau2", Path("/host/tau2"), "data")
    s.add_path("/adapters", tmp_path / "adapters", "adapters")
    vllm_command(rendered.container("Deployment", f"{RELEASE}-vllm"), s, tmp_path / "m", Path("/py"))  # as rehearse()
    return s


def envs(rendered, stand):
    return {n: service_env(rendered.container("Deployment", f"{RELEASE}-{n}"), n, stand) for n in SERVICE_NAMES}


def test_every_in_cluster_address_gets_a_distinct_local_port(rendered, stand):
    targets = rendered.service_targets()
    assert {"trace-rollout:50051", "trace-trainer:50054", "trace-vllm:8000", "trace-minio:9000"} <= set(targets)
    ports = list(stand.ports.values())
    assert len(ports) == len(set(ports))
    assert all(v.startswith("127.0.0.1:") for v in stand.addresses.values())
    # the headless Service reaches the same container port as the plain one
    assert stand.addresses["trace-minio:9000"] == stand.addresses["trace-minio-headless:9000"]
    # outside the kernel's ephemeral range (the fixture's 32768-60999): no socket it numbers takes one
    assert all(local.LOWEST_PORT <= p < 30000 or p > 60999 for p in ports)


@pytest.mark.parametrize(("text", "expect"), [
    ("32768\t60999\n", (32768, 60999)),
    ("1024 65000", (1024, 65000)),
    ("not numbers", (49152, 65535)),
    (None, (49152, 65535)),                       # no such file (not Linux): IANA's range
])
def test_ephemeral_range_is_read_from_the_kernel(tmp_path, text, expect):
    path = tmp_path / "ip_local_port_range"
    if text is not None:
        path.write_text(text)
    assert local.ephemeral_range(path) == expect


@pytest.mark.skipif(not local.EPHEMERAL_RANGE_FILE.is_file(), reason="not Linux: no ip_local_port_range")
def test_ephemeral_range_is_this_kernels():
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    assert local.ephemeral_range() == tuple(int(x) for x in text.split())


@pytest.mark.parametrize(("ephemeral", "inside", "outside"), [
    ((32768, 60999), [10000, 29999, 61000, 65535], [9999, 30000, 32767, 32768, 60999]),   # Linux's default
    ((49152, 65535), [10000, 29999, 32768, 49151], [30000, 32767, 49152, 65535]),          # IANA's
    ((10000, 65535), [], [10000, 20000, 65535]),                                             # no room
])
def test_candidate_ports_avoid_the_ephemeral_and_nodeport_ranges(ephemeral, inside, outside):
    candidates = set(local.candidate_ports(ephemeral))
    assert set(inside) <= candidates and not set(outside) & candidates


def _two_free_adjacent_ports() -> int:
    for port in range(20000, 30000, 7):
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise AssertionError("no two adjacent free ports between 20000 and 30000")


def test_free_ports_are_distinct_free_and_outside_the_ephemeral_range():
    ports = local.free_ports(12, ephemeral=(32768, 60999))
    assert len(set(ports)) == 12 and all(local.LOWEST_PORT <= p < 30000 or p > 60999 for p in ports)
    for p in ports:                               # free: each binds now
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_passed_over_and_too_few_is_a_clear_error(monkeypatch):
    low = _two_free_adjacent_ports()
    monkeypatch.setattr(local, "LOWEST_PORT", low)          # candidates: low and low + 1
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", low))
        busy.listen()
        assert local.free_ports(1, ephemeral=(low + 2, 65535)) == [low + 1]
        with pytest.raises(FailedPrecondition, match="only 1 of the 2 ports.*narrow it"):
            local.free_ports(2, ephemeral=(low + 2, 65535))
    with pytest.raises(FailedPrecondition, match="no room.*ip_local_port_range is .*: narrow it"):
        local.free_ports(3, ephemeral=(low + 2, 65535))


def test_no_room_for_ports_is_recorded_not_raised(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(local, "ephemeral_range", lambda path=None: (local.LOWEST_PORT, 65535))
    work = tmp_path / "w"
    assert rehearse(CLUSTER, [VALUES], work, tmp_path) == 1
    record = json.loads((work / "rehearsal.json").read_text())
    assert "no room" in record["error"] and record["run_exit"] is None
    assert "could not bring the cluster up" in capsys.readouterr().out


@pytest.mark.parametrize(("service", "var", "expect"), [
    ("rollout", "TRACE_ROLLOUT_HOST", lambda s: "127.0.0.1"),
    ("rollout", "TRACE_ROLLOUT_PORT", lambda s: s.address("rollout", "grpc").split(":")[1]),
    ("inference", "TRACE_INFERENCE_METRICS_PORT", lambda s: s.address("inference", "metrics").split(":")[1]),
    ("inference", "TRACE_INFERENCE_HTTP_HOST", lambda s: "127.0.0.1"),
    ("inference", "TRACE_INFERENCE_HTTP_PORT", lambda s: s.address("inference", "http").split(":")[1]),
    ("trainer", "TRACE_TRAINER_ENVIRONMENT_ADDRESS", lambda s: s.address("environment", "grpc")),
    ("trainer", "TRACE_TRAINER_S3_ENDPOINT", lambda s: s.address("minio", "s3")),
    ("trainer", "TRACE_TRAINER_ENDPOINTS",
     lambda s: json.dumps({"vllm": {"base_url": f"http://{s.address('vllm', 'http')}/v1"}}, separators=(",", ":"))),
    ("trainer", "TRACE_TRAINER_DATA_ROOTS", lambda s: json.dumps(["/host/tau2"])),
    ("trainer", "TRACE_TRAINER_VLLM_ADAPTER_ROOT", lambda s: str(s.workdir / "adapters")),
    ("environment", "TRACE_ENVIRONMENT_SANDBOX_BACKEND", lambda s: "process"),
    # the operator's extraEnv for the trainer: tau2's user simulator is the served model
    ("trainer", "TRACE_TAU2_USER_BASE_URL", lambda s: f"http://{s.address('vllm', 'http')}/v1"),
    ("trainer", "TRACE_TAU2_USER_MODEL", lambda s: SERVED_NAME),
    ("environment", "TRACE_ENVIRONMENT_VALIDATION_GROUPS", lambda s: "2"),      # the overlay's budgets
    ("inference", "TRACE_INFERENCE_DEVICE", lambda s: "cpu"),                    # the chart's cuda, on CPUs here
    ("inference", "TRACE_INFERENCE_DTYPE", lambda s: "bfloat16"),                # the values file's, kept
    ("analysis", "TRACE_ANALYSIS_LLM_MAX_TOKENS", lambda s: "1024"),
    ("analysis", "TRACE_ANALYSIS_LLM_RESPONSE_FORMAT", lambda s: "json_schema"),
    ("analysis", "HOME", lambda s: str(s.workdir / "analysis" / "tmp")),
    ("analysis", "HF_HOME", lambda s: str(s.workdir / "analysis" / "tmp" / "huggingface")),
])
def test_each_service_gets_the_charts_setting_at_its_stand_in(rendered, stand, service, var, expect):
    env = envs(rendered, stand)[service]
    got = env[var]
    if var.endswith("_ENDPOINTS"):
        assert json.loads(got) == json.loads(expect(stand))
    else:
        assert got == expect(stand)


def test_the_gpu_device_stand_in_is_listed(rendered, stand):
    envs(rendered, stand)
    assert [c for c in stand.changes if "TRACE_INFERENCE_DEVICE cuda -> cpu" in c]


def test_tokens_and_keys_are_the_charts_own_secrets(rendered, stand):
    secrets = rendered.secrets()
    env = envs(rendered, stand)
    tokens = {env[n][f"TRACE_{n.upper()}_AUTH_TOKEN"] for n in SERVICE_NAMES}
    assert tokens == {secrets[("trace-auth", "token")]} and len(tokens.pop()) >= 32
    assert env["trainer"]["TRACE_TRAINER_S3_SECRET_KEY"] == secrets[("trace-minio", "secretKey")]


def test_kubernetes_only_settings_and_host_trace_variables_stay_out(rendered, stand, monkeypatch):
    monkeypatch.setenv("TRACE_ROLLOUT_LOG_LEVEL", "DEBUG")          # a shell variable must not override the chart
    monkeypatch.setenv("TRACE_TRAINER_ENDPOINTS", '{"evil": {"base_url": "http://x"}}')
    env = envs(rendered, stand)
    flat = {k for e in env.values() for k in e}
    assert not flat & set(KUBERNETES_ONLY)
    assert env["rollout"]["TRACE_ROLLOUT_LOG_LEVEL"] == "INFO"
    assert "evil" not in env["trainer"]["TRACE_TRAINER_ENDPOINTS"]
    hosts = {a.split(":")[0] + ":" for a in rendered.service_targets()}
    for e in env.values():
        for k, v in e.items():
            assert not any(h in v for h in hosts), (k, v)   # no in-cluster address left


def test_vllm_runs_the_charts_arguments_with_smollm2_and_the_cpu_flags(rendered, stand, tmp_path):
    cmd, env = vllm_command(rendered.container("Deployment", f"{RELEASE}-vllm"), stand, tmp_path / "m",
                            Path("/venv/bin/python"))
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    args = cmd[3:]

    def value(flag):
        return args[args.index(flag) + 1]

    assert value("--model") == str(tmp_path / "m") and value("--served-model-name") == SERVED_NAME
    assert value("--port") == stand.address("vllm", "http").split(":")[1] and value("--host") == "127.0.0.1"
    for kept in (("--max-loras", "4"), ("--max-lora-rank", "16"), ("--tool-call-parser", "hermes"),
                 ("--logprobs-mode", "processed_logprobs")):
        assert value(kept[0]) == kept[1], kept
    assert "--enable-lora" in args and "--enable-auto-tool-choice" in args
    assert int(value("--max-model-len")) == local.SMOLLM2_CONTEXT
    assert not set(args) & set(local.VLLM_GPU_FLAGS) and "Qwen/Qwen3-30B-A3B-Instruct-2507" not in args
    assert "--no-enable-chunked-prefill" in args and value("--dtype") == "float32"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


@pytest.mark.parametrize(("shell", "value", "why"), [
    (None, "0", "no core kept out of its decoding threads for its scheduler"),
    ("1", "1", "from this shell")])
def test_vllm_decodes_on_every_core_unless_the_shell_says_otherwise(rendered, stand, tmp_path, monkeypatch, shell,
                                                                    value, why):
    if shell is None:
        monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    else:
        monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", shell)
    before = len(stand.changes)
    _, env = vllm_command(rendered.container("Deployment", f"{RELEASE}-vllm"), stand, tmp_path / "m", Path("/py"))
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == value
    said = [c for c in stand.changes[before:] if "VLLM_CPU_NUM_OF_RESERVED_CPU" in c]   # the change is listed
    assert said == [f"vLLM: VLLM_CPU_NUM_OF_RESERVED_CPU={value} ({why})"]


def test_the_record_lists_every_change_vllm_command_made(rendered, stand, tmp_path, capsys):
    """The model line and the decoding-threads line both reach rehearsal.json and the output (only the
    last line did: the model line went missing once vllm_command said two things)."""
    from tracectl.rehearsal.rehearse import Record, _vllm

    class Started:   # the vLLM process, as far as _vllm sees it: started, then healthy at once
        def start(self, *a, **k):
            pass

        def wait(self, *a, **k):
            return 0.0

    python = tmp_path / "python"
    python.write_text("")
    record = Record(config="c", values=[], workdir=str(tmp_path))
    _vllm(rendered, Started(), stand, tmp_path, Paths(vllm_python=python), tmp_path / "m", record)
    out = capsys.readouterr().out
    for said in ("SmolLM2-135M-Instruct", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        assert [c for c in record.changes if said in c] and said in out, said


def test_the_cluster_config_becomes_a_valid_tiny_local_one(stand):
    cluster = yaml.safe_load(CLUSTER.read_text())
    cfg, changes = rehearsal_config(cluster, stand)
    parsed = RunConfig.model_validate(cfg)
    text = json.dumps(cfg)
    assert not any(a.split(":")[0] + ":" in text for a in stand.addresses)   # no in-cluster address left
    assert "/data/tau2" not in text and "Qwen" not in text
    assert parsed.services == {n: stand.address(n, "grpc") for n in SERVICE_NAMES}
    assert parsed.store.s3_endpoint == stand.address("minio", "s3")
    assert parsed.target.uri == "/host/tau2/retail"
    assert parsed.base_agent.name == parsed.target.user_simulator.model == parsed.evaluation.gepa.model == SERVED_NAME
    assert parsed.base_agent.endpoint == f"http://{stand.address('vllm', 'http')}/v1"
    assert parsed.training.executor == "local" and parsed.training.grpo["rollout_backend"] == "vllm"
    # the config's shape stays: the same arms, modes and mechanisms
    assert parsed.evaluation.arms == cluster["evaluation"]["arms"]
    assert (parsed.analysis.mode, parsed.environments.mode) == ("llm", "llm")
    assert parsed.training.grpo["guidance_fraction"] == cluster["training"]["grpo"]["guidance_fraction"]
    assert len(changes) >= len(TINY)
    for dotted, value, _ in TINY:
        node = cfg
        for key in dotted.split("."):
            node = node[key]
        assert node == value, dotted


def test_values_the_chart_refuses_are_invalid_argument_with_helms_reason(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  replicaCount: many\n")
    with pytest.raises(InvalidArgument, match="--values") as err:
        render(Paths().chart, [bad], Paths().helm)
    assert "replicaCount" in str(err.value)
