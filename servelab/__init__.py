"""servelab: bring LLM inference servers up, verify them, benchmark them honestly.

From Python (docs/api.md): `servelab.bench(url, ...)` and `servelab.run(experiment, ...)`, in servelab/api.py.
"""

import os as _os
import types as _types
from importlib import import_module as _import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("servelab")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

SCHEMA_VERSION = 1

if _os.environ.get("SERVELAB_LOOPBACK_ONLY", "") not in ("", "0"):  # the test suite: traffic stays on loopback
    from servelab import netguard as _netguard  # (servelab/netguard.py)

    _netguard.install()

# The Python API is looked up by name on first use, so `import servelab` (and every command's start) stays as
# light as it was: servelab.api pulls in the bench, the launcher and pydantic. The names are resolved with
# import_module, not an import statement, because this module is the bottom layer (the version, the schema)
# that every other module imports; the API sits above all of them.
_API = ("run", "BenchArgs", "BenchRun", "Experiment", "ExperimentResult", "UserError", "EngineFailed")


def __getattr__(name: str):
    if name in _API:
        return getattr(_import_module("servelab.api"), name)
    raise AttributeError(f"module 'servelab' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, "bench"])


class _BenchPackage(_types.ModuleType):
    """`servelab.bench` is the bench package (servelab/bench/) and also, called, the API's bench: the package
    is an attribute of servelab as soon as any of its modules is imported, so a function of that name could not
    stand beside it."""

    def __call__(self, *args, **kwargs):
        """servelab.bench(url, config=None, /, *, out=None, ..., **options): see servelab.api.bench."""
        return _import_module("servelab.api").bench(*args, **kwargs)


# A namespace package (no __init__ of its own), so importing it runs nothing.
_import_module("servelab.bench").__class__ = _BenchPackage
