"""How `servelab doctor` prints its diagnosis: the verdict first, then the evidence it rests on."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from servelab.lifecycle.stacks import stack_lines
from servelab.records import Diagnosis, GpuReading
from servelab.report.tables import human_bytes
from servelab.textsafe import inert

_STYLE = {"starting": "dim", "loading": "cyan", "ready": "green", "stalled": "bold red", "crashed": "bold red",
          "not running": "bold red", "no such process": "bold red"}
# Evidence keys as a person reads them, in the order shown (docs: the JSON keeps the keys).
_SHOWN = {"models": "models listed", "phase": "phase", "progress": "progress", "eta_s": "ETA", "probe": "probe",
          "probe_status": "probe HTTP status", "quiet_s": "nothing moved for", "budget_s": "stall budget",
          "moving": "moving", "still_for_s": "still for", "threads": "threads", "thread_states": "thread states",
          "threads_in_futex": "threads in futex waits", "processes": "processes",
          "processes_exited": "processes exited", "cpu_s": "CPU time", "read_bytes": "read from storage",
          "read_chars": "read() in all", "rss_bytes": "RSS", "gpu_memory_bytes": "GPU memory",
          "gpu_util_percent": "GPU utilisation", "exit_code": "exit code", "exit_signal": "signal",
          "engine_says": "engine says", "hint": "hint", "last_line": "last log line", "window_s": "watched for",
          "assumed": "assumed"}
_LABEL_WIDTH = max(len(label) for label in _SHOWN.values())


def shown_value(key: str, value: Any) -> str:
    """One evidence value in words: bytes in MB/GB, seconds with their unit, dicts and lists as lists."""
    if (key.endswith("_bytes") or key == "read_chars") and isinstance(value, (int, float)):
        return human_bytes(value)
    if key == "progress" and isinstance(value, (int, float)):
        return f"{value * 100:.0f} %"
    if key == "gpu_util_percent" and isinstance(value, (int, float)):
        return f"{value:.0f} %"
    if key == "still_for_s" and isinstance(value, dict):
        return ", ".join(f"{k} {v:.1f} s" for k, v in value.items())
    if key.endswith("_s") and isinstance(value, (int, float)):
        return f"{value:.1f} s"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def render_diagnosis(console: Console, d: Diagnosis) -> None:
    who = ", ".join(x for x in (d.engine or "engine not recognised", f"pid {d.pid}" if d.pid else "",
                                d.url or "", d.log_path or "") if x)
    console.print(f"[bold]{who}[/bold]", highlight=False)
    style = _STYLE.get(d.verdict.state, "")
    if d.verdict.state == "ready" and d.verdict.evidence.get("stacks_verdict") == "deadlock":
        style = "bold yellow"  # it answers its probe, but its stacks look deadlocked: not the green of all's well
    console.print(f"[{style}]{d.verdict.state.upper()}[/{style}]  {d.verdict.reason}", highlight=False)
    for key, label in _SHOWN.items():
        value = d.verdict.evidence.get(key)
        if value not in (None, [], {}, ""):
            console.print(f"  {label:{_LABEL_WIDTH}} {shown_value(key, value)}", markup=False, highlight=False)
    for line in d.verdict.evidence.get("log_tail", [])[-5:]:
        console.print(f"  | {line}", markup=False, highlight=False)
    if d.phases and len(d.phases) > 1:
        console.print(f"  {'phases seen':{_LABEL_WIDTH}} " + " → ".join(p.name for p in d.phases), markup=False,
                      highlight=False)
    for finding in d.lint:
        colour = {"serious": "red", "warn": "yellow"}.get(finding.severity, "dim")
        console.print(f"  [{colour}]lint {finding.severity}[/{colour}] {finding.setting}: {finding.why}",
                      highlight=False)
    for note in d.notes:
        console.print(f"  note: {note}", markup=False, highlight=False)
    render_gpus(console, d)
    if d.stack_report is not None:
        lines = stack_lines(d.stack_report)
        console.print(f"  {'stacks':{_LABEL_WIDTH}} {inert(lines[0])}", markup=False, highlight=False)
        for line in lines[1:]:
            console.print(f"    {inert(line)}", markup=False, highlight=False)
    if d.stacks:
        console.print(inert(d.stacks, multiline=True), markup=False, highlight=False)


def gpu_line(r: GpuReading) -> str:
    """One GPU in a line of at most ~70 characters: memory used, SM activity, power, temperature (what the
    source gave)."""
    who = f"GPU {r.gpu}" + (f" {inert(r.name)}" if r.name else "")
    facts = []
    if r.mem_used_bytes is not None:
        facts.append(human_bytes(r.mem_used_bytes) + (f" of {human_bytes(r.mem_total_bytes)}"
                                                      if r.mem_total_bytes else ""))
    if r.sm_active_pct is not None:
        facts.append(f"SM {r.sm_active_pct:.0f} %")
    if r.power_w is not None:
        facts.append(f"{r.power_w:.0f} W")
    if r.temp_c is not None:
        facts.append(f"{r.temp_c:.0f} °C")
    return who + (": " + ", ".join(facts) if facts else "")


def render_gpus(console: Console, d: Diagnosis) -> None:
    """Each GPU in one line under a heading (80 columns), those the server holds marked; or one line saying why
    there are none."""
    if not d.gpus:
        if d.gpus_note:
            console.print(f"  {'GPUs':{_LABEL_WIDTH}} {d.gpus_note}", markup=False, highlight=False)
        return
    marked = bool(d.engine_gpus)
    console.print("  GPUs" + (" (* held by the server's processes)" if marked else ""), markup=False,
                  highlight=False)
    for r in d.gpus:
        mark = "* " if r.gpu in d.engine_gpus else "  " if marked else ""
        console.print(f"    {mark}{gpu_line(r)}", markup=False, highlight=False)
