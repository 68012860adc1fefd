"""servelab: bring LLM inference servers up, verify them, benchmark them honestly."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("servelab")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

SCHEMA_VERSION = 1
