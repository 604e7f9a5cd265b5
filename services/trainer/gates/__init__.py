"""MoE gate training, owned by the trainer: the warm start from provenance and GRPO on the gates.

- `warm_start.py`: supervised warm start of the gates from provenance labels.
- `grpo.py`: GRPO on the gates of a composition (backbone and adapters frozen).
- `job.py`: TRAINING_KIND_GATES, the trainer job around them (validation, worker side).

The composed model itself, routing and the routed LoRA math stay in `trace_common.moe`: the
inference service and the evaluation use them too.
"""
