"""values.yaml / values.schema.json: bad values are rejected by helm with a message naming the
field, the service blocks share one shape, the README tables every top-level value, and the env
the chart renders is accepted by the services' real settings models.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.chart.helm import CHART, FULLNAME, NAMESPACE, SERVICES, render, template
from tests.support.tls import self_signed

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
#: Keys only some service blocks have (everything else is the shared shape).
SERVICE_EXTRAS = {"environment": {"sandbox", "dataRoots"}, "trainer": {"jobs", "dataRoots"}, "inference": {"http", "device", "dtype"},
                  "rollout": {"dataRoots"}, "analysis": {"rolloutRoots"}}

# --set arguments helm must refuse, and the field path its message must name.
BAD_VALUES = [
    ("rollout.replicaCount=-1", "rollout.replicaCount"),
    ("analysis.replicaCount=two", "analysis.replicaCount"),
    ("rollout.image.tag=latest", "rollout.image.tag"),
    ("vllm.image.tag=latest", "vllm.image.tag"),
    ("trainer.image.pullPolicy=Sometimes", "trainer.image.pullPolicy"),
    ("vllm.maxLoraRank=48", "vllm.maxLoraRank"),
    ("vllm.tensorParallelSize=0", "vllm.tensorParallelSize"),
    ("vllm.gpuMemoryUtilization=1.5", "vllm.gpuMemoryUtilization"),
    ("inference.device=gpu", "inference.device"),
    ("inference.dtype=int8", "inference.dtype"),
    ("dataVolume.existingClaim=Bad_Claim", "dataVolume.existingClaim"),
    ("inference.gpu.pool=tpu", "inference.gpu.pool"),
    ("gpuPools.trainer.gpusPerPod=0", "gpuPools.trainer.gpusPerPod"),
    (r"rollout.resources.limits.nvidia\.com/gpu=1", "rollout.resources.limits"),
    ("rollout.service.port=70000", "rollout.service.port"),
    ("inference.http.port=0", "inference.http.port"),
    ("environment.logLevel=VERBOSE", "environment.logLevel"),
    ("artifacts.bucket=Bad_Bucket", "artifacts.bucket"),
    ("artifacts.s3.endpoint=http://minio:9000", "artifacts.s3.endpoint"),
    ("minio.enabled=false", "artifacts.s3.endpoint"),
    ("minio.enabled=false,artifacts.s3.endpoint=s3.example.com:443", "artifacts.s3.existingSecret"),
    ("artifacts.s3.endpoint=s3.example.com:443", "artifacts.s3.endpoint"),  # with the in-chart MinIO on
    ("tls.enabled=true", "tls.existingSecret"),
    ("serviceMonitor.interval=30", "serviceMonitor.interval"),
    ("podSecurity.runAsUser=0", "podSecurity.runAsUser"),
    ("rollout.extraEnv[0].name=HF_TOKEN,rollout.extraEnv[0].value=hf_abc", "rollout.extraEnv.0"),
    ("rollout.extraEnv[0].name=OPENAI_API_KEY,rollout.extraEnv[0].value=sk", "rollout.extraEnv.0"),
    ("rollout.extraEnv[0].name=token_file,rollout.extraEnv[0].value=/t", "rollout.extraEnv.0"),
    ("rollout.extraEnv[0].name=AWS_SECRET_ACCESS_KEY,rollout.extraEnv[0].value=x", "rollout.extraEnv.0"),
    ("llm.baseUrl=llm.example.com", "llm.baseUrl"),
    ("trainer.jobs.module=not a module", "trainer.jobs.module"),
    ("trainer.surprise=1", "Additional property surprise"),
    ("gpuPools.tpu.gpusPerPod=1", "Additional property tpu"),
    ("replicas=3", "Additional property replicas"),
    ("modelVolume.mountPath=weights", "modelVolume.mountPath"),
    ("modelVolume.mountPath=/", "modelVolume.mountPath"),
    ("modelVolume.mountPath=/weights/", "modelVolume.mountPath"),
    ("modelVolume.mountPath=/a/../tmp", "modelVolume.mountPath"),
    ("modelVolume.download.dir=a/b", "modelVolume.download.dir"),
]

# --set arguments the templates refuse (helm's `fail`), and what the message must say.
BAD_RENDERS = [
    # the served name must be where the init container puts the weights
    ("modelVolume.existingClaim=w,modelVolume.download.repo=Q/M,modelVolume.download.dir=M,vllm.model=Q/M",
     'vllm.model must be the directory modelVolume.download fills, "/weights/M"'),
    ("modelVolume.existingClaim=w,modelVolume.download.repo=Q/M",
     "modelVolume.download.dir must be one directory name under modelVolume.mountPath"),
    # a download with nowhere to go, or with several writers
    ("modelVolume.download.repo=Q/M,modelVolume.download.dir=M",
     'modelVolume.download.repo "Q/M" needs modelVolume.existingClaim'),
    ("modelVolume.existingClaim=w,modelVolume.download.repo=Q/M,modelVolume.download.dir=M,vllm.enabled=false",
     "modelVolume.download runs in the vLLM pod's init container, and vllm.enabled is false"),
    ("modelVolume.existingClaim=w,modelVolume.download.repo=Q/M,modelVolume.download.dir=M,vllm.model=/weights/M,"
     "vllm.replicaCount=2", "modelVolume.download with vllm.replicaCount 2"),
    # a mount path another mount of the same pods already has, holds, or lies in
    ("modelVolume.existingClaim=w,modelVolume.mountPath=/tmp", 'modelVolume.mountPath "/tmp" overlaps "/tmp"'),
    ("modelVolume.existingClaim=w,modelVolume.mountPath=/models/w", 'modelVolume.mountPath "/models/w" overlaps "/models"'),
    ("modelVolume.existingClaim=w,modelVolume.mountPath=/etc", 'modelVolume.mountPath "/etc" overlaps "/etc/trace/tls"'),
    ("modelVolume.existingClaim=w,modelVolume.mountPath=/adapters", 'modelVolume.mountPath "/adapters" overlaps "/adapters"'),
    # the data volume: plain absolute directories, clear of every other mount (the weights' included)
    ("dataVolume.existingClaim=d,dataVolume.mountPath=data", "dataVolume.mountPath must be an absolute path"),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/data/", "dataVolume.mountPath must be an absolute path"),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/tmp/tau2", 'dataVolume.mountPath "/tmp/tau2" overlaps "/tmp"'),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/weights/d,modelVolume.existingClaim=w",
     'dataVolume.mountPath "/weights/d" overlaps "/weights"'),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/etc", 'dataVolume.mountPath "/etc" overlaps "/etc/trace/tls"'),
    # nor hide what the images hold (code, Python environment, system directories)
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/app", 'dataVolume.mountPath "/app" would hide /app'),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/opt/venv", 'dataVolume.mountPath "/opt/venv" would hide /opt'),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/proc/tau2", 'dataVolume.mountPath "/proc/tau2" would hide /proc'),
    ("modelVolume.existingClaim=w,modelVolume.mountPath=/usr", 'modelVolume.mountPath "/usr" would hide /usr'),
    ("modelVolume.existingClaim=w,modelVolume.mountPath=/opt", 'modelVolume.mountPath "/opt" would hide /opt'),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/usr/lib", 'dataVolume.mountPath "/usr/lib" would hide /usr'),
    ("dataVolume.existingClaim=d,dataVolume.mountPath=/etc/ssl", 'dataVolume.mountPath "/etc/ssl" would hide /etc'),
    # the adapter claim: the same rules
    ("vllm.adapterVolume.existingClaim=a,vllm.adapterVolume.mountPath=/dev/shm",
     'vllm.adapterVolume.mountPath "/dev/shm" overlaps "/dev/shm"'),
    ("vllm.adapterVolume.existingClaim=a,vllm.adapterVolume.mountPath=/usr", 'vllm.adapterVolume.mountPath "/usr" would hide'),
    ("vllm.adapterVolume.existingClaim=a,vllm.adapterVolume.mountPath=/adapters/",
     "vllm.adapterVolume.mountPath must be an absolute path of plain directory names"),
    # a CUDA device for an inference pod without a GPU, or past its GPUs
    ("inference.device=cuda:1", 'inference.device "cuda:1" names a GPU the inference pod does not have: it gets 1'),
    ("inference.gpu.enabled=false,inference.device=cuda", 'inference.device "cuda" needs a GPU in the inference pod'),
]


@pytest.mark.parametrize(("setting", "message"), BAD_RENDERS, ids=[b[0] for b in BAD_RENDERS])
def test_templates_refuse_inconsistent_values_saying_why(setting, message):
    proc = template("--set", setting)
    assert proc.returncode != 0, f"helm accepted {setting}"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(("setting", "field"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_schema_rejects_bad_values_naming_the_field(setting, field):
    proc = template("--set", setting)
    assert proc.returncode != 0, f"helm accepted {setting}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert field in proc.stderr, proc.stderr


@pytest.mark.parametrize("setting", [
    "rollout.extraEnv[0].name=HF_TOKEN,rollout.extraEnv[0].valueFrom.secretKeyRef.name=hf,"
    "rollout.extraEnv[0].valueFrom.secretKeyRef.key=token",
    "rollout.extraEnv[0].name=PYTHONWARNINGS,rollout.extraEnv[0].value=ignore",
    # a count of tokens is no credential (the rehearsal's values set these)
    "analysis.extraEnv[0].name=TRACE_ANALYSIS_LLM_MAX_TOKENS,analysis.extraEnv[0].value=\"256\"",
    "vllm.maxLoraRank=128",
    "artifacts.prefix=team-a/runs",
    "minio.enabled=false,artifacts.s3.endpoint=s3.example.com:443,artifacts.s3.existingSecret=s3",
    # weights the operator filled (no download): vllm.model is theirs to name
    "modelVolume.existingClaim=w,vllm.model=/weights/M,modelRoots[0]=/weights",
])
def test_schema_accepts_good_values(setting):
    proc = template("--set", setting)
    assert proc.returncode == 0, proc.stderr


def test_values_yaml_matches_its_schema():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    errors = [f"{e.json_path}: {e.message}" for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(VALUES)]
    assert not errors, errors
    assert SCHEMA["additionalProperties"] is False
    assert set(SCHEMA["properties"]) - {"global"} == set(VALUES)
    for name in (*SERVICES, "vllm"):
        block = SCHEMA["properties"][name]
        assert block["additionalProperties"] is False, name
        assert set(block["properties"]) == set(VALUES[name]), name
        for key, prop in block["properties"].items():
            assert prop.get("description") or "$ref" in prop, f"{name}.{key} has no description"


def test_service_blocks_share_one_shape():
    def shape(d):
        return {k: shape(v) if isinstance(v, dict) and k in {"image", "service", "metrics", "gpu",
                                                              "podDisruptionBudget", "probes"} else None
                for k, v in d.items()}

    shapes = {s: shape({k: v for k, v in VALUES[s].items() if k not in SERVICE_EXTRAS.get(s, set())})
              for s in SERVICES}
    first = shapes[SERVICES[0]]
    for s in SERVICES:
        assert shapes[s] == first, s
    required = {"enabled", "replicaCount", "image", "resources", "nodeSelector", "tolerations", "affinity",
                "service", "metrics", "gpu"}
    assert required <= set(first)
    assert set(first["image"]) == {"repository", "tag", "pullPolicy"}
    assert set(first["metrics"]) == {"enabled", "port"} and set(first["gpu"]) == {"enabled", "pool", "count"}
    assert set(VALUES["gpuPools"]) == {"rollout", "trainer", "inference"}
    for pool in VALUES["gpuPools"].values():
        assert set(pool) == {"nodeSelector", "tolerations", "gpusPerPod"}


def test_readme_tables_every_top_level_value():
    readme = (CHART / "README.md").read_text()
    rows = set(re.findall(r"^\| `([A-Za-z]+)[.`]", readme, re.M))
    missing = set(VALUES) - rows
    assert not missing, f"README values table lacks {sorted(missing)}"


def _settings_class(service: str):
    """The service's own settings model (services/<name>/settings.py)."""
    mod = importlib.import_module(f"services.{service}.settings")
    return next(v for k, v in vars(mod).items() if k.endswith("Settings") and k != "ServiceSettings"
                and isinstance(v, type))


def _reads(cls, name: str) -> bool:
    """Whether settings class `cls` reads variable `name` (a field, or a nested sandbox field)."""
    prefix = cls.model_config["env_prefix"]
    if name[len(prefix):].lower() in cls.model_fields:
        return True
    if cls.__name__ == "EnvironmentSettings":
        from services.environment.settings import sandbox_env_names

        return name in sandbox_env_names()
    return False


@pytest.mark.parametrize("value_set", ["defaults", "external-minio", "gpu-off", "tls"])
@pytest.mark.parametrize("service", SERVICES)
def test_rendered_env_is_accepted_by_the_service_settings(value_set, service, monkeypatch, tmp_path):
    r = render(value_set)
    # the mounted TLS Secret's files (the settings load the pair), stood in for by a fresh one
    cert, key = self_signed(tmp_path) if value_set == "tls" else (None, None)
    (c,) = r.get("Deployment", f"{FULLNAME}-{service}")["spec"]["template"]["spec"]["containers"]
    prefix = f"TRACE_{service.upper()}_"
    cls = _settings_class(service)
    for k in list(os.environ):
        if k.startswith("TRACE_"):
            monkeypatch.delenv(k)
    unknown = []
    for e in c["env"]:
        if "valueFrom" in e:  # resolved by the kubelet: stand-ins of the right kind
            value = NAMESPACE if "fieldRef" in e["valueFrom"] else "from-secret-" + "x" * 16
        elif e["name"].endswith(("_TLS_CERT_FILE", "_TLS_KEY_FILE")):
            assert e["value"].startswith("/etc/trace/tls/"), e
            value = str(cert if e["name"].endswith("_CERT_FILE") else key)
        else:
            value = e["value"]
        monkeypatch.setenv(e["name"], value)
        if e["name"].startswith(prefix):
            if not _reads(cls, e["name"]):
                unknown.append(e["name"])
    assert not unknown, f"env vars no settings field reads: {unknown}"
    s = cls()
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    metrics_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics")
    assert (s.host, s.port, s.metrics_host, s.metrics_port) == ("0.0.0.0", grpc_port, "0.0.0.0", metrics_port)
    assert s.auth_token is not None and s.artifact_root.startswith("s3://") and s.s3_endpoint
    assert s.s3_access_key and s.s3_secret_key is not None
    assert s.s3_secure is (value_set == "external-minio")
    assert (s.tls_cert_file is not None) is (value_set == "tls")
    rendered = {e["name"]: e.get("value") for e in c["env"]}
    for var, field in (("MAX_CONCURRENT_RPCS", "max_concurrent_rpcs"), ("MAX_CONCURRENT_JOBS", "max_concurrent_jobs")):
        assert getattr(s, field) == int(rendered[prefix + var]), var     # the chart's value, rendered and read
    if service == "inference":   # the Service's http port reaches the API only if it listens beyond loopback
        http_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
        assert (s.http_host, s.http_port) == ("0.0.0.0", http_port) and http_port == 8000
    if service in ("rollout", "environment", "trainer"):   # gpu-off lists /data/tau2 as each one's data root
        assert s.data_roots == ([Path("/data/tau2")] if value_set == "gpu-off" else [])
