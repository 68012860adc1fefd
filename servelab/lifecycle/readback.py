"""After start-up: ask the running engine what it was started with, and lint that together with its command line
and the log lines it wrote (SGLang's decode lines say `cuda graph: False`; vLLM's engine config says
`enforce_eager=True`). Used by `up` before any benchmark and by `doctor`."""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path
from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec
from servelab.engines.lint import merge
from servelab.lifecycle.probe import PROBE_TIMEOUT_S, http_get
from servelab.lifecycle.supervisor import split_lines
from servelab.records import LintFinding

LOG_LINT_MAX_BYTES = 16 * 2**20  # the engine-config lines come early; decode lines come late: read both ends


def read_runtime_config(url: str, adapter: EngineAdapter, timeout_s: float = PROBE_TIMEOUT_S
                        ) -> dict[str, Any] | None:
    """JSON object from the first of the adapter's config paths that answers one; None if none does."""
    for path in adapter.config_paths:
        try:
            status, body = http_get(url, path, timeout_s)
            parsed = json.loads(body) if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            continue
        if isinstance(parsed, dict):
            return parsed
    return None


def log_lines_for_lint(path: Path, offset: int = 0) -> list[str]:
    """The log from `offset`, or its first and last 8 MB when it is longer than LOG_LINT_MAX_BYTES."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = offset if offset <= size else 0
            if size - start <= LOG_LINT_MAX_BYTES:
                fh.seek(start)
                return split_lines(fh.read())
            half = LOG_LINT_MAX_BYTES // 2
            fh.seek(start)
            head = fh.read(half)
            fh.seek(size - half)
            return split_lines(head) + split_lines(fh.read())
    except OSError:
        return []


def lint_all(adapter: EngineAdapter, spec: EngineSpec, command: list[str], config: dict[str, Any] | None,
             log_lines: list[str]) -> list[LintFinding]:
    """Command line + runtime config + log lines, one finding per setting."""
    found = list(adapter.lint(spec, command, config))
    for line in log_lines:
        finding = adapter.lint_log_line(line)
        if finding is not None:
            found.append(finding)
    return merge(found)
