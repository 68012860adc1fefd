"""The start-up view of `servelab up`: what the engine is doing right now, and whether it is moving.

On a terminal a rich Live panel redraws in place; elsewhere (CI logs, pipes, `> file`) plain lines, because
redraws would fill a log file with control sequences: one per phase or verdict change, and a heartbeat with the
evidence (phase, progress, what moved, the probe) at least every HEARTBEAT_S seconds, so a long phase is never
silent (the story's "the log seems to end early" must not happen in servelab's own output).

The view only draws: `lifecycle.launch.start_engine(spec, log_dir, view=launch_view(console))` starts the engine
and tells the view what happens.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from servelab.lifecycle.diagnose import RECENT_S, eta_words
from servelab.lifecycle.diagnose import eta_s as _eta
from servelab.lifecycle.launch import LaunchStatus, LaunchView, RunningEngine
from servelab.textsafe import inert, inert_markup

_PROBE_STYLE = {"ready": "green", "loading": "yellow", "down": "dim", "unknown": "red"}
_VERDICT_STYLE = {"starting": "dim", "loading": "cyan", "ready": "green", "stalled": "bold red", "crashed": "bold red"}
HEARTBEAT_S = 10.0
# Set on the far side of `--on ssh://…` (remote/worker.py): every start-up view there writes events instead, for
# the controller to draw (remote/events_view.py). A hook here, so this layer never imports the remote one.
event_view: LaunchView | None = None  # a pipe gets a status line at least this often
SEP = " · "


def eta_s(status: LaunchStatus) -> float | None:
    """Time left in the current phase if progress keeps its pace so far; None when it cannot be estimated, or
    when nothing has moved for a while (the pace so far no longer says anything)."""
    if _quiet_s(status) >= RECENT_S:
        return None
    return _eta(status.progress, status.phase_elapsed_s)


def _quiet_s(status: LaunchStatus) -> float:
    if status.verdict is None:
        return 0.0
    return float(status.verdict.evidence.get("quiet_s") or 0.0)


def describe_progress(status: LaunchStatus, why_unknown: bool = True) -> str:
    """"25%, ETA 60 s"; "40%, ETA unknown: nothing moved for 12 s" (without the reason when `why_unknown` is
    false: the line says it elsewhere); "" without a progress counter."""
    if status.progress is None:
        return ""
    text = f"{status.progress * 100:.0f}%"
    if status.progress >= 1.0:
        return text
    eta = eta_s(status)
    if eta is not None:
        return f"{text}, ETA {eta:.0f} s"
    stalled = status.verdict is not None and status.verdict.state == "stalled"
    if not why_unknown:
        return f"{text}, ETA unknown"
    return f"{text}, " + eta_words({"eta_s": None, "quiet_s": _quiet_s(status)}, stalled=stalled)


def movement(status: LaunchStatus) -> str:
    """What moved recently, or for how long nothing has: the evidence behind "loading" in a few words."""
    verdict = status.verdict
    if verdict is None:
        return ""
    if verdict.state in ("stalled", "crashed", "ready"):
        return verdict.reason
    moving = verdict.evidence.get("moving") or []
    if moving:
        return "moving: " + ", ".join(moving)
    quiet, budget = verdict.evidence.get("quiet_s"), verdict.evidence.get("budget_s")
    if quiet is None:
        return verdict.reason
    if quiet < 1.0:
        return ""  # the first sample: nothing to compare with yet
    return f"nothing moved for {quiet:.0f} s" + (f" (stall budget {budget:.0f} s)" if budget is not None else "")


def render_status(title: str, status: LaunchStatus, width: int) -> Group:
    head = Text.assemble((title, "bold"), f"{SEP}pid {status.pid}{SEP}{status.elapsed_s:.1f} s")
    phase = Text.assemble(("phase ", "dim"), (status.phase, "bold cyan"), f"{SEP}{status.phase_elapsed_s:.0f} s in it")
    progress = describe_progress(status)
    if progress:
        phase.append(f"{SEP}{progress}", style="magenta")
    phase.append(f"{SEP}probe ", style="dim")
    phase.append(status.probe, style=_PROBE_STYLE.get(status.probe, ""))
    parts = [head, phase]
    if status.verdict is not None:
        state = status.verdict.state
        parts.append(Text.assemble((state, _VERDICT_STYLE.get(state, "")),
                                   (_fit(SEP + movement(status), width - len(state)), "dim")))
    parts.append(Text.assemble(("> ", "dim"), Text(_fit(inert(status.last_line or ""), width - 2), style="dim")))
    return Group(*parts)


def plain_line(status: LaunchStatus) -> str:
    """One line for a log file: time, phase, progress, what moved, the probe; a stall or crash says so."""
    verdict = status.verdict
    moved = movement(status) if verdict is not None and verdict.state not in ("stalled", "crashed", "ready") else ""
    progress = describe_progress(status, why_unknown=not moved.startswith("nothing moved"))
    line = f"[{status.elapsed_s:6.1f}s] {status.phase}" + (f" ({progress})" if progress else "")
    if verdict is not None and verdict.state in ("stalled", "crashed"):
        return line + f"{SEP}{verdict.state.upper()}: {verdict.reason}"
    if moved:
        line += SEP + moved
    if status.phase != "ready":
        line += f"{SEP}probe {status.probe}"
    return line


def _fit(line: str, width: int) -> str:
    width = max(width, 10)
    return line if len(line) <= width else line[: width - 1] + "…"


def launch_view(console: Console, heartbeat_s: float = HEARTBEAT_S) -> LaunchView:
    """The start-up view for `console`, to hand to `lifecycle.launch.start_engine(view=...)`: a live panel on a
    terminal, plain lines elsewhere; on the far side of `--on ssh://…`, events for the controller to draw
    (remote/events_view.py)."""
    if event_view is not None:
        return event_view
    return TerminalLaunchView(console) if console.is_terminal else PlainLaunchView(console, heartbeat_s)


class TerminalLaunchView:
    """A rich Live panel redrawn in place while the engine starts (cleared when it ends), then the URL."""

    def __init__(self, console: Console):
        self.console = console
        self.title = ""
        self._live: Live | None = None

    def starting(self, title: str) -> None:
        self.title = title
        self._live = Live(Text(f"{title}: starting"), console=self.console, refresh_per_second=8, transient=True)
        self._live.start()

    def update(self, status: LaunchStatus) -> None:
        if self._live is not None:
            self._live.update(render_status(self.title, status, self.console.width))

    def ended(self, engine: RunningEngine | None) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if engine is not None:
            self.console.print(f"[bold]{inert_markup(self.title)}[/bold] ready in {engine.ready_s:.1f} s at "
                               f"{inert_markup(engine.url)}", highlight=False)


class PlainLaunchView:
    """Lines for a log file or a pipe: a line when the phase or the verdict changes (a phase that began and ended
    within a poll, ~50 ms, is skipped), and a heartbeat with the evidence when nothing changed for `heartbeat_s`.
    A stall is reported when it is declared (with --stall-action wait the engine keeps its chance)."""

    def __init__(self, console: Console, heartbeat_s: float = HEARTBEAT_S):
        self.console, self.heartbeat_s = console, heartbeat_s
        self.title = ""
        self._last_key: tuple[str, str | None] = ("starting", None)
        self._last_at = 0.0

    def starting(self, title: str) -> None:
        self.title = title
        self.console.print(f"{title}: starting", markup=False, highlight=False)

    def update(self, status: LaunchStatus) -> None:
        state = status.verdict.state if status.verdict and status.verdict.state in ("stalled",) else None
        key = (status.phase, state)
        if key != self._last_key or status.elapsed_s - self._last_at >= self.heartbeat_s:
            self._last_key, self._last_at = key, status.elapsed_s
            self.console.print(plain_line(status), markup=False, highlight=False, soft_wrap=True)

    def ended(self, engine: RunningEngine | None) -> None:
        if engine is not None:
            self.console.print(f"{self.title} ready in {engine.ready_s:.1f} s at {engine.url}", markup=False,
                               highlight=False)
