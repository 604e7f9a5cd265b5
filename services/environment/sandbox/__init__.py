"""The sandbox that runs environment code (generated or library) outside the service process.

- `config.py`: the settings of a worker, `SandboxConfig` and `PodConfig`.
- `parent.py`: the service side: `SandboxWorker` (spawn, JSON Lines, deadlines), the process
  transport, `SandboxViolation`.
- `endings.py`: how a worker that stopped answering ended (`classify_ending`, the supervisor's
  exit line, the kernel's OOM-kill counter), for both transports.
- `environment.py`: `SandboxEnvironment`, an `Environment` whose code runs in a worker.
- `worker.py` (`python -m services.environment.sandbox.worker`): the locked-down worker process.
- `isolation.py`: the kernel layers the worker puts itself under before loading code.
- `pods.py`: the worker in a locked-down Kubernetes pod of its own (backend "kubernetes").
- `static_check.py`: validation's advisory static check of environment source.

Nothing is imported here: the worker process imports this package first, and it must not pull
in the parent side's modules.
"""
