"""The environment registry over a real S3 server (`rclone serve s3`) and over the file backend: objects
uploaded behind the store's back (`mc cp`: no `x-amz-meta-sha256`; `cp`: no sidecar) never stop
`load`, which is the environment service's start-up (and so every command embedding the stack)."""

from __future__ import annotations

import io

import pytest

from services.environment.registry import EnvironmentRegistry
from tests.support.s3 import S3Server
from trace_common.artifacts import open_store

pytestmark = pytest.mark.integration


@pytest.fixture(params=["file", "s3"])
def backend(request, tmp_path):
    """(store, put_behind_its_back(key, data)) on a fresh root."""
    if request.param == "file":
        root = tmp_path / "store"

        def plain(key: str, data: bytes) -> None:
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_bytes(data)

        return open_store(root.as_uri()), plain
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.make_bucket()
    client = server.client()

    def mc_cp(key: str, data: bytes) -> None:
        client.put_object(bucket, f"pre/{key}", io.BytesIO(data), len(data))  # no sha256 metadata

    return open_store(f"s3://{bucket}/pre", s3=server.settings), mc_cp


def _register(registry: EnvironmentRegistry, capability: str, run: str) -> None:
    registry.register(run_id=run, capability=capability, mode="GENERATION_MODE_LIBRARY", source="# env\n",
                      report={"status": "ACCEPTED", "reasons": [], "numbers": {}}, target={"name": "store"},
                      tool_schemas=[])


@pytest.mark.parametrize(("key", "skipped"), [
    ("runs/r1/rollouts/mine.jsonl", False),
    ("runs/r1/adapters/c/v1/adapter_model.safetensors", False),
    ("runs/r9/environments/tool_call_precision/v3/manifest.json", True),
])
def test_load_survives_an_object_without_a_digest(backend, key, skipped):
    store, behind_its_back = backend
    registry = EnvironmentRegistry(store)
    _register(registry, "precondition_verification", "r1")
    _register(registry, "tool_call_precision", "r2")
    behind_its_back(key, b"{}")
    fresh = EnvironmentRegistry(store)
    assert fresh.load() == 2
    assert [s.split(":", 1)[0] for s in fresh.skipped] == ([key] if skipped else [])
    assert [i.key for i in store.list("runs/") if i.corruption] == [key]
    next_version = fresh.register(run_id="r3", capability="tool_call_precision", mode="GENERATION_MODE_LIBRARY",
                                  source="# env\n", report={"status": "ACCEPTED"}, target={}, tool_schemas=[]).version
    assert next_version == ("4" if skipped else "2")
