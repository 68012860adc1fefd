"""How `servelab doctor` prints its diagnosis: the verdict first, then the evidence it rests on."""

from __future__ import annotations

from rich.console import Console

from servelab.records import Diagnosis

_STYLE = {"starting": "dim", "loading": "cyan", "ready": "green", "stalled": "bold red", "crashed": "bold red"}
_SHOWN = ("phase", "progress", "eta_s", "probe", "probe_status", "quiet_s", "budget_s", "moving", "still_for_s",
          "threads", "thread_states", "threads_in_futex", "processes", "processes_exited", "cpu_s", "read_bytes",
          "read_chars", "rss_bytes", "gpu_memory_bytes", "gpu_util_percent", "exit_code", "exit_signal",
          "engine_says", "hint", "last_line", "window_s", "assumed")


def render_diagnosis(console: Console, d: Diagnosis) -> None:
    who = ", ".join(x for x in (d.engine or "engine not recognised", f"pid {d.pid}" if d.pid else "",
                                d.url or "", d.log_path or "") if x)
    console.print(f"[bold]{who}[/bold]", highlight=False)
    style = _STYLE.get(d.verdict.state, "")
    console.print(f"[{style}]{d.verdict.state.upper()}[/{style}]  {d.verdict.reason}", highlight=False)
    for key in _SHOWN:
        value = d.verdict.evidence.get(key)
        if value not in (None, [], {}, ""):
            console.print(f"  {key:18} {value}", markup=False, highlight=False)
    for line in d.verdict.evidence.get("log_tail", [])[-5:]:
        console.print(f"  | {line}", markup=False, highlight=False)
    if d.phases and len(d.phases) > 1:
        console.print("  phases seen        " + " → ".join(p.name for p in d.phases), markup=False,
                      highlight=False)
    for finding in d.lint:
        colour = {"serious": "red", "warn": "yellow"}.get(finding.severity, "dim")
        console.print(f"  [{colour}]lint {finding.severity}[/{colour}] {finding.setting}: {finding.why}",
                      highlight=False)
    for note in d.notes:
        console.print(f"  note: {note}", markup=False, highlight=False)
    if d.stacks:
        console.print(d.stacks, markup=False, highlight=False)
