"""`Pipeline.check` tells the trainer the run's executor only when that trainer will run the jobs
(tracectl/run/pipeline.py): then it checks vLLM rollouts against its own settings as it will check
the jobs; a stand-in (the embedded trainer asked about a config that deploys one: --check's offline
pass) parses the fields only, since it has not the deployment's endpoint profiles or adapter root."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
import yaml
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.run.config import RunConfig
from tracectl.run.pipeline import Pipeline

T = messages("trainer")
CLUSTER = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples" / "tau2-retail-vllm.yaml").read_text())


class _Unimplemented(grpc.RpcError):
    """An older rollout service without ListRolloutEnvironments: the target check is left to its jobs."""

    def code(self):
        return grpc.StatusCode.UNIMPLEMENTED


class Conn:
    """Stand-in for tracectl.connect.Connection: `deployed` names the services it addresses; the
    trainer's ValidateTrainingConfig records each request and answers with the config it was sent."""

    def __init__(self, deployed: set[str]):
        self._deployed = deployed
        self.requests: list = []

    def deployed(self, service: str) -> bool:
        return service in self._deployed

    def stub(self, service: str):
        if service == "trainer":
            return SimpleNamespace(ValidateTrainingConfig=self._validate)
        return SimpleNamespace(ListRolloutEnvironments=self._unimplemented)

    def _validate(self, request):
        self.requests.append(request)
        s = Struct()
        s.update(MessageToDict(request.config.values))
        return T.ValidateTrainingConfigResponse(config=t.Config(values=s))

    @staticmethod
    def _unimplemented(request):
        raise _Unimplemented()


@pytest.mark.parametrize(("services", "deployed", "executor", "sent"), [
    # the deployed trainer the connection addresses (a run, or --check's network pass): the job check
    (CLUSTER["services"], {"trainer", "rollout"}, "kubernetes", T.EXECUTOR_KUBERNETES),
    # the embedded trainer standing in for a deployed one (--check's offline pass): the fields only
    (CLUSTER["services"], set(), "kubernetes", T.EXECUTOR_UNSPECIFIED),
    # a run whose trainer is embedded (it runs the jobs itself): the job check under the run's executor
    ({"rollout": "trace-rollout:50051"}, {"rollout"}, "kubernetes", T.EXECUTOR_KUBERNETES),
    ({"rollout": "trace-rollout:50051"}, {"rollout"}, "local", T.EXECUTOR_LOCAL),
])
def test_the_trainer_is_told_the_executor_only_when_it_trains(services, deployed, executor, sent):
    cfg = RunConfig.model_validate({**CLUSTER, "services": services,
                                    "training": {**CLUSTER["training"], "executor": executor}})
    conn = Conn(deployed)
    checked = Pipeline(cfg, SimpleNamespace(conn=conn), None, None).check()  # type: ignore[arg-type]
    assert [r.field_path for r in conn.requests] == ["training.grpo", "training.grpo", "gates.config"]
    assert {r.executor for r in conn.requests} == {sent}
    assert checked[-1] == "gates.config"
    assert MessageToDict(conn.requests[0].config.values)["rollout_backend"] == "vllm"   # what is checked
