"""What the peer formats (compare/peers/*.py) share: the types a format declares itself and its figures with, and
the helpers that read a file's fields, each failing with a PeerFileError that names the file and the field.

It imports no format and no reader, so the formats and the registry in compare/peers/__init__.py import it
without importing each other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servelab.compare.run_data import RunData
from servelab.errors import UserError

# A peer's file is read whole: anything larger than this is not a result file (a vLLM detailed result of 10,000
# requests with texts is ~20 MB).
MAX_BYTES = 512 * 1024 * 1024


class Definition(BaseModel):
    """How one of a peer's figures relates to one of servelab's key figures."""

    key: str  # servelab's key figure (compare/metrics.py KEY_METRICS)
    theirs: str  # the peer's field it was read from, e.g. "median_ttft_ms"
    matches: bool  # the same definition as ours (docs/metrics.md): comparable, so a verdict is given
    why: str  # what their source says it measures, and where that differs from ours


class PeerInfo(BaseModel):
    """Where a run from another tool came from, and what its figures mean."""

    tool: str  # "vllm bench serve", "aiperf", "guidellm"
    version: str | None = None
    path: str
    per_request: bool  # the file held per-request data: intervals come from it
    timeline: bool = False  # its requests carry start times on one clock: a throughput interval can be drawn
    concurrency: int | None = None  # the load it ran at (None: a request rate or unknown)
    definitions: list[Definition] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    def definition(self, key: str) -> Definition | None:
        return next((d for d in self.definitions if d.key == key), None)


class PeerFileError(UserError):
    """A file that looked like a peer's result but is not a valid one: names the file and what is wrong."""


@dataclass
class PeerFormat:
    name: str  # how errors name it, e.g. "a vLLM bench serve result"
    detect: Callable[[Path, Any], bool]
    load: Callable[[Path, Any], RunData]
    # Files whose name alone says what they are (read as JSON Lines, not JSON), e.g. AIPerf's per-record export.
    suffixes: Sequence[str] = field(default_factory=tuple)


def read_json(path: Path) -> Any:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    if size > MAX_BYTES:
        raise UserError(f"{path}: {size / 1e6:.0f} MB is too large for a benchmark result file "
                        f"(at most {MAX_BYTES // 2**20} MiB is read)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a text file ({exc})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})",
                        hint="compare, show and report take a run directory, a run id, or the JSON result of "
                             "vllm bench serve (--save-result), AIPerf (profile_export_aiperf.json) or GuideLLM "
                             "(benchmarks.json)") from None


# ----------------------------------------------------------------------------------------------------------------
# Helpers shared by the formats
# ----------------------------------------------------------------------------------------------------------------

def need(doc: dict, key: str, kind: type | tuple[type, ...], path: Path, what: str) -> Any:
    """doc[key], which must be of `kind`: else a PeerFileError naming the file, the field and what it should be."""
    if not isinstance(doc, dict) or key not in doc:
        raise PeerFileError(f"{path}: {what} has no '{key}'")
    value = doc[key]
    if kind in (int, float, (int, float)) and isinstance(value, bool):
        value = None  # true/false is not a number
    if not isinstance(value, kind) or (isinstance(value, float) and not math.isfinite(value)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise PeerFileError(f"{path}: {what}: '{key}' should be {_article(names)}, not {_describe(doc[key])}")
    return value


def number(doc: dict, key: str, path: Path, what: str, optional: bool = False) -> float | None:
    if optional and (not isinstance(doc, dict) or doc.get(key) is None):
        return None
    value = need(doc, key, (int, float), path, what)
    if value < 0:
        raise PeerFileError(f"{path}: {what}: '{key}' is negative ({value})")
    return float(value)


def numbers(values: Any, path: Path, what: str) -> list[float]:
    if not isinstance(values, list):
        raise PeerFileError(f"{path}: {what} should be a list of numbers, not {_describe(values)}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise PeerFileError(f"{path}: {what}[{i}] should be a non-negative number, not {_describe(v)}")
        out.append(float(v))
    return out


def _article(names: str) -> str:
    word = {"str": "string", "int": "integer", "float": "number", "dict": "object", "list": "list",
            "int or float": "number"}.get(names, names)
    return ("an " if word[0] in "aeiou" else "a ") + word


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return {dict: "an object", list: "a list"}[type(value)]
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "…"
