"""Analysis service process.

Launch: `TRACE_ANALYSIS_PORT=50052 TRACE_ANALYSIS_METRICS_PORT=9102 python -m services.analysis`
(all settings: services/analysis/settings.py and trace_common/config.py, env prefix TRACE_ANALYSIS_).
"""

from services.launch import main

if __name__ == "__main__":
    main("analysis")
