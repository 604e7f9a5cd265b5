"""The grouped path on a CUDA device (same torch code as on CPU); skipped where no GPU exists."""

from __future__ import annotations

import pytest
import torch

from tests.unit.moe.conftest import randomize_gates, token_batch
from trace_common.moe import MoEConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_grouped_on_gpu_matches_cpu_reference_and_generates(families, family):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    fam = families[family]
    oracle = fam.composed(MoEConfig(implementation="reference"))
    fast = fam.composed().to("cuda")
    randomize_gates(oracle, seed=3)
    fast.load_gate_state_dict({k: v.to("cuda") for k, v in oracle.gate_state_dict().items()})
    ids = token_batch(3, 16, seed=4)
    with torch.no_grad(), fast.capture_routing() as gpu_trace:
        on_gpu = fast(input_ids=ids.cuda()).logits.cpu()
    with torch.no_grad(), oracle.capture_routing() as cpu_trace:
        on_cpu = oracle(input_ids=ids).logits
    assert torch.equal(gpu_trace.experts().cpu(), cpu_trace.experts())
    assert (on_gpu - on_cpu).abs().max().item() <= 1e-4
    with torch.no_grad():
        gen = fast.generate(input_ids=ids.cuda(), attention_mask=torch.ones_like(ids).cuda(), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                            output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        full = fast(input_ids=gen.sequences, use_cache=False).logits
    cached = torch.stack(gen.logits, dim=1)
    assert (full[:, ids.shape[1] - 1:-1] - cached).abs().max().item() <= 1e-4
