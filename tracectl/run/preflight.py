"""`tracectl run --check`: a run config checked before any GPU hour is spent, from wherever the
operator happens to be (a laptop, CI, a bastion inside the cluster).

Two parts, so that a cluster config can be rehearsed from outside its cluster:

* offline -- what needs no cluster: the file and every section's fields (`load_config`), the
  endpoint profiles (`run_endpoints`), and the parts only a service can parse (`Pipeline.check`:
  the GRPO configs through the trainer's ValidateTrainingConfig, the target environment and its
  splits through the rollout service's list), asked of the services embedded in this process: the
  code a deployed service of this version runs, so a config that passes here parses there.
* network -- what only the deployment can answer: the S3 store reachable (and the run's manifest,
  if any, intact), each deployed service SERVING on grpc.health.v1, each LLM endpoint answering
  HTTP; and, when every deployed service is reachable, `Pipeline.check` asked of those services
  themselves (their version, their data directories).

A network check whose address cannot be reached from here (no DNS name, nothing listening, a
TCP connect that times out) is *skipped* with its reason, and does not fail `--check`: from
outside the cluster that is the expected answer. Everything reached is checked for real: a store
that answers with a damaged manifest, a service that is reachable but not serving, a deployed
trainer that refuses a config, each fails the check (exit codes: tracectl/exits.py).
"""

from __future__ import annotations

import argparse
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from trace_common.errors import ArtifactCorrupted, TraceError
from tracectl import exits
from tracectl.run.config import RunConfig

if TYPE_CHECKING:
    from tracectl.run.pipeline import Pipeline

#: Seconds a TCP connect to a network check's address may take before it is skipped as unreachable.
CONNECT_TIMEOUT_S = 2.0
#: Seconds a reached service or endpoint has to answer its check.
ANSWER_TIMEOUT_S = 5.0


@dataclass
class Check:
    """One network check: what it is, where, and its outcome (ok / skipped / failed) with why."""

    what: str
    address: str
    outcome: str = "ok"
    detail: str = ""


@dataclass
class Preflight:
    """What `--check` found: the offline checks passed (their names) and each network check."""

    offline: list[str] = field(default_factory=list)
    network: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.network if c.outcome == "failed"]

    def lines(self, config: Path) -> list[str]:
        out = [f"{config}: valid run config (checked offline: every section, {', '.join(self.offline)})"]
        if not self.network:
            return [*out, "network checks: none (the config deploys nothing: embedded services, a local store); "
                    "nothing was run"]
        for c in self.network:
            out.append(f"  {c.outcome:<7} {c.what} ({c.address})" + (f": {c.detail}" if c.detail else ""))
        skipped = sum(c.outcome == "skipped" for c in self.network)
        if skipped:
            out.append(f"{skipped} network check(s) skipped: they need the deployment (run --check where its "
                       "addresses resolve, e.g. inside the cluster, or with services: pointed at port-forwards)")
        return [*out, "nothing was run"]


def reachable(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a TCP connection to host:port opens, else why not (one line)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror as err:
        return f"{host} does not resolve from here ({err.strerror})"
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as err:
        return f"{host}:{port}: {err.strerror or err}"


def host_port(address: str, default_port: int) -> tuple[str, int]:
    """host and port of 'host:port', 'http(s)://host[:port]/...' or a bare host."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    port = parts.port or (443 if parts.scheme == "https" else default_port)
    return parts.hostname or address, port


def llm_endpoints(cfg: RunConfig) -> list[tuple[str, str]]:
    """(the field naming it, base URL) of every distinct LLM endpoint the run calls."""
    pairs = [("target.user_simulator", cfg.target.user_simulator and cfg.target.user_simulator.base_url),
             ("base_agent.endpoint", cfg.base_agent.endpoint if cfg.base_agent.backend == "http" else ""),
             ("analysis.llm", cfg.analysis.llm and cfg.analysis.llm.base_url),
             ("environments.llm", cfg.environments.llm and cfg.environments.llm.base_url),
             ("evaluation.gepa", cfg.evaluation.gepa and cfg.evaluation.gepa.base_url)]
    seen: dict[str, str] = {}
    for name, url in pairs:
        if url and url.rstrip("/") not in seen:
            seen[url.rstrip("/")] = name
    return [(name, url) for url, name in seen.items()]


def check_store(cfg: RunConfig, open_run_store) -> Check:
    """The S3 store: reachable, and the run's manifest (when there is one) loads and verifies."""
    from tracectl.run.manifest import Manifest

    c = Check("store", f"{cfg.store.root} at {cfg.store.s3_endpoint}")
    why = reachable(*host_port(cfg.store.s3_endpoint, 443 if cfg.store.s3_secure else 80))
    if why:
        c.outcome, c.detail = "skipped", why
        return c
    try:
        _, store = open_run_store(cfg)
        found = Manifest.load(store, cfg.run_id)
    except ArtifactCorrupted:
        raise
    except TraceError as err:
        c.outcome, c.detail = "failed", str(err)
        return c
    c.detail = f"run {cfg.run_id}: " + ("manifest found and intact (a run resumes it)" if found else "no manifest yet")
    return c


def check_service(service: str, address: str, token: str | None) -> Check:
    from trace_common.config import service_token
    from trace_common.grpc.client import Endpoint
    from tracectl.health import check

    c = Check(f"service {service}", address)
    why = reachable(*host_port(address, 50051))
    if why:
        c.outcome, c.detail = "skipped", why
        return c
    h = check(service, Endpoint(address, service_token(service, token)), timeout=ANSWER_TIMEOUT_S)
    if not h.ok:
        c.outcome, c.detail = "failed", f"reachable but {h.status}" + (f" ({h.detail})" if h.detail else "")
    else:
        c.detail = f"SERVING in {h.latency_ms:.0f} ms"
    return c


def check_llm(name: str, base_url: str) -> Check:
    import httpx

    c = Check(f"LLM endpoint {name}", base_url)
    why = reachable(*host_port(base_url, 80))
    if why:
        c.outcome, c.detail = "skipped", why
        return c
    try:   # any HTTP answer means a server is there; /models is what OpenAI-compatible servers list
        r = httpx.get(base_url.rstrip("/") + "/models", timeout=ANSWER_TIMEOUT_S)
        c.detail = f"HTTP {r.status_code} from /models"
        if r.status_code >= 500:
            c.outcome = "failed"
    except httpx.HTTPError as err:
        c.outcome, c.detail = "failed", f"reachable but no HTTP answer ({type(err).__name__})"
    return c


@contextmanager
def check_pipeline(cfg: RunConfig, targets: dict[str, str], token: str | None, endpoints,
                   data_dirs) -> Iterator[Pipeline]:
    """A Pipeline over `targets` (none: services embedded in this process) and a scratch store, for
    checks that create nothing (`--check` here, `--plan` in plan.py): the run's own store and
    manifest are never opened."""
    from trace_common.artifacts import open_store
    from tracectl.connect import Connection
    from tracectl.embedded import EMBEDDED_ENDPOINTS, allow_data_from_command
    from tracectl.run.jobs import JobRunner
    from tracectl.run.manifest import Manifest
    from tracectl.run.pipeline import Pipeline

    with tempfile.TemporaryDirectory(prefix="trace-check-") as scratch:
        conn_args = argparse.Namespace(target=[f"{k}={v}" for k, v in targets.items()], token=token,
                                       root=Path(scratch), overrides={EMBEDDED_ENDPOINTS: endpoints})
        for d in data_dirs:
            allow_data_from_command(conn_args, d)
        with Connection(conn_args) as conn:
            store = open_store(Path(scratch).as_uri())
            yield Pipeline(cfg, JobRunner(conn), store, Manifest(run_id=cfg.run_id))


def _pipeline_check(cfg: RunConfig, targets: dict[str, str], token: str | None, endpoints, data_dirs) -> list[str]:
    """Pipeline.check against `targets` (none: services embedded in this process, a scratch store)."""
    with check_pipeline(cfg, targets, token, endpoints, data_dirs) as pipe:
        return pipe.check()


def preflight(cfg: RunConfig, endpoints, *, token: str | None, open_run_store, data_dirs: list[str]) -> Preflight:
    """Run the offline checks, then the network ones (module docstring). Raises InvalidArgument
    (a section a service refuses) and ArtifactCorrupted (a reached store's manifest is damaged)."""
    out = Preflight(offline=["endpoint profiles"])
    deployed = dict(cfg.services)
    # (with a deployed rollout service, Pipeline.check leaves the tau2 data directory to it: it lies in its pods)
    out.offline += _pipeline_check(cfg, {}, token, endpoints, data_dirs if not deployed else [])
    if cfg.store.root.startswith("s3://"):
        out.network.append(check_store(cfg, open_run_store))
    else:   # a local store: its manifest, if any, must load (a damaged one raises ArtifactCorrupted)
        from tracectl.run.manifest import Manifest

        Manifest.load(open_run_store(cfg)[1], cfg.run_id)
        out.offline.append("the run's manifest in the local store")
    for service, address in sorted(deployed.items()):
        out.network.append(check_service(service, address, token))
    for name, url in llm_endpoints(cfg):
        out.network.append(check_llm(name, url))
    if deployed and cfg.target.uri:
        out.network.append(Check("target.uri", cfg.target.uri, "skipped", "read where the rollout service runs (in its "
                                 "pods): its first rollout job names a missing directory"))
    services = [c for c in out.network if c.what.startswith("service ")]
    if deployed and services and all(c.outcome == "ok" for c in services):
        checked = _pipeline_check(cfg, deployed, token, endpoints, [])
        out.network.append(Check("deployed services' own checks", ", ".join(sorted(deployed)),
                                 detail="passed: " + ", ".join(checked)))
    return out


def exit_code(p: Preflight) -> int:
    return exits.FAILED if p.failed else exits.OK

