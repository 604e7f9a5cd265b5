"""Prometheus metrics of the trainer service (one registry; see trace_common.metrics).

Per-iteration values are gauges labelled by capability (bounded: one per retained capability).
"""

from prometheus_client import Counter, Gauge, Histogram

from trace_common.metrics import ServiceMetrics

M = ServiceMetrics("trainer")
_r = M.registry

ITERATIONS = Counter("trace_trainer_iterations", "GRPO iterations completed, by capability.",
                     ["capability"], registry=_r)
REWARD_MEAN = Gauge("trace_trainer_reward_mean", "Mean rollout reward of the last iteration.",
                    ["capability"], registry=_r)
PASS_RATE = Gauge("trace_trainer_pass_rate", "Pass rate of the last iteration's rollouts.",
                  ["capability"], registry=_r)
INFORMATIVE_GROUP_FRACTION = Gauge("trace_trainer_informative_group_fraction",
                                   "Fraction of GRPO groups whose rewards are not all equal.",
                                   ["capability"], registry=_r)
LOSS = Gauge("trace_trainer_loss", "Policy loss of the last iteration.", ["capability"], registry=_r)
KL = Gauge("trace_trainer_kl", "KL to the frozen base of the last iteration.", ["capability"], registry=_r)
STEP_DURATION = Histogram("trace_trainer_step_duration_seconds", "Wall time of one GRPO iteration.",
                          ["capability"], buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600), registry=_r)
TOKENS = Counter("trace_trainer_tokens", "Tokens trained on.", ["capability"], registry=_r)
ADAPTER_LOADS = Counter("trace_trainer_adapter_loads", "Adapter versions hot-loaded into vLLM, by outcome.",
                        ["outcome"], registry=_r)
