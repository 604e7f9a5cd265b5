"""Rollout service process.

Launch: `TRACE_ROLLOUT_PORT=50051 TRACE_ROLLOUT_METRICS_PORT=9101 python -m services.rollout`
(all settings: services/rollout/settings.py and trace_common/config.py, env prefix TRACE_ROLLOUT_).
"""

from services.launch import main

if __name__ == "__main__":
    main("rollout")
