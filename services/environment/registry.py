"""The environment registry, kept in the artifact store.

Layout (docs/design.md "Data contracts"):

    runs/<run_id>/environments/<capability>/v<N>/env.py           the module (the code that runs)
    runs/<run_id>/environments/<capability>/v<N>/validation.json  the validation report
    runs/<run_id>/environments/<capability>/v<N>/calibration.jsonl,
                                           calibration_batches.json  an ACCEPTED candidate's calibration
                                                                   episodes and their manifest
                                                                   (trace_common/env/calibration_batches.py),
                                                                   written before the report, which names
                                                                   the manifest (`calibration_batches`)
    runs/<run_id>/environments/<capability>/v<N>/manifest.json     name, version, capability, mode,
                                                                   status, target, the other two
                                                                   artifacts' URIs + sha256 (and the
                                                                   calibration batches'), summary

An environment's registry name is its capability (the name trainers ask for) and its
version is N, counted per capability across runs (v1, v2, ...), so (name, version) is
unique in one store. Everything is written with the store's atomic, sha256-recorded puts;
the manifest goes last, so a manifest's presence means a complete record. On startup the
registry rebuilds its index from the manifests, listing only `runs/<run_id>/environments/`
of each run; a manifest that cannot be read (damaged, no recorded digest, not a manifest) is
left out, logged and kept in `skipped`, and its version number is not given out again: one bad
object never stops the service. Reading the code back verifies both the store's sha256 and
the one the manifest recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from trace_common.artifacts import ArtifactStore
from trace_common.env import Trajectory
from trace_common.env.calibration_batches import write_calibration_batches
from trace_common.errors import ArtifactCorrupted, FailedPrecondition, InvalidArgument, NotFound

_MANIFEST = re.compile(r"^runs/(?P<run>[^/]+)/environments/(?P<cap>[^/]+)/v(?P<n>\d+)/manifest\.json$")
MANIFEST_SCHEMA = 1
log = logging.getLogger(__name__)


@dataclass
class EnvironmentRecord:
    """One registered candidate (accepted or rejected)."""

    name: str
    version: str
    capability: str
    mode: str
    status: str
    run_id: str
    code: dict[str, Any]
    validation: dict[str, Any]
    manifest: dict[str, Any]
    reasons: list[str] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)
    tool_schemas: list[dict[str, Any]] = field(default_factory=list)
    target: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    #: The calibration-batches manifest (uri, key, sha256, size); empty when none was stored.
    calibration_batches: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return self.status == "ACCEPTED"

    @property
    def calibration_mean(self) -> float:
        return float(self.numbers.get("calibration_mean", 0.0))

    @property
    def informative_fraction(self) -> float:
        return float(self.numbers.get("informative_fraction", 0.0))

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], manifest_info: dict[str, Any]) -> EnvironmentRecord:
        return cls(name=manifest["name"], version=str(manifest["version"]), capability=manifest["capability"],
                   mode=manifest["mode"], status=manifest["status"], run_id=manifest["run_id"],
                   code=manifest["code"], validation=manifest["validation"], manifest=manifest_info,
                   reasons=list(manifest.get("reasons", [])), numbers=dict(manifest.get("numbers", {})),
                   tool_schemas=list(manifest.get("tool_schemas", [])), target=dict(manifest.get("target", {})),
                   created=float(manifest.get("created", 0.0)),
                   calibration_batches=dict(manifest.get("calibration_batches") or {}))


def _version_key(record: EnvironmentRecord) -> int:
    return int(record.version)


class EnvironmentRegistry:
    """Index of registered environments over an artifact store (thread-safe)."""

    def __init__(self, store: ArtifactStore):
        self.store = store
        self._records: dict[tuple[str, str], EnvironmentRecord] = {}
        self._reserved: dict[str, int] = {}
        self._lock = threading.Lock()
        self.skipped: list[str] = []

    def load(self) -> int:
        """Rebuild the index from the manifests in the store; returns how many were loaded. A manifest
        that cannot be read is left out (see `skipped`); its version number stays taken."""
        found = 0
        for run in self.store.list_dirs("runs/"):
            for info in self.store.list(f"runs/{run}/environments/"):
                match = _MANIFEST.match(info.key)
                if not match:
                    continue
                with self._lock:  # never hand this version out again, readable or not
                    self._reserved[match["cap"]] = max(self._reserved.get(match["cap"], 0), int(match["n"]))
                try:
                    if info.corruption:
                        raise ArtifactCorrupted(info.corruption)
                    manifest = json.loads(self.store.get_bytes(info.key))
                    if not isinstance(manifest, dict):
                        raise ValueError(f"a manifest is a JSON object, not {type(manifest).__name__}")
                    record = EnvironmentRecord.from_manifest(manifest, {"uri": info.uri, "sha256": info.sha256,
                                                                        "size": info.size, "key": info.key})
                except (ArtifactCorrupted, NotFound, ValueError, KeyError, TypeError, AttributeError) as exc:
                    reason = f"{info.key}: {type(exc).__name__}: {exc}"
                    log.warning("environment registry: leaving out %s", reason)
                    self.skipped.append(reason)
                    continue
                with self._lock:
                    self._records[(record.name, record.version)] = record
                found += 1
        return found

    def _allocate(self, name: str) -> int:
        with self._lock:
            existing = [int(v) for (n, v) in self._records if n == name]
            n = max([*existing, self._reserved.get(name, 0)], default=0) + 1
            self._reserved[name] = n
            return n

    def register(self, *, run_id: str, capability: str, mode: str, source: str, report: dict[str, Any],
                 target: dict[str, Any], tool_schemas: list[dict[str, Any]], extra: dict[str, Any] | None = None,
                 calibration: tuple[list[Trajectory], dict[str, Any]] | None = None) -> EnvironmentRecord:
        """Write code, calibration batches (when given), report and manifest (in that order) and index
        the record. `calibration`: (the played episodes, every CalibrationBatches field but the
        environment's name, version and code sha256, which this registration decides)."""
        name = capability
        n = self._allocate(name)
        prefix = f"runs/{run_id or 'adhoc'}/environments/{capability}/v{n}"
        code = self.store.put_bytes(f"{prefix}/env.py", source.encode("utf-8"))
        batches: dict[str, Any] = {}
        if calibration is not None:
            episodes, fields = calibration
            info, written = write_calibration_batches(self.store, prefix, episodes, environment=name, version=str(n),
                                                      code_sha256=code.sha256, **fields)
            batches = {"uri": info.uri, "key": info.key, "sha256": info.sha256, "size": info.size,
                       "episodes": written.episodes, "token_ids": written.token_ids}
            report = {**report, "calibration_batches": batches}
        report_bytes = json.dumps(report, indent=2, sort_keys=True).encode()
        validation = self.store.put_bytes(f"{prefix}/validation.json", report_bytes)
        manifest = {
            "schema": MANIFEST_SCHEMA, "name": name, "version": str(n), "capability": capability, "mode": mode,
            "status": report["status"], "run_id": run_id or "adhoc", "created": time.time(),
            "code": {"uri": code.uri, "key": code.key, "sha256": code.sha256, "size": code.size},
            "validation": {"uri": validation.uri, "key": validation.key, "sha256": validation.sha256,
                           "size": validation.size},
            "reasons": list(report.get("reasons", [])), "numbers": dict(report.get("numbers", {})),
            "isolation": dict(report.get("isolation", {})), "target": target, "tool_schemas": tool_schemas,
            "calibration_batches": batches, **(extra or {}),
        }
        info = self.store.put_bytes(f"{prefix}/manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
        record = EnvironmentRecord.from_manifest(manifest, {"uri": info.uri, "sha256": info.sha256,
                                                            "size": info.size, "key": info.key})
        with self._lock:
            self._records[(name, record.version)] = record
        return record

    def list(self, capability: str = "", include_rejected: bool = False) -> list[EnvironmentRecord]:
        with self._lock:
            records = list(self._records.values())
        out = [r for r in records if (not capability or r.capability == capability)
               and (include_rejected or r.accepted)]
        return sorted(out, key=lambda r: (r.name, _version_key(r)))

    def get(self, name: str, version: str = "", *, accepted_only: bool = False) -> EnvironmentRecord:
        """`version` "" = the latest accepted version (the latest of any status if none is accepted
        and `accepted_only` is False)."""
        if not name:
            raise InvalidArgument(field="name", expected="a registered environment name", got=name)
        if version and not version.isdigit():
            raise InvalidArgument(field="version", expected="a registry version such as '3' (or empty for the "
                                  "latest accepted)", got=version)
        with self._lock:
            versions = sorted((r for (n, _), r in self._records.items() if n == name), key=_version_key)
        if not versions:
            raise NotFound(f"no registered environment {name!r}; run a generation job or list environments")
        if version:
            match = [r for r in versions if r.version == version]
            if not match:
                raise NotFound(f"environment {name!r} has no version {version!r} (versions: "
                               f"{', '.join(r.version for r in versions)})")
            record = match[0]
        else:
            accepted = [r for r in versions if r.accepted]
            if accepted:
                record = accepted[-1]
            elif accepted_only:
                raise FailedPrecondition(f"environment {name!r} has no ACCEPTED version (versions "
                                         f"{', '.join(r.version for r in versions)} were rejected)")
            else:
                record = versions[-1]
        if accepted_only and not record.accepted:
            raise FailedPrecondition(f"environment {name}@{record.version} was REJECTED by validation "
                                     f"({'; '.join(record.reasons)[:300]}); only accepted environments are served")
        return record

    def source(self, record: EnvironmentRecord) -> str:
        """The module text, verified against the sha256 the manifest recorded."""
        data = self.store.get_bytes(record.code["key"])
        digest = hashlib.sha256(data).hexdigest()
        if digest != record.code["sha256"]:
            raise ArtifactCorrupted(f"{record.code['uri']}: sha256 {digest} differs from the manifest's "
                                    f"{record.code['sha256']}")
        return data.decode("utf-8")

    def report(self, record: EnvironmentRecord) -> dict[str, Any]:
        return json.loads(self.store.get_bytes(record.validation["key"]))
