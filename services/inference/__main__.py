"""Inference service process.

Launch: `TRACE_INFERENCE_PORT=50055 TRACE_INFERENCE_METRICS_PORT=9105 python -m services.inference`
(all settings: services/inference/settings.py and trace_common/config.py, env prefix TRACE_INFERENCE_).
"""

from trace_common.grpc.launch import main

if __name__ == "__main__":
    main("inference")
