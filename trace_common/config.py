"""Service settings, read from `TRACE_<SERVICE>_*` environment variables.

One pydantic-settings model per service subclasses `ServiceSettings`; the Helm chart renders
the same variable names. Validation happens here, once, with messages that say how to fix
the value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SERVICE_NAMES = ("rollout", "analysis", "environment", "trainer", "inference")

#: Default ports in a cluster (the chart uses the same). The embedded default binds port 0.
DEFAULT_GRPC_PORTS = {"rollout": 50051, "analysis": 50052, "environment": 50053,
                      "trainer": 50054, "inference": 50055}
DEFAULT_METRICS_PORTS = {"rollout": 9101, "analysis": 9102, "environment": 9103,
                         "trainer": 9104, "inference": 9105}


class ServiceSettings(BaseSettings):
    """Settings every TRACE service shares. Subclasses set `service_name` and the env prefix.

    Example: `TRACE_ROLLOUT_PORT=50051 TRACE_ROLLOUT_AUTH_TOKEN=... python -m services.rollout`.
    """

    service_name: ClassVar[str] = ""
    model_config = SettingsConfigDict(extra="ignore", validate_default=True)

    host: str = Field("127.0.0.1", description="Address the gRPC server binds; 0.0.0.0 in a pod.")
    port: int = Field(0, ge=0, le=65535, description="gRPC port; 0 picks a free one (embedded default).")
    metrics_host: str = Field("127.0.0.1", description="Address of the Prometheus /metrics endpoint.")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus port; 0 picks a free one; -1 is not allowed.")
    auth_token: SecretStr | None = Field(
        None, description="Bearer token required on every gRPC call except the health Check (Kubernetes probes; "
        "health Watch and reflection need it), on the inference service's OpenAI-compatible HTTP API and on "
        "/metrics (metrics_auth). In "
        "Kubernetes it comes from a Secret. Visible ASCII, no whitespace; a blank value is refused at start-up. "
        "Unset disables auth (the service logs a warning).")
    metrics_auth: bool = Field(True, description="With auth_token set, /metrics needs the same bearer token (a "
                               "Prometheus scrape config's `authorization: {credentials: ...}`; the chart's "
                               "ServiceMonitors send the token Secret). false leaves /metrics open to whoever "
                               "reaches its port (the service logs so at start-up). Without auth_token it is open "
                               "like every other surface.")
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain; enables TLS with tls_key_file "
                                       "(gRPC, the inference HTTP API and /metrics).")
    tls_key_file: Path | None = Field(None, description="PEM private key for tls_cert_file.")
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024, le=1 << 30,
                                   description="Largest request/response message; artifacts travel by URI.")
    artifact_root: str = Field("file://./.trace", description="Artifact store root: file:///abs/dir or s3://bucket[/prefix].")
    model_roots: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Where a request may name a model, adapter, composition or gates file "
        "besides built-in agent names and this service's artifact store (trace_common/model_refs.py): absolute "
        "directories (file:///abs/dir or /abs/dir) or s3://bucket[/prefix] on this service's S3 server. A JSON "
        "list or comma-separated; empty (the default) allows the store and built-in agents only. Any other path a "
        "request names is PERMISSION_DENIED before a job exists.")
    s3_endpoint: str | None = Field(None, description="host:port of the S3 server (MinIO) for s3:// roots.")
    s3_access_key: str | None = Field(None, description="S3 access key (from a Secret in Kubernetes).")
    s3_secret_key: SecretStr | None = Field(None, description="S3 secret key (from a Secret in Kubernetes).")
    s3_region: str = Field("us-east-1", description="S3 region; MinIO and rclone accept us-east-1.")
    s3_secure: bool = Field(False, description="Use HTTPS to reach the S3 server.")
    max_concurrent_jobs: int = Field(4, ge=1, le=1024, description="Jobs running at once; more wait as PENDING.")
    max_concurrent_rpcs: int = Field(256, ge=1, le=100_000, description="gRPC calls in progress at once, open "
                                     "streams (Watch…) included; a call past it is refused at once with "
                                     "RESOURCE_EXHAUSTED (retry later). Open streams may take all but 8 of them "
                                     "(half of a cap under 16): the rest stay for the health Check and unary calls, "
                                     "and a stream past that is RESOURCE_EXHAUSTED too. Bounds the memory that "
                                     "concurrent large requests can hold: about this many x max_message_bytes x 3 "
                                     "at worst. Raise it for many clients at once (the environment service sees "
                                     "one StepEpisode per episode stepping, from every training job).")
    max_pending_jobs: int = Field(1000, ge=1, le=100_000, description="Jobs waiting as PENDING at once; a Create "
                                  "past it is RESOURCE_EXHAUSTED (retry later). trace_common/jobs.py.")
    max_pending_bytes: int = Field(256 * 1024 * 1024, ge=1 << 20, le=1 << 40, description="Bytes the PENDING jobs' "
                                   "specs may hold together (each job's estimated in-memory footprint); a Create "
                                   "past it is RESOURCE_EXHAUSTED (retry later). trace_common/jobs.py.")
    retained_jobs: int = Field(10_000, ge=1, le=1_000_000, description="Jobs kept for Get/List/Watch; past it the "
                               "oldest finished ones are evicted, their request_id with them (a retry then creates "
                               "a new job).")
    grace_seconds: float = Field(10.0, ge=0, le=600, description="On SIGTERM, in-flight RPCs get this long to finish.")
    log_level: str = Field("INFO", description="Python logging level name.")

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"unknown log level {v!r}; use one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return v

    @field_validator("auth_token")
    @classmethod
    def _token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            check_token(v.get_secret_value(), token_env(cls.service_name) if cls.service_name else "auth_token")
        return v

    @field_validator("artifact_root")
    @classmethod
    def _root(cls, v: str) -> str:
        if v.startswith("file://./"):  # relative convenience form for the embedded default
            v = (Path.cwd() / v[len("file://./"):]).resolve().as_uri()
        if not (v.startswith("file:///") or v.startswith("s3://")):
            raise ValueError(f"artifact_root {v!r} must start with file:/// (absolute path) or s3://bucket; "
                             "e.g. file:///var/lib/trace or s3://trace-artifacts")
        return v

    @field_validator("model_roots", mode="before")
    @classmethod
    def _roots(cls, v: object) -> list[str]:
        return parse_model_roots(v)

    @model_validator(mode="after")
    def _pairs(self) -> ServiceSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both to enable TLS, or neither")
        if self.tls_pair is not None:
            _check_tls_pair(*self.tls_pair)
        if any(r.startswith("s3://") for r in self.model_roots) and not self.s3_endpoint:
            raise ValueError(f"model_roots lists s3:// roots but s3_endpoint is unset; set "
                             f"TRACE_{self.service_name.upper()}_S3_ENDPOINT=host:port")
        if self.artifact_root.startswith("s3://") and not self.s3_endpoint:
            raise ValueError(f"artifact_root is {self.artifact_root} but s3_endpoint is unset; "
                             f"set TRACE_{self.service_name.upper()}_S3_ENDPOINT=host:port")
        return self

    @property
    def tls_pair(self) -> tuple[Path, Path] | None:
        """(certificate chain, private key) when TLS is on (both set), else None: what the gRPC
        server and the inference HTTP API serve with."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        return self.tls_cert_file, self.tls_key_file

    def s3_settings(self):
        """The artifact store's S3Settings, or None for file:// roots."""
        if not self.artifact_root.startswith("s3://"):
            return None
        from trace_common.artifacts import S3Settings

        return S3Settings(endpoint=self.s3_endpoint, access_key=self.s3_access_key or "",
                          secret_key=self.s3_secret_key or SecretStr(""), region=self.s3_region,
                          secure=self.s3_secure)


def parse_model_roots(value: object) -> list[str]:
    """`model_roots` as a list of root URIs (`file:///abs/dir`, `s3://bucket[/prefix]`, no trailing '/'),
    from a list or from an environment value (a JSON list, or comma-separated); ValueError saying how
    to write it otherwise."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import json

            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"model_roots {text!r} is not a JSON list ({exc}); give e.g. "
                                 '["/models", "s3://models/base"] or /models,s3://models/base') from None
        else:
            value = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        raise ValueError(f"model_roots must be a list of directories, got {type(value).__name__}")
    out = []
    for root in value:
        root = str(root)
        if root.startswith("/"):
            root = Path(root).as_uri()
        if root.startswith("s3://"):
            if not root[len("s3://"):].split("/", 1)[0]:
                raise ValueError(f"model root {root!r} has no bucket; give s3://bucket[/prefix]")
        elif not root.startswith("file:///"):
            raise ValueError(f"model root {root!r} must be an absolute directory (/abs/dir or file:///abs/dir) "
                             "or s3://bucket[/prefix]")
        stripped = root.rstrip("/")
        out.append(root if stripped == "file:" else stripped)  # file:/// (the whole disk) stays as given
    return out


def token_env(service: str) -> str:
    """The environment variable holding `service`'s auth token, e.g. TRACE_ROLLOUT_AUTH_TOKEN."""
    return f"TRACE_{service.upper()}_AUTH_TOKEN"


def check_token(token: str, where: str) -> str:
    """`token` when it can be a bearer token; ValueError naming `where` (the variable or flag) otherwise.

    An empty value must not silently turn auth off, and a token of spaces must not be matched by
    `Bearer    `: a token is 1..4096 visible ASCII characters (what gRPC metadata and HTTP
    headers carry unchanged), so no whitespace anywhere, leading and trailing included.
    """
    fix = (f"set {where} to a real token (e.g. `openssl rand -hex 24`), or unset it to run without auth "
           "(loopback only)")
    if not token.strip():
        raise ValueError(f"{where} is set but blank; {fix}")
    if token != token.strip():
        raise ValueError(f"{where} has leading or trailing whitespace (a stray newline from a file?); strip it")
    if len(token) > 4096 or any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise ValueError(f"{where} must be 1..4096 visible ASCII characters without spaces (gRPC metadata and HTTP "
                         f"headers carry nothing else unchanged); {fix}")
    return token


def service_token(service: str, fallback: str | None = None) -> str | None:
    """The token a client sends to `service`: ${TRACE_<SERVICE>_AUTH_TOKEN} when set, else `fallback`
    (e.g. --token / $TRACE_AUTH_TOKEN). The same variable the service reads, so a client started
    in the environment of `tracectl up` (or of a standalone service) sends what the service expects.
    A blank value raises ValueError, as it does for the service."""
    value = os.environ.get(token_env(service))
    if value is None:
        return fallback
    return check_token(value, token_env(service))


def settings_class(service: str) -> type[ServiceSettings]:
    """A ServiceSettings subclass reading `TRACE_<SERVICE>_*`."""
    if service not in SERVICE_NAMES:
        raise ValueError(f"unknown service {service!r}; expected one of {', '.join(SERVICE_NAMES)}")
    prefix = f"TRACE_{service.upper()}_"
    return type(f"{service.capitalize()}Settings", (ServiceSettings,), {
        "service_name": service,
        "model_config": SettingsConfigDict(env_prefix=prefix, extra="ignore", validate_default=True),
        "__doc__": f"Settings of the {service} service, from {prefix}* environment variables.",
    })


def _check_tls_pair(cert: Path, key: Path) -> None:
    """Load the pair the way the servers will (gRPC and the inference HTTP API), so a missing file,
    an encrypted or mismatched key is a settings error at start-up, not a failed bind later."""
    import ssl

    for name, path in (("tls_cert_file", cert), ("tls_key_file", key)):
        if not path.is_file():
            raise ValueError(f"{name} {str(path)!r} is not a readable file; point it at a PEM file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert), str(key), password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"tls_cert_file {str(cert)!r} and tls_key_file {str(key)!r} do not load as a TLS pair "
                         f"({exc}); give a PEM certificate chain and its unencrypted private key") from None
