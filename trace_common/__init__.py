"""Code shared by the TRACE services and tracectl. Two kinds, kept apart by subpackage:

* infrastructure, no TRACE method in it: `config`, `errors`, `artifacts` (file:// and S3 stores),
  `grpc` (servers, clients, auth), `proto` (generated), `metrics`, `jobs`, `limits`, `malloc`,
  `data_roots`, `model_refs`, `endpoints`, `llm` (OpenAI-compatible clients), `hf_load`, `pyast`,
  `specs`, `suggest`, `stats`;
* TRACE's core, which several services share: `env` (the environment SDK, trajectories,
  guidance and calibration-batch contracts), `domains` (the built-in targets: store, tau2),
  `policy` (policy backends and chat formatting), `agents` (the built-in base agents and their
  builds), `moe` (routed-LoRA composition and its gates).

Services never import each other; they share this package and the generated protos
(`trace_common.proto.trace.v1`), and nothing here names a service.
"""

__version__ = "0.1.0"
