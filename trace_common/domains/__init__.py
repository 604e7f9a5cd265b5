"""Built-in target domains. Importing this package registers each of them in the
environment registry (`trace_common.env.registry` imports it lazily on first lookup).

A domain module registers itself at import time with `trace_common.env.register(...)`.
Domains listed here but not present in this checkout are skipped; an import error inside
a present domain propagates (a broken domain must not disappear silently).
"""

import importlib
import importlib.util

#: Sub-packages imported (and so registered) when this package is imported.
DOMAIN_MODULES = ("trace_common.domains.store", "trace_common.domains.tau2")

for _module in DOMAIN_MODULES:
    if importlib.util.find_spec(_module) is not None:
        importlib.import_module(_module)
