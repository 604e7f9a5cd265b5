"""Prometheus metrics of the environment service (one registry; see trace_common.metrics)."""

from prometheus_client import Counter, Gauge, Histogram

from trace_common.metrics import ServiceMetrics

M = ServiceMetrics("environment")
_r = M.registry

VALIDATIONS = Counter("trace_environment_validations", "Candidate environments validated, by mode "
                      "(library, llm) and status (accepted, rejected).", ["mode", "status"], registry=_r)
SANDBOX_VIOLATIONS = Counter("trace_environment_sandbox_violations", "Sandbox limits hit or forbidden operations "
                             "blocked, by kind (cpu, memory, processes, file_size, timeout, network, output, "
                             "filesystem, limits, native, introspection, environment, syscall, crash, protocol, killed (from "
                             "outside the sandbox); "
                             "see services/environment/sandbox/parent.py).", ["kind"], registry=_r)
SANDBOX_STEP_DURATION = Histogram("trace_environment_sandbox_step_duration_seconds",
                                  "Round-trip time of one env call through the sandbox.",
                                  buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
                                  registry=_r)
EPISODES_OPEN = Gauge("trace_environment_episodes_open", "Episodes open in sandbox workers.", registry=_r)
