"""Registry of environments by name and version.

Services look environments up by the `EnvironmentRef` they receive (name, optional
version, string parameters) and never import environment modules by path. The built-in
domains register themselves when `trace_common.domains` is imported; the registry does
that import lazily on the first lookup, so `make("store")` works from anywhere.

A factory is any callable returning an `Environment` (usually the class); its keyword
parameters are the environment's documented parameters. `make` checks the given
parameters against the factory's signature before calling it, so a typo is an
InvalidArgument naming the accepted parameters, not a TypeError from deep inside.
"""

from __future__ import annotations

import importlib
import inspect
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_common.env.environment import Environment
from trace_common.errors import AlreadyExists, InvalidArgument, NotFound

EnvFactory = Callable[..., Environment]

_NAME_RE = re.compile(r"^[a-z][a-z0-9_.\-]*$")
_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")

#: Modules imported on the first lookup so the built-in domains are registered.
BUILTIN_MODULES = ("trace_common.domains",)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@dataclass(frozen=True)
class EnvSpec:
    """One registered environment version."""

    name: str
    version: str
    factory: EnvFactory
    description: str = ""
    params: dict[str, str] = field(default_factory=dict)  # parameter name -> one-line doc

    def parameter_names(self) -> list[str]:
        sig = inspect.signature(self.factory)
        return [p.name for p in sig.parameters.values()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


class Registry:
    """Thread-safe map (name, version) -> EnvSpec."""

    def __init__(self, builtin_modules: tuple[str, ...] = ()):
        self._specs: dict[str, dict[str, EnvSpec]] = {}
        self._lock = threading.Lock()
        self._builtin_modules = builtin_modules
        self._builtins_loaded = not builtin_modules

    def register(self, name: str, version: str, factory: EnvFactory, *, description: str = "",
                 params: dict[str, str] | None = None, replace: bool = False) -> EnvSpec:
        """Add an environment version. Names are lowercase (`store`, `tau2-retail`), versions
        dotted integers (`1.0.0`). Re-registering the same (name, version) needs replace=True."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise InvalidArgument(field="name", expected="lowercase letters, digits, '_', '-', '.'",
                                  got=name, fix="Use a name like 'store' or 'tau2-retail'.")
        if not isinstance(version, str) or not _VERSION_RE.match(version):
            raise InvalidArgument(field="version", expected="dotted integers such as '1.0.0'", got=version)
        if not callable(factory):
            raise InvalidArgument(field="factory", expected="a callable returning an Environment", got=factory)
        spec = EnvSpec(name=name, version=version, factory=factory, description=description,
                       params=dict(params or {}))
        with self._lock:
            versions = self._specs.setdefault(name, {})
            if version in versions and not replace and versions[version].factory is not factory:
                raise AlreadyExists(f"environment {name}@{version} is already registered; "
                                    "bump the version or pass replace=True")
            versions[version] = spec
        return spec

    def _ensure_builtins(self) -> None:
        if self._builtins_loaded:
            return
        self._builtins_loaded = True
        for module in self._builtin_modules:
            importlib.import_module(module)

    def get(self, name: str, version: str | None = None) -> EnvSpec:
        """The spec of `name` at `version` (None or "" = the highest version)."""
        self._ensure_builtins()
        with self._lock:
            versions = self._specs.get(name)
            if not versions:
                known = ", ".join(sorted(self._specs)) or "none"
                raise NotFound(f"environment {name!r} is not registered (registered: {known})")
            if not version:
                return versions[max(versions, key=_version_key)]
            if version not in versions:
                known = ", ".join(sorted(versions, key=_version_key))
                raise NotFound(f"environment {name!r} has no version {version!r} (available: {known})")
            return versions[version]

    def make(self, name: str, version: str | None = None, **params: Any) -> Environment:
        """Instantiate a registered environment with its documented parameters."""
        spec = self.get(name, version)
        sig = inspect.signature(spec.factory)
        try:
            sig.bind(**params)
        except TypeError as exc:
            accepted = ", ".join(spec.parameter_names()) or "none"
            raise InvalidArgument(field=f"params of {spec.name}@{spec.version}",
                                  expected=f"only these parameters: {accepted}", got=sorted(params),
                                  fix="Remove or rename the unknown parameters.") from exc
        env = spec.factory(**params)
        if not isinstance(env, Environment):
            raise InvalidArgument(field=f"factory of {spec.name}@{spec.version}",
                                  expected="an Environment instance", got=type(env).__name__)
        return env

    def list(self) -> list[EnvSpec]:
        """All registered versions, sorted by name then version."""
        self._ensure_builtins()
        with self._lock:
            return [self._specs[n][v] for n in sorted(self._specs)
                    for v in sorted(self._specs[n], key=_version_key)]


#: The process-wide registry used by services.
default_registry = Registry(builtin_modules=BUILTIN_MODULES)


def register(name: str, version: str, factory: EnvFactory, *, description: str = "",
             params: dict[str, str] | None = None, replace: bool = False) -> EnvSpec:
    """Register in the default registry (see `Registry.register`)."""
    return default_registry.register(name, version, factory, description=description, params=params,
                                     replace=replace)


def make(name: str, version: str | None = None, **params: Any) -> Environment:
    """Instantiate from the default registry (see `Registry.make`)."""
    return default_registry.make(name, version, **params)


def get_spec(name: str, version: str | None = None) -> EnvSpec:
    return default_registry.get(name, version)


def list_environments() -> list[EnvSpec]:
    """All versions in the default registry (see `Registry.list`)."""
    return default_registry.list()
