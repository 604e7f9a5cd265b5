"""The sandbox that runs environment code (generated or library) outside the service process.

- `parent.py`: the service side: `SandboxConfig`, `SandboxWorker` (spawn, JSON Lines, deadlines,
  classification of a dead worker), `SandboxViolation`.
- `environment.py`: `SandboxEnvironment`, an `Environment` whose code runs in a worker.
- `worker.py` (`python -m services.environment.sandbox.worker`): the locked-down worker process.
- `isolation.py`: the kernel layers the worker puts itself under before loading code.
- `pods.py`: the worker in a locked-down Kubernetes pod of its own (backend "kubernetes").
- `static_check.py`: validation's advisory static check of environment source.

Nothing is imported here: the worker process imports this package first, and it must not pull
in the parent side's modules.
"""
