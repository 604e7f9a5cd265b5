"""CreateTrainingJob's resume_from_uri: a checkpoint URI that ListCheckpoints returned (or its directory)
resumes the new job from that checkpoint on the embedded file:// store; a URI outside this trainer's
store is refused (INVALID_ARGUMENT naming spec.resume_from_uri) before a job exists, and so are one
with no checkpoint there (NOT_FOUND) and one trained on another model (FAILED_PRECONDITION: the worker
would refuse it only after loading the model)."""

from __future__ import annotations

import asyncio

import pytest

from services.trainer.grpo import checkpoint as ckpt
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.session import make_trainer
from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from tests.unit.trainer.grpo.helpers import PickEnv, tiny_tokenizer, warm_model
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound
from trace_common.jobs import JobState

CONFIG = dict(max_steps=2, save_steps=1, groups_per_batch=2, num_generations=4, max_completion_length=3, lora_r=4,
              learning_rate=5e-3, seed=1, early_stop_uninformative_iterations=0)


def spec(**kw) -> TrainingSpecModel:
    base = dict(kind="TRAINING_KIND_ADAPTER", capability="pick_skill",
                environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
                policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config=dict(CONFIG))
    base.update(kw)
    return TrainingSpecModel.model_validate(base)


class InProcess:
    """The executor of these tests: what the worker does with its WorkerSpec (the config, the prefix,
    `trainer.train(resume=spec.resume_from or True)`), in this process, on the toy PickEnv."""

    def __init__(self, domain: Training):
        self.domain = domain
        self.specs: list = []
        self.played: list[int] = []

    async def run(self, wspec, on_event):
        self.specs.append(wspec)
        rows: list[int] = []

        def train():
            trainer = make_trainer(GRPOConfig.model_validate(wspec.config), warm_model("pick"), tiny_tokenizer(),
                                   PickEnv, store=self.domain.store, prefix=wspec.prefix, capability=wspec.capability,
                                   on_event=lambda k, p: rows.append(p["iteration"]) if k == "iteration" else None,
                                   model_label=ckpt.model_label(wspec.policy["model"], wspec.policy["adapter_uri"]))
            return trainer.train(resume=wspec.resume_from or True, write_adapter=False)
        result = await asyncio.to_thread(train)
        self.played.append(len(rows))
        return {"iterations": result.iterations, "stop_reason": result.stop_reason}


@pytest.mark.parametrize("form", [
    lambda uri: uri,                          # the checkpoint.json URI ListCheckpoints returns
    lambda uri: uri.rsplit("/", 1)[0],        # its checkpoint's directory
    lambda uri: uri.rsplit("/", 1)[0] + "/",
], ids=["checkpoint.json", "directory", "directory/"])
def test_a_listed_checkpoint_of_a_file_store_resumes_a_new_job(tmp_path, form):
    domain = Training(TrainerSettings(artifact_root=(tmp_path / "store").as_uri(), work_dir=str(tmp_path / "work")))
    executor = domain.local = InProcess(domain)

    async def go():
        first = domain.create_job(spec(), "r1", {}, "")
        done = await domain.jobs.wait(first.job_id, 300)
        assert done.state == JobState.SUCCEEDED, done.error_message
        listed = domain.list_checkpoints(first.job_id)
        assert [c.iteration for c in listed] == [1, 2]
        second = domain.create_job(spec(resume_from_uri=form(listed[0].uri)), "r2", {}, "")
        return await domain.jobs.wait(second.job_id, 300)
    final = asyncio.run(go())
    assert final.state == JobState.SUCCEEDED, final.error_message
    assert executor.specs[1].resume_from == "runs/r1/adapters/pick_skill/ckpt-1/checkpoint.json"
    assert executor.played == [2, 1]      # the second job continued after iteration 1: one iteration left


@pytest.mark.parametrize("uri", [
    "file:///elsewhere/runs/r1/adapters/pick_skill/ckpt-1/checkpoint.json",
    "STORE-other/runs/r1/adapters/pick_skill/ckpt-1/checkpoint.json",    # a sibling whose name starts alike
    "s3://bucket/runs/r1/adapters/pick_skill/ckpt-1/checkpoint.json",
    "STORE",                                                             # the root itself: no checkpoint
])
def test_a_uri_outside_the_store_is_refused(tmp_path, uri):
    domain = Training(TrainerSettings(artifact_root=(tmp_path / "store").as_uri(), work_dir=str(tmp_path / "work")))
    uri = uri.replace("STORE", domain.store.root_uri)

    async def go():
        domain.create_job(spec(resume_from_uri=uri), "r1", {}, "")
    with pytest.raises(InvalidArgument) as err:
        asyncio.run(go())
    assert err.value.reason.startswith("spec.resume_from_uri") and "a checkpoint in this trainer's artifact store" \
        in err.value.reason
    assert domain.jobs.list()[0] == []


@pytest.mark.parametrize("policy, where, error, needle", [
    ({"model": "smollm2"}, "listed", FailedPrecondition, "was trained on model 'micro', and this job trains model "
                                                         "'smollm2'"),
    ({"model": "micro", "adapter_uri": "ADAPTER"}, "listed", FailedPrecondition, "this job trains model 'micro+"),
    ({"model": "micro"}, "missing", NotFound, "no complete checkpoint"),
])
def test_a_checkpoint_of_another_model_or_none_is_refused_before_a_job_exists(tmp_path, policy, where, error,
                                                                              needle):
    domain = Training(TrainerSettings(artifact_root=(tmp_path / "store").as_uri(), work_dir=str(tmp_path / "work")))
    domain.local = InProcess(domain)
    adapter = domain.store.put_bytes("runs/r0/adapters/a/v1/adapter_config.json", b"{}").uri.rsplit("/", 1)[0]

    async def go():
        first = domain.create_job(spec(), "r1", {}, "")
        assert (await domain.jobs.wait(first.job_id, 300)).state == JobState.SUCCEEDED
        listed = domain.list_checkpoints(first.job_id)
        uri = listed[0].uri if where == "listed" else listed[0].uri.replace("ckpt-1", "ckpt-9")
        before = len(domain.jobs.list()[0])
        with pytest.raises(error) as err:
            domain.create_job(spec(resume_from_uri=uri, policy={"backend": "POLICY_BACKEND_IN_PROCESS",
                                                                **{k: v.replace("ADAPTER", adapter)
                                                                   for k, v in policy.items()}}), "r2", {}, "")
        assert len(domain.jobs.list()[0]) == before   # no job was created
        return err.value
    refused = asyncio.run(go())
    assert needle in refused.reason, refused.reason
