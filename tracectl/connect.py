"""How tracectl reaches the services: given addresses (a cluster) or an embedded stack.

`--target SERVICE=HOST:PORT` (repeatable) or `TRACE_<SERVICE>_TARGET` selects a deployed
service; a service with no address is served by an embedded stack started in this process
(artifacts under `--root`, default ./.trace). Every stub call carries the client deadlines
of `trace_common.grpc.client`. A deployed service is sent TRACE_<SERVICE>_AUTH_TOKEN when that is
set (the variable the service itself reads), else `--token` / $TRACE_AUTH_TOKEN.
"""

from __future__ import annotations

import argparse
import os
import threading
from contextlib import ExitStack
from pathlib import Path

from trace_common.config import SERVICE_NAMES, service_token
from trace_common.errors import InvalidArgument
from trace_common.grpc.client import Endpoint, open_channel, stub
from trace_common.suggest import closest
from tracectl.embedded import BackgroundStack


def add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", default=[], metavar="SERVICE=HOST:PORT",
                   help="use a deployed service (repeatable); others run embedded in this process")
    p.add_argument("--token", default=os.environ.get("TRACE_AUTH_TOKEN"), help="bearer token ($TRACE_AUTH_TOKEN)")
    p.add_argument("--root", type=Path, default=Path(".trace"), help="embedded artifact store dir (./.trace)")


def parse_targets(items: list[str]) -> dict[str, str]:
    targets = {s: os.environ[f"TRACE_{s.upper()}_TARGET"] for s in SERVICE_NAMES
               if os.environ.get(f"TRACE_{s.upper()}_TARGET")}
    for item in items:
        name, sep, addr = item.partition("=")
        if not sep or name not in SERVICE_NAMES or not addr:
            near = closest(name, SERVICE_NAMES) if sep and addr else None
            raise InvalidArgument(field="--target", expected=f"SERVICE=HOST:PORT, SERVICE one of {', '.join(SERVICE_NAMES)}",
                                  got=item, fix=f"Did you mean {near}={addr}?" if near else
                                  "e.g. --target trainer=localhost:50054")
        targets[name] = addr
    return targets


class Connection:
    """Stubs for the services, remote where addressed, embedded otherwise."""

    def __init__(self, args: argparse.Namespace):
        self._targets = parse_targets(args.target)
        self._token = args.token
        self._root = args.root
        #: How the user named `root` (a flag, or `store.root` of a run config), for messages about it.
        self._root_flag = getattr(args, "root_flag", "--root")
        self._root_fix = getattr(args, "root_fix", "")
        #: Settings for every embedded service (e.g. an s3:// artifact root and its S3 settings).
        self._overrides = dict(getattr(args, "overrides", None) or {})
        self._exit = ExitStack()
        self.embedded: BackgroundStack | None = None
        # `tracectl run` asks for stubs from several threads (parallel adapter jobs); when the run
        # resumes at such a stage, they race to start the embedded stack. One lock, one stack.
        self._lock = threading.Lock()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self._exit.close()

    def deployed(self, service: str) -> bool:
        """Whether `service` is reached at a given address (else it runs embedded in this process)."""
        return service in self._targets

    def stub(self, service: str):
        """A stub for `service`; safe to call from several threads at once."""
        with self._lock:
            if service in self._targets:
                token = service_token(service, self._token)  # TRACE_<SERVICE>_AUTH_TOKEN, else --token
                ch = self._exit.enter_context(open_channel(Endpoint(self._targets[service], token)))
                return stub(service, ch)
            if self.embedded is None:
                self.embedded = BackgroundStack(self._root, overrides=self._overrides, root_flag=self._root_flag,
                                                root_fix=self._root_fix)
                self._exit.callback(self.embedded.close)
            embedded = self.embedded
        return embedded.stub(service)
