"""Settings of the trainer service (`TRACE_TRAINER_*`).

Dict/list settings (node selector, tolerations, extra env) are JSON in their variables, e.g.
`TRACE_TRAINER_JOB_NODE_SELECTOR='{"trace.dev/pool": "gpu"}'`. The data directories a job's
environments may name (the tau2 `data` parameter) are only a setting: `data_roots`
(TRACE_TRAINER_DATA_ROOTS, trace_common/data_roots.py).
"""

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from trace_common.config import ServiceSettings
from trace_common.data_roots import ROOTS_DESCRIPTION, default_roots, parse_roots
from trace_common.endpoints import EndpointMap, EndpointProfile


class TrainerSettings(ServiceSettings):
    service_name: ClassVar[str] = "trainer"
    model_config = SettingsConfigDict(env_prefix="TRACE_TRAINER_", extra="ignore", validate_default=True)

    # -- local executor ---------------------------------------------------------------------------
    worker_python: str = Field("", description="Python interpreter of local training workers; empty = this one.")
    work_dir: str = Field("", description="Scratch directory of local workers (spec files, model cache); "
                          "empty = a temporary directory.")
    cancel_grace_seconds: float = Field(30.0, ge=0, le=3600, description="After SIGTERM a worker gets this long "
                                        "to checkpoint and exit before it is killed.")
    torch_threads: int = Field(0, ge=0, le=1024, description="Intra-op threads of each local worker; 0 = torch's "
                               "default.")
    environment_address: str = Field(
        "", description="host:port of the EnvironmentService (TRACE_TRAINER_ENVIRONMENT_ADDRESS, set by the chart): environments that are not built in (generated or "
                        "library environments of a run) are played through it, never run in the trainer. The "
                        "embedded stack sets it; in a cluster, the environment service's address.")
    environment_token: SecretStr | None = Field(
        None, description="Bearer token the trainer and its workers send to the environment service "
        "(TRACE_TRAINER_ENVIRONMENT_TOKEN); unset = the trainer's own auth_token (one shared Secret, as the "
        "chart deploys). The embedded stack sets it to the environment service's token.")
    environment_tls_ca_file: Path | None = Field(
        None, description="PEM certificate(s) the trainer and its workers trust for the environment service when "
        "it serves gRPC over TLS (TRACE_TRAINER_ENVIRONMENT_TLS_CA_FILE; the chart sets it with tls.enabled, from "
        "tls.caKey of the TLS Secret). Unset: plaintext gRPC, which a TLS server refuses.")
    # -- vLLM rollouts (config.rollout_backend='vllm'; outbound.py) ----------------------------------------
    endpoints: EndpointMap = Field(default_factory=dict, description=(
        "The vLLM servers training jobs may roll out on, as a JSON map profile name -> {\"base_url\": "
        "\"http://vllm:8000/v1\"}; a job names a profile (config.vllm.profile) or its exact base_url. No "
        "api_key_env (the trainer sends no key to vLLM) and no models (it serves only its own adapter versions)."))
    vllm_adapter_root: str = Field("", description=(
        "Directory (a volume the vLLM server reads too) inside which jobs save the adapter versions the server "
        "hot-loads; config.vllm.adapter_dir must lie inside it. Empty: vLLM rollouts are refused."))
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=default_roots, description=ROOTS_DESCRIPTION)
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="W&B mode of jobs whose config.report_to names 'wandb' (WANDB_MODE's values; "
        "grpo/trackers.py). offline (default): the run is written to files beside the job's checkpoints and "
        "nothing leaves the worker (`wandb sync` uploads it later); online also needs WANDB_API_KEY in the "
        "workers' environment (local workers inherit the trainer's; Job pods: a Secret in the Job template).")
    env_modules: list[str] = Field(default_factory=list, description="Python modules imported by the service "
                                   "and every worker before environments are resolved, so that environments they "
                                   "register (trace_common.env.register) can be trained on (JSON list).")
    # -- Kubernetes executor -------------------------------------------------------------------------
    kubernetes_namespace: str = Field("", description="Namespace for training Jobs (EXECUTOR_KUBERNETES); "
                                      "empty means the pod's own namespace.")
    job_template: str = Field("", description=(
        "JSON batch/v1 Job manifest training Jobs are made from (the chart's training-job.json): its command, "
        "image, resources, GPU pool and volumes are the operator's, and the job_* settings of those are not "
        "used; the trainer sets the name, labels, annotations and the job's environment (kubernetes_job.py). "
        "Empty: the built-in Job from the job_* settings."))
    job_image: str = Field("", description="Image of training Jobs on the GPU pool (the trainer image).")
    job_image_pull_policy: str = Field("IfNotPresent", description="imagePullPolicy of training Job pods.")
    job_gpus: int = Field(1, ge=0, le=64, description="GPUs per training Job pod (torchrun --nproc_per_node).")
    job_cpu: str = Field("4", description="CPU request of a training Job pod.")
    job_memory: str = Field("32Gi", description="Memory request (and limit) of a training Job pod.")
    job_shm_size: str = Field("8Gi", description="Size of /dev/shm (NCCL) in a training Job pod.")
    job_node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of Job pods (JSON).")
    job_tolerations: list[dict[str, Any]] = Field(default_factory=list, description="tolerations of Job pods (JSON).")
    job_backoff_limit: int = Field(2, ge=0, le=100, description="Pod retries of a Job (each resumes from the last "
                                   "checkpoint).")
    job_active_deadline_seconds: int = Field(0, ge=0, description="Job wall-clock limit; 0 = none.")
    job_ttl_seconds_after_finished: int = Field(86400, ge=0, description="Finished Jobs are deleted after this.")
    job_service_account: str = Field("", description="serviceAccountName of Job pods; empty = default.")
    job_s3_secret_name: str = Field("", description="Secret holding the S3 secret key for Job pods.")
    job_s3_secret_key: str = Field("secret-key", description="Key of the S3 secret key inside that Secret.")
    job_auth_from: str = Field("", pattern=r"^$|^[a-z0-9][-a-z0-9.]*:[-._a-zA-Z0-9]+$", description=(
        "NAME:KEY of the Secret holding the environment service's token for Job pods (they read it as "
        "TRACE_TRAINER_ENVIRONMENT_TOKEN); the chart points it at its auth Secret. Empty: Job pods send none."))
    job_extra_env: dict[str, str] = Field(default_factory=dict, description="Extra environment of Job pods (JSON).")
    job_poll_seconds: float = Field(5.0, gt=0, le=600, description="How often a Kubernetes Job's status and "
                                    "progress are read.")

    @field_validator("data_roots", mode="before")
    @classmethod
    def _data_roots(cls, v: object) -> list[Path]:
        return parse_roots(v)

    @field_validator("vllm_adapter_root")
    @classmethod
    def _absolute_root(cls, v: str) -> str:
        if v and not v.startswith("/"):
            raise ValueError(f"TRACE_TRAINER_VLLM_ADAPTER_ROOT {v!r} must be an absolute path (the same path the "
                             "vLLM server mounts), e.g. /adapters")
        return v

    @field_validator("endpoints")
    @classmethod
    def _no_keys(cls, v: dict[str, EndpointProfile]) -> dict[str, EndpointProfile]:
        keyed = sorted(n for n, p in v.items() if p.api_key_env)
        if keyed:
            raise ValueError(f"TRACE_TRAINER_ENDPOINTS profile(s) {', '.join(keyed)} name an api_key_env, but the "
                             "trainer sends no key to its vLLM server; remove api_key_env (serve vLLM inside the "
                             "cluster, unauthenticated, reachable only by the trainer and its jobs)")
        bounded = sorted(n for n, p in v.items() if p.models)
        if bounded:
            raise ValueError(f"TRACE_TRAINER_ENDPOINTS profile(s) {', '.join(bounded)} list models, but a training "
                             "job sends only its own adapter versions (<capability>-v<N>) there; remove models")
        return v

    @field_validator("job_image_pull_policy")
    @classmethod
    def _pull(cls, v: str) -> str:
        if v not in ("Always", "IfNotPresent", "Never"):
            raise ValueError(f"job_image_pull_policy {v!r}: use Always, IfNotPresent or Never")
        return v

    @field_validator("job_tolerations")
    @classmethod
    def _tolerations(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        allowed = {"key", "operator", "value", "effect", "tolerationSeconds"}
        for i, t in enumerate(v):
            bad = set(t) - allowed
            if bad:
                raise ValueError(f"job_tolerations[{i}] has unknown fields {sorted(bad)}; a toleration has "
                                 f"{sorted(allowed)} (e.g. {{\"key\": \"nvidia.com/gpu\", \"operator\": \"Exists\", "
                                 "\"effect\": \"NoSchedule\"})")
        return v


def environment_token(settings: TrainerSettings) -> str | None:
    """The token for the environment service: `environment_token`, else the trainer's own."""
    token = settings.environment_token or settings.auth_token
    return token.get_secret_value() if token is not None else None
