"""A composition as an in-process policy: what the rollout service plays when a PolicyRef
names a `composition_uri` (the evaluation's TRACE arms, gate-training provenance).

It is the batched transformers backend (`TransformersPolicy`) run on the composition's base
model, whose decoder layers carry the composition's routing hooks, so every forward pass --
prefill, prefix reuse and each decode step -- routes per token:

* `token`: the gates route every token at every layer (the TRACE semantics);
* `per_request`: for each request the gates' mean routing over its prompt picks one slot
  (`PerRequestChooser`: `choose_adapter_per_request` that runs only the tokens an earlier turn
  has not), and the request is generated with routing forced to that slot -- what an engine
  with per-request LoRA selection serves. Requests are grouped by slot; each slot keeps its
  own prefix cache (a prefix's KV depends on the slot it ran under);
* `merged`: one adapter folded into the base weights (no routing at all);
* `soft_trajectory`: the ablation (`soft_routing`): per request and layer, the mean gate softmax
  over its prompt weights every adapter on every token (`generate_soft_batch`; no prefix cache,
  since a prefix's KV depends on the request's weights). Same gates as `token`: they are trained
  for hard per-token top-1, this mode only changes how they are applied.

Generation runs on the backend's single worker thread, so forcing and mixing (global model
state) never overlap another batch; rendering, batching, errors and turn records are the
backend's own (only `_run`, how one batch is generated, differs). The slot chosen per request is
counted in `slot_requests` (per_request); soft requests add their weights, averaged over layers,
to `mixture_sums` (slot name -> sum over requests).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from trace_common.model_refs import ModelRoots
from trace_common.moe.composition_io import LoadedComposition, Routing, load_composition
from trace_common.moe.export import PerRequestChooser
from trace_common.moe.soft_routing import generate_soft_batch
from trace_common.policy.generation import GenerationOutput, PrefixCache, RowParams, generate_batch
from trace_common.policy.transformers_backend import TransformersPolicy


class RoutedPolicy(TransformersPolicy):
    """`TransformersPolicy` over a loaded composition (module docstring)."""

    def __init__(self, loaded: LoadedComposition, *, name: str = "composition", **kwargs: Any):
        model = loaded.composed.base if loaded.composed is not None else loaded.model
        super().__init__(model, loaded.tokenizer, name=name, **kwargs)
        self.loaded = loaded
        self.routing: Routing = loaded.routing
        self._slot_caches: dict[int, PrefixCache] = defaultdict(lambda: PrefixCache(max_bytes=1 << 30))
        self._chooser = (PerRequestChooser(loaded.composed)
                         if loaded.composed is not None and self.routing == "per_request" else None)
        self.slot_requests: Counter[str] = Counter()
        self.mixture_sums: Counter[str] = Counter()

    def _run(self, prompts: list[list[int]], params: list[RowParams]) -> list[GenerationOutput]:
        composed = self.loaded.composed
        if composed is not None and self.routing == "soft_trajectory":
            outputs, weights = generate_soft_batch(composed, prompts, params, stop_ids=self.stop_ids,
                                                   pad_id=self.pad_id)
            for row_mean in weights.mean(dim=0).tolist():  # [B][K+1], averaged over layers
                for name, value in zip(self.loaded.expert_names, row_mean, strict=True):
                    self.mixture_sums[name] += value
            return outputs
        if self._chooser is None or composed is None:
            return super()._run(prompts, params)
        groups: dict[int, list[int]] = defaultdict(list)
        for row, prompt in enumerate(prompts):
            choice = self._chooser.choose(list(prompt))
            groups[choice.slot].append(row)
            self.slot_requests[self.loaded.expert_names[choice.slot]] += 1
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        for slot, rows in sorted(groups.items()):
            with composed.forced(slot):
                gen = generate_batch(self.model, [prompts[r] for r in rows], [params[r] for r in rows],
                                     stop_ids=self.stop_ids, pad_id=self.pad_id, prefix_cache=self._slot_caches[slot])
            for row, out in zip(rows, gen, strict=True):
                outputs[row] = out
        return outputs  # type: ignore[return-value]


def composition_policy(uri: str, base_dir: str | Path | None = None, *, routing: Routing = "token",
                       s3=None, name: str = "composition", allowed: ModelRoots) -> RoutedPolicy:
    """Load the composition manifest at `uri` and wrap it as a policy. `base_dir`, when given,
    must be the base model the composition was trained on (checked by load_composition's own
    validation when the manifest names the same agent). `allowed`: which references the manifest
    and what it names may be (trace_common.model_refs)."""
    loaded = load_composition(uri, routing=routing, s3=s3, allowed=allowed)
    if base_dir is not None and loaded.base_dir.resolve() != Path(base_dir).resolve():
        from trace_common.errors import InvalidArgument

        raise InvalidArgument(field="policy.model", expected=f"the composition's base model ({loaded.base_dir})",
                              got=str(base_dir), fix="leave policy.model as the base agent the run trained on")
    return RoutedPolicy(loaded, name=name)
