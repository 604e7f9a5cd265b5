"""Environment service process.

Launch: `TRACE_ENVIRONMENT_PORT=50053 TRACE_ENVIRONMENT_METRICS_PORT=9103 python -m services.environment`
(all settings: services/environment/settings.py and trace_common/config.py, env prefix TRACE_ENVIRONMENT_).
"""

from services.launch import main

if __name__ == "__main__":
    main("environment")
