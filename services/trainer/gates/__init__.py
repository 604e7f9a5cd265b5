"""MoE gate training, owned by the trainer: the warm start and GRPO on the gates.

- `outcomes.py`: the warm start's default labels: every slot alone (the base, each adapter) replayed
  on target training tasks, each task labelled with the slot that scores there, with what the
  replays cost, stored once per job.
- `provenance.py`: the ablation's labels: each adapter's episodes (played by the job) and the base's
  own target trajectories for slot 0, stored once per job, with what playing them cost.
- `warm_start.py`: supervised warm start of the gates from labelled trajectories (assistant-generating
  positions only, routing forced to the label): its config and trainer, over
  `labelled_examples.py` (which positions of a trajectory carry its slot label, held-out split,
  batches), `teacher_forcing.py` (the layer inputs with routing forced to the label),
  `routing_report.py` (how often the trained gates choose the label) and
  `warm_start_checkpoints.py` (its checkpoint layout, written manifest last, verified on load).
- `config.py`: `GateGRPOConfig`, the job's config (GRPO's fields plus the warm start's) and the rules
  that refuse an inert field.
- `weights.py`: the gates as GRPO's trainable weights (`GateWeights`) and rollouts that count routing.
- `mixture.py`: what GRPO on the gates plays: the target's training split, or a seeded mixture of
  several targets.
- `grpo.py`: the job's loop: labels, warm start, then GRPO on the gates over the target's training
  tasks (backbone and adapters frozen), with its budget accounting.
- `job.py`: TRAINING_KIND_GATES, the trainer job around them (validation, worker side).

The composed model itself, routing and the routed LoRA math stay in `trace_common.moe`: the
inference service and the evaluation use them too.
"""
