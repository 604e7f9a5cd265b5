"""Trainer service process.

Launch: `TRACE_TRAINER_PORT=50054 TRACE_TRAINER_METRICS_PORT=9104 python -m services.trainer`
(all settings: services/trainer/settings.py and trace_common/config.py, env prefix TRACE_TRAINER_).
"""

from services.launch import main

if __name__ == "__main__":
    main("trainer")
