"""MoE gate training, owned by the trainer: the warm start from provenance and GRPO on the gates.

- `provenance.py`: the warm start's data: each adapter's episodes (played by the job) and the base's
  own target trajectories for slot 0, stored once per job, with what playing them cost.
- `warm_start.py`: supervised warm start of the gates from provenance labels (assistant-generating
  positions only).
- `grpo.py`: the job's loop: provenance, warm start, then GRPO on the gates over the target's
  training tasks (backbone and adapters frozen), with its budget accounting.
- `job.py`: TRAINING_KIND_GATES, the trainer job around them (validation, worker side).

The composed model itself, routing and the routed LoRA math stay in `trace_common.moe`: the
inference service and the evaluation use them too.
"""
