"""Process entry point shared by `python -m services.<name>`: settings from env, serve, stop on SIGTERM.

It lives on the services' side (not in trace_common) because it names the services: `build(name)`
imports `services.<name>.settings` and `services.<name>.app`. `tracectl` uses it to start the
embedded stack in-process."""

from __future__ import annotations

import asyncio
import importlib
import sys

from pydantic import ValidationError

from trace_common.config import SERVICE_NAMES
from trace_common.grpc.server import TraceServer, configure_logging, run_forever
from trace_common.malloc import limit_arenas_or_exit


def build(service: str, **overrides):
    """(settings, ServiceDefinition) of one service; `overrides` win over env vars."""
    if service not in SERVICE_NAMES:
        raise ValueError(f"unknown service {service!r}; expected one of {', '.join(SERVICE_NAMES)}")
    settings_mod = importlib.import_module(f"services.{service}.settings")
    app = importlib.import_module(f"services.{service}.app")
    cls = next(v for k, v in vars(settings_mod).items() if k.endswith("Settings") and k != "ServiceSettings")
    settings = cls(**overrides)
    return settings, app.create_service(settings)


def main(service: str) -> None:
    limit_arenas_or_exit(service)  # before the server's threads (trace_common/malloc.py)
    try:
        settings, definition = build(service)
    except ValidationError as err:
        print(f"{service}: invalid settings (env TRACE_{service.upper()}_*):", file=sys.stderr)
        for e in err.errors():
            print(f"  {'.'.join(map(str, e['loc'])) or '-'}: {e['msg']}", file=sys.stderr)
        sys.exit(2)
    configure_logging(settings.log_level)
    server = TraceServer(settings, definition)

    def ready() -> None:
        http = f" http={definition.http_url}" if definition.http_url else ""
        print(f"{service} ready: grpc={server.target}{http} metrics={server.metrics_server.url} "
              f"auth={'on' if server.auth else 'off'}", flush=True)

    asyncio.run(run_forever([server], on_ready=ready))
