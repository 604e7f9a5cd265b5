"""The sandbox limits are declared once (SandboxConfig, PodConfig in sandbox/config.py) and nested in
the environment settings: every TRACE_ENVIRONMENT_SANDBOX_* variable the service read before still
sets the same field within the same bounds, keywords spelled like the variables still work, and
fields that are not service settings are refused.
"""

from __future__ import annotations

import annotated_types as at
import pytest
from pydantic import ValidationError

from services.environment.sandbox.config import PodConfig, SandboxConfig
from services.environment.settings import NOT_SETTINGS, EnvironmentSettings, sandbox_env_names


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for k in list(os.environ):
        if k.startswith("TRACE_ENVIRONMENT_"):
            monkeypatch.delenv(k)


def _get(settings: EnvironmentSettings, path: tuple[str, ...]):
    value = settings
    for part in path:
        value = getattr(value, part)
    return value


# Every sandbox variable the environment service read when the limits were declared twice, with the
# bounds of that declaration: (variable, field path, a value at a bound (accepted), a value past it).
LEGACY = [
    ("TRACE_ENVIRONMENT_SANDBOX_BACKEND", ("backend",), "process", "docker"),
    ("TRACE_ENVIRONMENT_SANDBOX_ALLOW_WEAK", ("allow_weak",), "true", "maybe"),
    ("TRACE_ENVIRONMENT_SANDBOX_CPU_SECONDS", ("cpu_seconds",), "86400", "86401"),
    ("TRACE_ENVIRONMENT_SANDBOX_MEMORY_MB", ("memory_mb",), "128", "127"),
    ("TRACE_ENVIRONMENT_SANDBOX_FILE_SIZE_MB", ("file_size_mb",), "1", "0"),
    ("TRACE_ENVIRONMENT_SANDBOX_OPEN_FILES", ("open_files",), "65536", "15"),
    ("TRACE_ENVIRONMENT_SANDBOX_CALL_TIMEOUT_S", ("call_timeout_s",), "3600", "0"),
    ("TRACE_ENVIRONMENT_SANDBOX_STARTUP_TIMEOUT_S", ("startup_timeout_s",), "600", "601"),
    ("TRACE_ENVIRONMENT_SANDBOX_MAX_OUTPUT_KB", ("max_output_kb",), "4", "3"),
    ("TRACE_ENVIRONMENT_SANDBOX_PID_NAMESPACE", ("pid_namespace",), "false", "sometimes"),
    ("TRACE_ENVIRONMENT_SANDBOX_NETWORK_NAMESPACE", ("network_namespace",), "false", "sometimes"),
    ("TRACE_ENVIRONMENT_SANDBOX_MOUNT_NAMESPACE", ("mount_namespace",), "false", "sometimes"),
    ("TRACE_ENVIRONMENT_SANDBOX_DROP_PRIVILEGES", ("drop_privileges",), "false", "sometimes"),
    ("TRACE_ENVIRONMENT_SANDBOX_UID_BASE", ("uid_base",), "0", "-1"),
    ("TRACE_ENVIRONMENT_SANDBOX_UID_COUNT", ("uid_count",), str(1 << 24), str((1 << 24) + 1)),
    ("TRACE_ENVIRONMENT_SANDBOX_SECCOMP", ("seccomp",), "false", "sometimes"),
    ("TRACE_ENVIRONMENT_SANDBOX_AUDIT_HOOK", ("audit_hook",), "false", "sometimes"),
    ("TRACE_ENVIRONMENT_SANDBOX_REQUIRE_NETWORK_ISOLATION", ("require_network_isolation",), "false", "sometimes"),
    ("TRACE_ENVIRONMENT_SANDBOX_SCRATCH_ROOT", ("scratch_root",), "/var/tmp/sandbox", None),
    ("TRACE_ENVIRONMENT_SANDBOX_NAMESPACE", ("pod", "namespace"), "trace-sandbox", None),
    ("TRACE_ENVIRONMENT_SANDBOX_POD_TEMPLATE", ("pod", "template"), "/etc/trace/templates/sandbox-pod.json", None),
    ("TRACE_ENVIRONMENT_SANDBOX_POD_IMAGE", ("pod", "image"), "registry/trace/sandbox:0.1.0", None),
    ("TRACE_ENVIRONMENT_SANDBOX_POD_CPU", ("pod", "cpu"), "500m", None),
    ("TRACE_ENVIRONMENT_SANDBOX_POD_DEADLINE_S", ("pod", "deadline_s"), "60", "59"),
    ("TRACE_ENVIRONMENT_SANDBOX_POD_SCRATCH_MB", ("pod", "scratch_mb"), str(1 << 20), str((1 << 20) + 1)),
]


@pytest.mark.parametrize(("var", "path", "good", "bad"), LEGACY, ids=[r[0] for r in LEGACY])
def test_every_legacy_variable_sets_the_nested_field_within_its_old_bounds(monkeypatch, var, path, good, bad):
    assert sandbox_env_names()[var] == ("sandbox", *path)
    monkeypatch.setenv(var, good)
    s = EnvironmentSettings()
    field = _get(s, ("sandbox", *path))
    expected = {"true": True, "false": False}.get(good, good)
    assert field == (type(field)(expected) if not isinstance(field, bool) else expected)
    assert s.sandbox_config() is s.sandbox
    if bad is not None:
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValidationError) as err:
            EnvironmentSettings()
        assert ".".join(("sandbox", *path)) in str(err.value)


def _bounds(info) -> list[tuple[str, bool]]:
    """(value, accepted) pairs at and past each numeric bound of a field, from its metadata."""
    out = []
    for m in info.metadata:
        if isinstance(m, at.Ge):
            out += [(str(m.ge), True), (str(m.ge - 1), False)]
        elif isinstance(m, at.Gt):
            out += [(str(m.gt), False)]
        elif isinstance(m, at.Le):
            out += [(str(m.le), True), (str(m.le + 1), False)]
    return out


def _field(path: tuple[str, ...]):
    model = SandboxConfig if len(path) == 2 else PodConfig
    return model.model_fields[path[-1]]


CASES = [(var, path, value, ok) for var, path in sandbox_env_names().items() for value, ok in _bounds(_field(path))]


@pytest.mark.parametrize(("var", "path", "value", "accepted"), CASES, ids=[f"{c[0]}={c[2]}" for c in CASES])
def test_every_variable_enforces_the_one_declarations_bounds(monkeypatch, var, path, value, accepted):
    monkeypatch.setenv(var, value)
    if var.endswith("_UID_BASE") and accepted and 0 < int(value):  # the range must not contain nobody (65534)
        monkeypatch.setenv("TRACE_ENVIRONMENT_SANDBOX_UID_COUNT", "1")
    if accepted:
        assert float(_get(EnvironmentSettings(), path)) == float(value)  # every bounded field is a number
    else:
        with pytest.raises(ValidationError, match=".".join(path)):
            EnvironmentSettings()


def test_the_table_covers_every_bounded_field():
    bounded = {var for var, path in sandbox_env_names().items() if _bounds(_field(path))}
    assert bounded and bounded <= {c[0] for c in CASES}
    assert not set(EnvironmentSettings.model_fields) & {f"sandbox_{n}" for n in SandboxConfig.model_fields}


@pytest.mark.parametrize(("kwargs", "path", "expected"), [
    ({"sandbox_call_timeout_s": 20.0}, ("sandbox", "call_timeout_s"), 20.0),
    ({"sandbox_pod_image": "img:1"}, ("sandbox", "pod", "image"), "img:1"),
    ({"sandbox_namespace": "ns"}, ("sandbox", "pod", "namespace"), "ns"),
    ({"sandbox": SandboxConfig(cpu_seconds=7), "sandbox_memory_mb": 256}, ("sandbox", "cpu_seconds"), 7),
    ({"sandbox": SandboxConfig(cpu_seconds=7), "sandbox_memory_mb": 256}, ("sandbox", "memory_mb"), 256),
])
def test_keywords_spelled_like_the_variables(kwargs, path, expected):
    assert _get(EnvironmentSettings(**kwargs), path) == expected


@pytest.mark.parametrize("name", sorted(NOT_SETTINGS))
def test_benchmark_only_fields_are_not_settings(monkeypatch, name):
    monkeypatch.setenv(f"TRACE_ENVIRONMENT_SANDBOX_{name.upper()}", "true")
    with pytest.raises(ValidationError, match=f"TRACE_ENVIRONMENT_SANDBOX_{name.upper()} is not a service setting"):
        EnvironmentSettings()


def test_a_misspelt_sandbox_variable_is_refused(monkeypatch):
    monkeypatch.setenv("TRACE_ENVIRONMENT_SANDBOX_CPU_SECOND", "5")
    with pytest.raises(ValidationError, match="sandbox.cpu_second"):
        EnvironmentSettings()


def test_kubernetes_backend_needs_an_image(monkeypatch):
    monkeypatch.setenv("TRACE_ENVIRONMENT_SANDBOX_BACKEND", "kubernetes")
    with pytest.raises(ValidationError, match="TRACE_ENVIRONMENT_SANDBOX_POD_IMAGE"):
        EnvironmentSettings()
    monkeypatch.setenv("TRACE_ENVIRONMENT_SANDBOX_POD_IMAGE", "registry/trace/sandbox:0.1.0")
    assert EnvironmentSettings().sandbox.backend == "kubernetes"


@pytest.mark.parametrize("mode, allow_weak_setting, weak_allowed", [
    ("GENERATION_MODE_LIBRARY", False, True),   # TRACE's own bundled code: a missing layer is reported
    ("GENERATION_MODE_LLM", False, False),      # code an LLM wrote: refused unless the operator allows it
    ("GENERATION_MODE_LLM", True, True),
    ("GENERATION_MODE_LIBRARY", True, True),
])
def test_weak_isolation_is_allowed_only_for_trusted_library_code(mode, allow_weak_setting, weak_allowed):
    from services.environment.sandbox.parent import SandboxConfig, sandbox_for

    config = SandboxConfig(allow_weak=allow_weak_setting)
    assert sandbox_for(config, mode).allow_weak is weak_allowed
    assert config.allow_weak is allow_weak_setting  # the service's setting itself is never changed
