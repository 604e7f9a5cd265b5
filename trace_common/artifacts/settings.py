"""Connection and transfer settings of the S3 backend.

The defaults fit an in-cluster MinIO and the `rclone serve s3` test server: plain HTTP,
region `us-east-1` (the SDK otherwise asks the server for the bucket's region, which rclone
does not answer usefully). Transfer sizes are explained in `s3_store.py`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

MiB = 1024 * 1024
GiB = 1024 * MiB
# S3 protocol limits (AWS, MinIO): parts are 5 MiB..5 GiB, a single PUT at most 5 GiB.
S3_MIN_PART = 5 * MiB
S3_MAX_PUT = 5 * GiB


class S3Settings(BaseModel):
    """Where the S3 server is and how to talk to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str = Field(description="Server address as 'host:port', without scheme (e.g. 'minio:9000').")
    access_key: str = Field(description="S3 access key id; empty for anonymous access.")
    secret_key: SecretStr = Field(default=SecretStr(""), description="S3 secret access key (never logged).")
    region: str = Field(default="us-east-1", min_length=1,
                        description="Signing region. MinIO and rclone serve s3 use 'us-east-1'.")
    secure: bool = Field(default=False, description="Use HTTPS. In-cluster MinIO is usually plain HTTP.")
    verify_tls: bool = Field(default=True, description="Verify the server certificate when secure=True.")
    multipart_threshold: int = Field(
        default=512 * MiB, ge=S3_MIN_PART, le=S3_MAX_PUT,
        description="Objects up to this size go up in ONE streamed PUT whose signed payload hash is "
                    "the artifact's sha256 (one hashing pass); larger ones use multipart uploads.")
    part_size: int = Field(default=64 * MiB, ge=S3_MIN_PART, le=S3_MAX_PUT,
                           description="Multipart part size (objects above multipart_threshold). "
                                       "Each part is held in memory while it uploads.")
    stream_buffer: int = Field(default=16 * MiB, ge=64 * 1024, le=S3_MAX_PUT,
                               description="put_stream keeps up to this many bytes in memory; a longer "
                                           "stream is spooled to a temp file (spool_dir) first.")
    spool_dir: str | None = Field(default=None,
                                  description="Directory for put_stream spool files (default: the system temp dir).")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP connect timeout per attempt.")
    read_timeout_s: float = Field(default=300.0, gt=0, description="Socket read timeout per attempt.")
    max_retries: int = Field(default=3, ge=0, le=10,
                             description="Retries of connection errors and 5xx answers (with backoff), and "
                                         "re-reads of a whole read (get_bytes, get_file) whose body was cut "
                                         "short or did not match its recorded sha256 (until a failure "
                                         "repeats). A stalled body can so cost (max_retries + 1) x "
                                         "read_timeout_s.")

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_host_port(cls, value: str) -> str:
        if "://" in value:
            scheme, _, rest = value.partition("://")
            raise ValueError(f"endpoint must be 'host:port' without a scheme, got {value!r}; "
                             f"use endpoint={rest.rstrip('/')!r}"
                             + (" with secure=True" if scheme.lower() == "https" else ""))
        if "/" in value or not value:
            raise ValueError(f"endpoint must be 'host:port' with no path, got {value!r}; "
                             "put a bucket prefix in the s3:// root URI instead")
        return value

    @model_validator(mode="after")
    def _threshold_fits_parts(self) -> S3Settings:
        if self.access_key and not self.secret_key.get_secret_value():
            raise ValueError("access_key is set but secret_key is empty; set both (or neither, for anonymous access)")
        if self.part_size > self.multipart_threshold:
            raise ValueError(f"part_size ({self.part_size}) must not exceed multipart_threshold "
                             f"({self.multipart_threshold}); lower part_size or raise multipart_threshold")
        return self
