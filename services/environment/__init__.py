"""Environment service: generate, sandbox, validate and serve one environment per capability.

Modules (domain code has no gRPC; `servicer.py` only translates):

- `library/`: TRACE's reference environments, one family per capability reported on tau2-bench
  (`kit.py` + one module per family; `bundle()` makes a self-contained module per target).
- `targets.py`: the target's surface as the SDK describes it (`trace_common.env.describe_target`:
  verbatim system prompt, every tool schema, greeting, record toolkit); no per-target tables.
- `candidates.py`: mode library (bundle) and mode llm (prompt -> module -> validation -> feedback).
- `sandbox/`: the locked-down worker process (`python -m services.environment.sandbox.worker`),
  its kernel layers and its parent-side client (`SandboxWorker`, `SandboxEnvironment`).
- `validation.py`, `baseline_policies.py`, `calibration.py`: the checks and the validation report.
- `registry.py`: environments in the artifact store (code, manifest, validation report, sha256).
- `serving.py`: instances served by seed from sandbox workers; `trace_common.env.remote`: the same over gRPC (used by the trainer).
- `service.py` (domain object), `servicer.py`, `app.py`, `settings.py`, `specs.py`, `metrics.py`.
"""
