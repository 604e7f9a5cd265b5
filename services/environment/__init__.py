"""Environment service: generate, sandbox, validate and serve one environment per capability."""
