"""Prometheus metrics of the inference service (one registry; see trace_common.metrics)."""

from prometheus_client import Counter, Gauge, Histogram

from trace_common.metrics import ServiceMetrics

M = ServiceMetrics("inference")
_r = M.registry

TOKENS_ROUTED = Counter("trace_inference_tokens_routed", "Token-layer routing decisions, by expert "
                        "(base or capability name).", ["expert"], registry=_r)
GENERATED_TOKENS = Counter("trace_inference_generated_tokens", "Completion tokens generated.", registry=_r)
PROMPT_TOKENS = Counter("trace_inference_prompt_tokens", "Prompt tokens processed.", registry=_r)
REQUEST_DURATION = Histogram("trace_inference_request_duration_seconds", "Generation request time, by API "
                             "(grpc, openai).", ["api"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
                             registry=_r)
TIME_TO_FIRST_TOKEN = Histogram("trace_inference_time_to_first_token_seconds", "Latency to the first token.",
                                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=_r)
REQUESTS_ACTIVE = Gauge("trace_inference_requests_active", "Generation requests in flight.", registry=_r)
COMPOSITIONS_LOADED = Gauge("trace_inference_compositions_loaded", "Compositions loaded.", registry=_r)
REQUESTS_CANCELLED = Counter("trace_inference_requests_cancelled", "Generations stopped because the client "
                             "cancelled (stream closed or HTTP client gone).", registry=_r)
