"""Fixture: a real Prometheus server (Debian package) scraping given /metrics URLs.

`prometheus_factory(urls, token=None)` writes a config with one job per URL (scrape every 1 s;
with `token`, each scrape sends `authorization: Bearer <token>` as the chart's ServiceMonitors do), starts
`prometheus` on a free loopback port with its own storage dir, waits until ready, and returns
a client with `.query(promql)` (HTTP API) and `.wait_for(promql, predicate)`.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def find_binary(name: str) -> str:
    for cand in (REPO / ".tools" / "bin" / name, shutil.which(name)):
        if cand and Path(cand).exists():
            return str(cand)
    raise RuntimeError(f"{name} not found in .tools/bin or PATH; run `make tools` (installs Debian's prometheus)")


class Prometheus:
    def __init__(self, workdir: Path, targets: dict[str, str], token: str | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": []}
        for job, metrics_url in targets.items():
            u = urlparse(metrics_url)
            job_cfg = {"job_name": job, "metrics_path": u.path, "static_configs": [{"targets": [u.netloc]}]}
            if token is not None:
                job_cfg["authorization"] = {"type": "Bearer", "credentials": token}
            cfg["scrape_configs"].append(job_cfg)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.log = open(workdir / "prometheus.log", "w")  # noqa: SIM115 -- closed in stop()
        self.proc = subprocess.Popen(
            [find_binary("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.3)
        raise RuntimeError("prometheus did not become ready in 60 s")

    def query(self, promql: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def wait_for(self, promql: str, predicate, timeout: float = 30.0) -> list[dict]:
        deadline = time.time() + timeout
        result: list[dict] = []
        while time.time() < deadline:
            result = self.query(promql)
            if predicate(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{promql!r} never satisfied the condition in {timeout}s; last result {result}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def prometheus_factory(tmp_path):
    started: list[Prometheus] = []

    def make(targets: dict[str, str], token: str | None = None) -> Prometheus:
        p = Prometheus(tmp_path / f"prometheus-{len(started)}", targets, token)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()
