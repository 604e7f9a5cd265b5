"""Inference service process.

Launch: `TRACE_INFERENCE_PORT=50055 TRACE_INFERENCE_HTTP_PORT=8000 TRACE_INFERENCE_METRICS_PORT=9105 python -m services.inference`
(all settings: services/inference/settings.py and trace_common/config.py, env prefix TRACE_INFERENCE_).
The OpenAI-compatible API (/v1/chat/completions) listens on TRACE_INFERENCE_HTTP_HOST:HTTP_PORT; load a
composition with the LoadComposition RPC (or run `tracectl serve`, which loads one and prints all addresses).
"""

from services.launch import main

if __name__ == "__main__":
    main("inference")
