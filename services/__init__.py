"""The five TRACE services. Each is a process: `python -m services.<name>`."""
