"""The artifact store goes away mid-run: the training job fails with the store's reason, and the
last checkpoint written before the outage is complete and verified when the store comes back.
A real S3 server (rclone serve s3) is stopped under a running worker process and restarted on
the same data directory."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from tests.support.s3 import ACCESS_KEY, SECRET_KEY, start_rclone_s3
from tests.unit.trainer.grpo.helpers import tiny_tokenizer, warm_model
from trace_common.jobs import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PREFIX = "runs/outage/adapters/pick_skill"


def test_store_outage_fails_the_job_and_keeps_the_last_checkpoint(tmp_path):
    model_dir = tmp_path / "model"
    warm_model("pick").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    server = start_rclone_s3(tmp_path / "s3" / "data")
    try:
        bucket = server.make_bucket()
        settings = TrainerSettings(artifact_root=f"s3://{bucket}", s3_endpoint=server.endpoint,
                                   s3_access_key=ACCESS_KEY, s3_secret_key=SECRET_KEY, work_dir=str(tmp_path / "w"),
                                   env_modules=["tests.unit.trainer.grpo.toy_registry"], torch_threads=1)
        domain = Training(settings)
        spec = TrainingSpecModel.model_validate(dict(
            kind="TRAINING_KIND_ADAPTER", capability="pick_skill", environments=[{"name": "toy-pick"}],
            policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": str(model_dir)},
            config=dict(max_steps=400, groups_per_batch=2, num_generations=4, max_completion_length=4,
                        save_steps=2, lora_r=4, early_stop_uninformative_iterations=0, guidance_fraction=0.0)))

        async def go():
            rec = domain.create_job(spec, "outage", {}, "")
            async for snap in domain.jobs.watch(rec.job_id):
                if snap.stage == "checkpoint 2":
                    server.stop()                                   # MinIO goes down
                    break
            return await domain.jobs.wait(rec.job_id, 300)
        final = asyncio.run(go())
    finally:
        server.stop()
    assert final.state == JobState.FAILED
    assert final.error_code == "UNAVAILABLE", final.error_message
    # rclone keeps object metadata (the store's sha256 records) in memory only, so the bytes are
    # checked here against the checkpoint's own manifest, straight from the server's data directory.
    root = tmp_path / "s3" / "data" / bucket / PREFIX
    complete = sorted(int(d.name.split("-")[1]) for d in root.glob("ckpt-*") if (d / "checkpoint.json").is_file())
    assert complete and complete[-1] >= 2
    last = root / f"ckpt-{complete[-1]}"
    manifest = json.loads((last / "checkpoint.json").read_text())
    assert manifest["iteration"] == complete[-1]
    for name, rec in manifest["files"].items():
        data = (last / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == rec["sha256"] and len(data) == rec["size"], name
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["iteration"] == complete[-1] and state["seed_cursor"] == 2 * complete[-1]
