"""Prometheus metrics of the rollout service (one registry; see trace_common.metrics)."""

from prometheus_client import Counter, Gauge, Histogram

from trace_common.metrics import ServiceMetrics

M = ServiceMetrics("rollout")
_r = M.registry

EPISODES = Counter("trace_rollout_episodes", "Episodes finished, by environment and outcome "
                   "(success, failure, error).", ["env", "outcome"], registry=_r)
STEPS = Counter("trace_rollout_steps", "Agent turns taken, by environment.", ["env"], registry=_r)
TOKENS = Counter("trace_rollout_tokens", "Tokens processed by the policy, by kind (prompt, completion).",
                 ["kind"], registry=_r)
POLICY_ERRORS = Counter("trace_rollout_policy_errors", "Policy failures by reason (timeout, http, "
                        "malformed_tool_call, no_tool_call).", ["reason"], registry=_r)
EPISODE_REWARD = Histogram("trace_rollout_episode_reward", "Episode reward in [0, 1], by environment.",
                           ["env"], buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0), registry=_r)
EPISODE_DURATION = Histogram("trace_rollout_episode_duration_seconds", "Wall time of one episode.",
                             ["env"], buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=_r)
EPISODES_ACTIVE = Gauge("trace_rollout_episodes_active", "Episodes being played now.", registry=_r)
