"""tau2-bench compatibility: a tau2 data directory as TRACE environments and tools.

- `data.load_domain(dir)`: policy, tasks (seed = index in tasks.json), train/test splits, DB.
- `retail_tools.RetailTools`: TRACE's implementation of tau2's 16 retail tools (same schemas,
  tool-message contents, error texts and DB effects; checked against tau2-bench's own code).
- `evaluator.Tau2Evaluator`: tau2's replay-based reward (DB, communicate, action, basis).
- `environment.Tau2Environment`: the SDK environment, registered as `tau2-retail`.
- `replay`: gold-action replay (the command line is `tracectl tau2 replay-gold`).

Importing this package registers `tau2-retail` (no data is read until an environment is made).
"""

from trace_common.domains.tau2.environment import Tau2Environment, make_tau2_retail
from trace_common.env import register

register(
    Tau2Environment.name, Tau2Environment.version, make_tau2_retail,
    description=Tau2Environment.description,
    params={
        "data": "tau2 data root (retail/, user_simulator/) or the retail directory; default $TRACE_TAU2_DATA",
        "user_base_url": "OpenAI-compatible endpoint of the user simulator LLM; default $TRACE_TAU2_USER_BASE_URL",
        "user_model": "model name for the user simulator; default $TRACE_TAU2_USER_MODEL",
        "user_api_key": "API key for the user endpoint; default $TRACE_TAU2_USER_API_KEY",
        "user_seed": "sampling seed sent to the user LLM (deterministic where the endpoint supports it)",
        "user_temperature": "user LLM temperature (default 0.0, as tau2)",
        "max_steps": "tau2 step limit over all messages (default 200)",
        "max_errors": "tool errors that end an episode (default 10)",
        "user_replies": "JSON list of scripted user replies (offline runs; no LLM)",
        "user_timeout": "per-request timeout of the user LLM in seconds (default 120)",
        "user_max_tokens": "cap on the tokens of one user reply (default: the endpoint's own limit)",
    },
)

__all__ = ["Tau2Environment", "make_tau2_retail"]
