"""Domain errors' messages and service settings validation."""

import subprocess

import pytest
from pydantic import ValidationError

from services.launch import build
from tests.support.tls import self_signed
from trace_common import errors
from trace_common.config import SERVICE_NAMES


@pytest.mark.parametrize(("kwargs", "expected"), [
    (dict(field="spec.seed", expected="an integer >= 0", got=-1, fix="Set spec.seed=0"),
     "spec.seed: expected an integer >= 0, got -1. Set spec.seed=0"),
    (dict(field="page_size", expected="0..1000"), "page_size: expected 0..1000"),
    (dict(reason="plain reason"), "plain reason"),
    (dict(field="x", got="y" * 300), "x: , got '" + "y" * 119 + "..."),
])
def test_invalid_argument_message(kwargs, expected):
    err = errors.InvalidArgument(**kwargs)
    assert str(err) == expected
    assert err.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(("cls", "code"), [
    (errors.NotFound, "NOT_FOUND"), (errors.FailedPrecondition, "FAILED_PRECONDITION"),
    (errors.Unavailable, "UNAVAILABLE"), (errors.ResourceExhausted, "RESOURCE_EXHAUSTED"),
    (errors.Unauthenticated, "UNAUTHENTICATED"), (errors.Unimplemented, "UNIMPLEMENTED"),
    (errors.ArtifactCorrupted, "DATA_LOSS"),
])
def test_error_codes_are_grpc_names(cls, code):
    import grpc

    assert cls("r").code == code
    assert grpc.StatusCode[code]


@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_settings_read_service_prefixed_env(service, monkeypatch, tmp_path):
    monkeypatch.setenv(f"TRACE_{service.upper()}_PORT", "50999")
    monkeypatch.setenv(f"TRACE_{service.upper()}_ARTIFACT_ROOT", tmp_path.as_uri())
    monkeypatch.setenv("TRACE_OTHER_PORT", "1")
    settings, definition = build(service)
    assert settings.port == 50999
    assert settings.artifact_root == tmp_path.as_uri()
    assert definition.full_names[0].startswith("trace.v1.")


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"artifact_root": "relative/dir"}, "must start with file:///"),
    ({"artifact_root": "s3://bucket"}, "TRACE_ROLLOUT_S3_ENDPOINT"),
    ({"tls_cert_file": "/tmp/cert.pem"}, "tls_cert_file and tls_key_file go together"),
    ({"log_level": "chatty"}, "unknown log level"),
    ({"port": 70000}, "less than or equal to 65535"),
    ({"max_message_bytes": 10}, "greater than or equal to 1024"),
])
def test_bad_settings_say_how_to_fix(overrides, needle):
    with pytest.raises(ValidationError) as info:
        build("rollout", **overrides)
    assert needle in str(info.value)


def test_relative_file_root_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    settings, _ = build("analysis", artifact_root="file://./.trace")
    assert settings.artifact_root == (tmp_path / ".trace").as_uri()


def test_generated_code_never_imports_stdlib_trace():
    import subprocess
    import sys

    code = ("import sys; import trace_common.proto.trace.v1.rollout_service_pb2_grpc, "
            "trace_common.grpc.client; print('trace' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _tls_files(where, case: str) -> tuple[str, str]:
    """A (cert, key) pair for each way TLS settings go wrong, and one that is right."""
    cert, key = self_signed(where)
    (where / "other").mkdir()
    _, other_key = self_signed(where / "other")
    if case == "missing key":
        return str(cert), str(where / "absent.key")
    if case == "not PEM":
        (where / "junk.pem").write_text("not a certificate\n")
        return str(where / "junk.pem"), str(key)
    if case == "mismatched":
        return str(cert), str(other_key)
    if case == "encrypted key":
        enc = where / "enc.key"
        subprocess.run(["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:secret", "-out", str(enc)],
                       check=True, capture_output=True)
        return str(cert), str(enc)
    return str(cert), str(key)


@pytest.mark.parametrize(("case", "needle"), [
    ("missing key", "is not a readable file"),
    ("not PEM", "do not load as a TLS pair"),
    ("mismatched", "do not load as a TLS pair"),
    ("encrypted key", "unencrypted private key"),
    ("good", None),
])
def test_tls_files_are_checked_when_the_settings_load(tmp_path, case, needle):
    cert, key = _tls_files(tmp_path, case)
    if needle is None:
        settings, _ = build("rollout", tls_cert_file=cert, tls_key_file=key)
        assert str(settings.tls_cert_file) == cert
        return
    with pytest.raises(ValidationError) as info:
        build("rollout", tls_cert_file=cert, tls_key_file=key)
    assert needle in str(info.value) and "Traceback" not in str(info.value)
