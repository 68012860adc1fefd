"""servelab: bring LLM inference servers up, verify them, benchmark them honestly."""

import os as _os
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("servelab")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

SCHEMA_VERSION = 1

if _os.environ.get("SERVELAB_LOOPBACK_ONLY", "") not in ("", "0"):  # the test suite: traffic stays on loopback
    from servelab import netguard as _netguard  # (servelab/netguard.py)

    _netguard.install()
