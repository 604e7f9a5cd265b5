"""Prometheus metrics of the analysis service (one registry; see trace_common.metrics)."""

from prometheus_client import Counter, Histogram

from trace_common.metrics import ServiceMetrics

M = ServiceMetrics("analysis")
_r = M.registry

LABELS = Counter("trace_analysis_labels", "Labels assigned, by value (NA, PRESENT, LACKING) and mode.",
                 ["label", "mode"], registry=_r)
LLM_REQUESTS = Counter("trace_analysis_llm_requests", "Analyst LLM requests by outcome "
                       "(ok, invalid_json, schema_error, timeout, http_error).", ["outcome"], registry=_r)
LLM_REQUEST_DURATION = Histogram("trace_analysis_llm_request_duration_seconds", "Analyst LLM request time.",
                                 buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=_r)
CAPABILITIES = Counter("trace_analysis_capabilities", "Candidate capabilities decided, by outcome "
                       "(retained, rejected).", ["outcome"], registry=_r)
