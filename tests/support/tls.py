"""A throw-away TLS certificate for servers on loopback."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path


def self_signed(where: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files for 127.0.0.1, valid one day (the openssl CLI, which
    ca-certificates depends on)."""
    cert, key = where / "tls.crt", where / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=trace-test",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def trusting(cert: Path) -> ssl.SSLContext:
    """A client context that trusts exactly `cert`."""
    return ssl.create_default_context(cafile=str(cert))
