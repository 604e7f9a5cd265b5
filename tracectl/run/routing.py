"""Routing statistics for the report: which expert the composition picks, by token position
and task type, and one generation with every token coloured by its expert.

Done through the inference service (LoadComposition, then Generate with
`return_routing_trace`), on the opening of held-out episodes the TRACE arm played (system
prompt, user request and tool schemas from its trajectories), so the numbers describe the
model the evaluation measured, served the way users serve it.

Per token the report counts the expert chosen at every layer (a token routed to adapter k in
3 of 4 layers adds 3 to k and 1 to the other slot), so the heat map shows the share of
(layer, token) decisions per slot.
"""

from __future__ import annotations

import json
from collections import defaultdict

from trace_common.artifacts import ArtifactStore
from trace_common.env import loads_jsonl
from trace_common.grpc.client import messages
from trace_common.moe.composition_io import CompositionManifest
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.run.results import ExpertUsage, RoutedExample, RoutedToken

INF = messages("inference")
POSITION_BUCKETS = 8


def composition_spec(store: ArtifactStore, manifest_uri: str, name: str):
    """CompositionSpec (proto) from a composition manifest in `store`."""
    man = CompositionManifest.model_validate_json(store.get_bytes(store.key_of(manifest_uri)))
    return INF.CompositionSpec(name=name, base_model=man.base_model, gates_uri=man.gates_uri,
                               adapters=[INF.AdapterRef(name=a.name, uri=a.uri) for a in man.adapters])


def _opening(tr) -> list[t.ChatMessage]:
    """System and user messages before the first assistant turn."""
    out = []
    for m in tr.messages:
        if m.role == "assistant":
            break
        out.append(t.ChatMessage(role=m.role, content=m.content or ""))
    return out


def routing_usage(stub, store: ArtifactStore, composition_uri: str, trajectories_uri: str, *,
                  name: str, per_task_type: int = 3, max_tokens: int = 64) -> tuple[ExpertUsage, RoutedExample | None]:
    """Load the composition into the inference service and trace `per_task_type` openings per
    task type. Returns the usage (rows: {task_type: [[count per expert] per bucket]}) and the
    opening whose routing is the most varied (None when nothing was traced)."""
    spec = composition_spec(store, composition_uri, name)
    stub.LoadComposition(INF.LoadCompositionRequest(spec=spec))
    experts = ["base", *[a.name for a in spec.adapters]]
    trajs = list(loads_jsonl(store.get_bytes(store.key_of(trajectories_uri))))
    by_type: dict[str, list] = defaultdict(list)
    for tr in trajs:
        task_type = str(tr.info.get("task_type") or tr.info.get("capability") or "all")
        if len(by_type[task_type]) < per_task_type:
            by_type[task_type].append(tr)
    rows: dict[str, list[list[int]]] = {}
    example: RoutedExample | None = None
    played = 0
    for task_type, group in sorted(by_type.items()):
        grid = [[0] * len(experts) for _ in range(POSITION_BUCKETS)]
        for tr in group:
            resp = stub.Generate(INF.GenerateRequest(
                model=name, messages=_opening(tr), tools=[t.ToolSchema(json=json.dumps(x)) for x in tr.tools],
                sampling=t.SamplingParams(temperature=0.0, max_tokens=max_tokens), return_routing_trace=True))
            played += 1
            trace = list(resp.routing_trace)
            for pos, route in enumerate(trace):
                bucket = min(POSITION_BUCKETS - 1, pos * POSITION_BUCKETS // max(1, max_tokens))
                for e in route.experts:
                    grid[bucket][e] += 1
            distinct = len({e for r in trace for e in r.experts})
            if trace and (example is None or distinct > (example.distinct or 0)):   # the most varied so far
                majority = [_majority(r.experts) for r in trace]
                example = RoutedExample(task_id=tr.task_id, task_type=task_type, experts=experts, distinct=distinct,
                                        tokens=[RoutedToken(text=r.token_text, expert_index=m, expert=experts[m],
                                                            layers=list(r.experts))
                                                for r, m in zip(trace, majority, strict=True)])
        rows[task_type] = grid
    return ExpertUsage(experts=experts, rows=rows, episodes=played), example


def _majority(experts) -> int:
    counts: dict[int, int] = defaultdict(int)
    for e in experts:
        counts[int(e)] += 1
    return max(sorted(counts), key=lambda k: counts[k]) if counts else 0
