"""The start-up view of `servelab up`: what the engine is doing right now, and whether it is moving.

On a terminal a rich Live panel redraws in place; elsewhere (CI logs, pipes) one plain line per phase or verdict
change, because redraws would fill a log file with control sequences.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from servelab.engines import get_engine
from servelab.engines.base import EngineSpec
from servelab.lifecycle.diagnose import eta_s as _eta
from servelab.lifecycle.launch import LaunchStatus, RunningEngine, start_engine

_PROBE_STYLE = {"ready": "green", "loading": "yellow", "down": "dim", "unknown": "red"}
_VERDICT_STYLE = {"starting": "dim", "loading": "cyan", "ready": "green", "stalled": "bold red", "crashed": "bold red"}


def eta_s(status: LaunchStatus) -> float | None:
    """Time left in the current phase if progress keeps its pace so far; None when it cannot be estimated."""
    return _eta(status.progress, status.phase_elapsed_s)


def describe_progress(status: LaunchStatus) -> str:
    if status.progress is None:
        return ""
    text = f"{status.progress * 100:.0f}%"
    eta = eta_s(status)
    return f"{text}  ETA {eta:.0f} s" if eta is not None else text


def render_status(title: str, status: LaunchStatus, width: int) -> Group:
    head = Text.assemble((title, "bold"), f"  pid {status.pid}")
    phase = Text.assemble(("phase ", "dim"), (status.phase, "bold cyan"), f"  {status.elapsed_s:5.1f} s")
    progress = describe_progress(status)
    if progress:
        phase.append(f"  {progress}", style="magenta")
    phase.append("  probe ", style="dim")
    phase.append(status.probe, style=_PROBE_STYLE.get(status.probe, ""))
    parts = [head, phase]
    if status.verdict is not None:
        verdict = status.verdict
        parts.append(Text.assemble((f"{verdict.state:8}", _VERDICT_STYLE.get(verdict.state, "")),
                                   (_fit(verdict.reason, width - 10), "dim")))
    parts.append(Text.assemble(("> ", "dim"), Text(_fit(status.last_line or "", width - 2), style="dim")))
    return Group(*parts)


def plain_line(status: LaunchStatus) -> str:
    progress = describe_progress(status)
    line = f"[{status.elapsed_s:6.1f}s] {status.phase}" + (f" ({progress})" if progress else "")
    if status.verdict is not None and status.verdict.state in ("stalled", "crashed"):
        line += f"  {status.verdict.state.upper()}: {status.verdict.reason}"
    return line


def _fit(line: str, width: int) -> str:
    width = max(width, 10)
    return line if len(line) <= width else line[: width - 1] + "…"


def live_launch(spec: EngineSpec, log_dir: Path, console: Console, ready_timeout_s: float = 600.0,
                stall_action: str = "stop") -> RunningEngine:
    """`start_engine` with a view of its progress on `console`."""
    title = get_engine(spec.engine).title
    if not console.is_terminal:
        return _plain_launch(spec, log_dir, console, title, ready_timeout_s, stall_action)
    with Live(Text(f"{title}: starting"), console=console, refresh_per_second=8, transient=True) as live:
        def on_update(status: LaunchStatus) -> None:
            live.update(render_status(title, status, console.width))

        engine = start_engine(spec, log_dir, on_update=on_update, ready_timeout_s=ready_timeout_s,
                              stall_action=stall_action)
    console.print(f"[bold]{title}[/bold] ready in {engine.ready_s:.1f} s at {engine.url}", highlight=False)
    return engine


def _plain_launch(spec: EngineSpec, log_dir: Path, console: Console, title: str, ready_timeout_s: float,
                  stall_action: str) -> RunningEngine:
    console.print(f"{title}: starting", markup=False, highlight=False)
    # Phases are reported as each update finds them: one that began and ended within a poll (~50 ms) is skipped.
    # A stall is reported when it is declared (with --stall-action wait the engine keeps its chance).
    last: list[tuple[str, str | None]] = [("starting", None)]

    def on_update(status: LaunchStatus) -> None:
        state = status.verdict.state if status.verdict and status.verdict.state in ("stalled",) else None
        if last[-1] != (status.phase, state):
            last.append((status.phase, state))
            console.print(plain_line(status), markup=False, highlight=False)

    engine = start_engine(spec, log_dir, on_update=on_update, ready_timeout_s=ready_timeout_s,
                          stall_action=stall_action)
    console.print(f"{title} ready in {engine.ready_s:.1f} s at {engine.url}", markup=False, highlight=False)
    return engine
