"""The chart as `helm template` renders it: what each Deployment runs, with which environment.

Only reads the rendered manifests: Deployments (container command, args, env, ports), Services (which
in-cluster address reaches which container port), Secrets (the values `secretKeyRef` points at: the
chart generates the auth token and the S3 keys), the bucket Job. Nothing here knows the rehearsal's
stand-ins (`local.py`).
"""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trace_common.errors import FailedPrecondition, InvalidArgument

#: An env var whose value the pod's metadata supplies (fieldRef): kept as this marker.
FIELD_REF = object()


@dataclass
class Container:
    """One container of a rendered workload."""

    workload: str                  # the Deployment's / Job's metadata.name, e.g. trace-rollout
    command: list[str]
    args: list[str]
    env: dict[str, Any]            # name -> value (str), or FIELD_REF
    ports: dict[str, int] = field(default_factory=dict)   # port name -> containerPort


@dataclass
class Rendered:
    docs: list[dict[str, Any]]

    def _of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]

    def secrets(self) -> dict[tuple[str, str], str]:
        """(secret name, key) -> decoded value, from the rendered Secrets."""
        out: dict[tuple[str, str], str] = {}
        for s in self._of("Secret"):
            name = s["metadata"]["name"]
            for k, v in (s.get("data") or {}).items():
                out[(name, k)] = base64.b64decode(v).decode()
            for k, v in (s.get("stringData") or {}).items():
                out[(name, k)] = str(v)
        return out

    def container(self, kind: str, name: str) -> Container:
        """The first container of workload `name` (a Deployment or Job), its env resolved against
        the rendered Secrets. FailedPrecondition naming the workload when the chart did not render it."""
        for d in self._of(kind):
            if d["metadata"]["name"] == name:
                c = d["spec"]["template"]["spec"]["containers"][0]
                return Container(workload=name, command=list(c.get("command") or []), args=[str(a) for a in c.get("args") or []],
                                 env=self._env(name, c.get("env") or []),
                                 ports={p["name"]: int(p["containerPort"]) for p in c.get("ports") or [] if "name" in p})
        raise FailedPrecondition(f"the rendered chart has no {kind} {name!r}: enable it in the values file "
                                 "(the rehearsal runs what the chart deploys)")

    def _env(self, workload: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        secrets = self.secrets()
        env: dict[str, Any] = {}
        for item in items:
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            source = item.get("valueFrom") or {}
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                key = (ref["name"], ref["key"])
                if key not in secrets:
                    raise FailedPrecondition(
                        f"{workload}: {item['name']} comes from Secret {ref['name']}/{ref['key']}, which the chart does "
                        "not render (an existing secret of the cluster); the rehearsal can only use the chart's own "
                        "secrets: unset the values that name an existing secret for the rehearsal")
                env[item["name"]] = secrets[key]
            elif "fieldRef" in source:
                env[item["name"]] = FIELD_REF
            else:
                raise FailedPrecondition(f"{workload}: {item['name']}: unsupported valueFrom {sorted(source)}")
        return env

    def service_targets(self) -> dict[str, tuple[str, str]]:
        """In-cluster address 'svc:port' -> (component, container port name) for each rendered Service:
        its selector's component (rollout, vllm, minio, ...) and the port name targetPort gives."""
        out: dict[str, tuple[str, str]] = {}
        for s in self._of("Service"):
            component = (s["spec"].get("selector") or {}).get("app.kubernetes.io/component")
            for p in s["spec"].get("ports") or [] if component else []:
                out[f"{s['metadata']['name']}:{p['port']}"] = (component, str(p.get("targetPort", p["name"])))
        return out


def render(chart: Path, values: list[Path], helm: Path, *, release: str = "trace", namespace: str = "trace",
           overrides: list[str] | None = None) -> Rendered:
    """`helm template release chart -n namespace -f values... --set overrides...` parsed. InvalidArgument
    with helm's own message when the chart refuses the values (schema or a template's fail)."""
    if not helm.exists():
        raise FailedPrecondition(f"{helm} missing: run `make tools` (installs helm into .tools/)")
    cmd = [str(helm), "template", release, str(chart), "-n", namespace]
    for v in values:
        cmd += ["-f", str(v)]
    for o in overrides or []:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise InvalidArgument(proc.stderr.strip()[-1500:] or f"helm exited {proc.returncode}", field="--values",
                              fix="`helm template` with the same files shows the error; fix the values file")
    return Rendered([d for d in yaml.safe_load_all(proc.stdout) if d])
