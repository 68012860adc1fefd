"""What every engine process is doing: the stacks of its whole process tree, read several times, named.

A futex wait looks the same whether a rank is idle in its request loop, blocked in a collective another rank
never joined, or loading weights; the stacks tell which. `read_stacks` dumps every process of an engine's tree
with py-spy (capture.py: why py-spy, why blocking dumps with a non-blocking fallback), a few samples apart, all
processes at once; names each thread and process from the engine's and the generic signatures (signatures.py,
classify.py); and sums the tree up in one verdict and one line (summarize.py), e.g.
"8 of 8 ranks loading weights (safetensors), stacks moving: loading, not hung".

Stacks are untrusted text: every name in the report is inert for terminals and file paths and command lines are
redacted like logs. Nothing about the target raises: what cannot be read is `StackReport.unavailable` (no stacks
at all) or `ProcessStacks.error` (one process), one line each, saying why and how to allow it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.lifecycle.stacks.capture import capture
from servelab.lifecycle.stacks.summarize import summarize
from servelab.records import StackReport
from servelab.textsafe import inert

if TYPE_CHECKING:
    from servelab.engines.base import EngineAdapter

__all__ = ["read_stacks", "stack_lines"]


def read_stacks(root_pid: int, adapter: EngineAdapter | None = None, *, samples: int = 3,
                interval_s: float = 1.5, deadline_s: float = 10.0, raw: bool = False) -> StackReport:
    """The stacks of `root_pid` and its children, `samples` times `interval_s` apart within `deadline_s`, named
    with `adapter`'s stack signatures (and the generic ones). `raw` keeps the last sample's dump as text."""
    signatures = tuple(getattr(adapter, "stack_signatures", ()) or ()) if adapter is not None else ()
    try:
        taken = capture(root_pid, samples=samples, interval_s=interval_s, deadline_s=deadline_s)
        return summarize(taken, signatures, interval_s=interval_s, raw=raw)
    except Exception as exc:  # a bug of ours must not turn a diagnosis into a traceback
        return StackReport(unavailable=f"stacks could not be read: {inert(type(exc).__name__)}: {inert(exc)}",
                           summary="stacks could not be read")


def stack_lines(report: StackReport) -> list[str]:
    """The summary line, then one line per process: for verdicts, logs and terminals."""
    if report.unavailable:
        return [f"stacks: {report.unavailable}"]
    return [report.summary, *(p.line for p in report.processes)]
