"""From evidence samples to a verdict: starting, loading, ready, stalled or crashed.

The rule (shared/research/engines.md §7): follow the phase from the log, and in each phase accept *any* of these
as progress: a new log line (heartbeats excluded), a tqdm counter change, read counters, CPU time, RSS or GPU
memory growing, a new process in the tree. Declare a stall only when none of them has moved for the phase's
budget. Idle threads are never evidence of a hang: a loader's reader pool parks 100+ threads in futex waits at
0 % GPU while the read counters climb, and a ready server's threads all sleep waiting for requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.engines.base import EngineAdapter
from servelab.lifecycle.supervisor import signal_name
from servelab.records import EvidenceSample, Verdict

# How much a counter must grow to count as movement. Our own readiness probes make an engine that serves HTTP
# while loading (llama-server, SGLang in warm-up) spend a little CPU and receive a few bytes: that must not hide a
# hang, so CPU counts as a *rate* and the byte counters need more than a probe's worth.
CPU_RATE_MOVING = 0.05  # cores (5 % of one CPU) between two samples
READ_BYTES_MOVING = 64 * 1024
MEMORY_BYTES_MOVING = 16 * 2**20
RECENT_S = 3.0  # a signal that moved this recently is "moving" in a report

OOM_HINT = ("SIGKILL during start-up is most often the OS OOM killer: check `dmesg` or `journalctl -k` for "
            "'Out of memory', and try a smaller model, context or --parallel")

SIGNAL_WORDS = {
    "log": "log lines",
    "progress": "tqdm counter",
    "reads": "read bytes",
    "cpu": "CPU time",
    "memory": "RSS",
    "gpu_memory": "GPU memory",
    "processes": "process count",
}


def eta_s(progress: float | None, phase_elapsed_s: float) -> float | None:
    """Time left in a phase if its progress keeps the pace it had so far; None when it cannot be estimated."""
    if progress is None or progress <= 0.0 or progress >= 1.0:
        return None
    return phase_elapsed_s * (1.0 - progress) / progress


@dataclass
class StartupJudge:
    """Remembers when each kind of evidence last moved, and judges start-up against per-phase budgets."""

    adapter: EngineAdapter
    model_bytes: int | None = None
    stall_budget_s: float | None = None  # one budget for every phase, overriding the adapter's
    t0_s: float = 0.0  # when watching began: every signal counts as having moved then
    last_moved: dict[str, float] = field(default_factory=dict)
    _prev: EvidenceSample | None = None
    _refs: dict[str, float] = field(default_factory=dict)  # counter values at their last counted movement

    def __post_init__(self) -> None:
        self.last_moved = {name: self.t0_s for name in SIGNAL_WORDS}

    # ---- feeding ----
    def observe(self, s: EvidenceSample) -> list[str]:
        """Take one sample; returns the signals that moved since the previous one."""
        moved: list[str] = []
        prev = self._prev
        if prev is not None:
            if s.log_lines > prev.log_lines or s.phase != prev.phase:
                moved.append("log")
            if s.progress is not None and s.progress != prev.progress:
                moved.append("progress")
            dt = s.t_s - prev.t_s
            if s.cpu_s is not None and prev.cpu_s is not None and dt > 0 and \
                    (s.cpu_s - prev.cpu_s) / dt >= CPU_RATE_MOVING:
                moved.append("cpu")
            if s.processes is not None and prev.processes is not None and s.processes > prev.processes:
                moved.append("processes")
        else:
            for key, value in (("reads", _reads(s)), ("memory", s.rss_bytes), ("gpu_memory", s.gpu_memory_bytes)):
                if value is not None:
                    self._refs[key] = value
        for key, value, threshold in (("reads", _reads(s), READ_BYTES_MOVING),
                                      ("memory", s.rss_bytes, MEMORY_BYTES_MOVING),
                                      ("gpu_memory", s.gpu_memory_bytes, MEMORY_BYTES_MOVING)):
            if value is None:
                continue
            ref = self._refs.setdefault(key, value)
            if value - ref >= threshold:
                moved.append(key)
                self._refs[key] = value
            elif value < ref:
                self._refs[key] = value  # a child exited and took its counters along: measure from here
        for name in moved:
            self.last_moved[name] = s.t_s
        self._prev = s
        return moved

    # ---- judging ----
    def quiet_s(self, now_s: float) -> float:
        return now_s - max(self.last_moved.values())

    def budget_s(self, phase: str, after_ready_line: bool) -> float:
        if self.stall_budget_s is not None:
            return self.stall_budget_s
        if after_ready_line:
            return self.adapter.after_ready_line_budget_s()
        return self.adapter.phase_budget_s(phase, self.model_bytes)

    def moving(self, now_s: float, window_s: float = RECENT_S) -> list[str]:
        return [name for name, t in self.last_moved.items() if now_s - t <= window_s and t > self.t0_s]

    def verdict(self, now_s: float, *, phase: str, phase_start_s: float, progress: float | None,
                probe: str | None, ready_line_s: float | None, last_line: str | None = None) -> Verdict:
        """The verdict for a process that is alive and not (yet) ready."""
        sample = self._prev
        after_ready_line = ready_line_s is not None
        budget = self.budget_s(phase, after_ready_line)
        quiet = self.quiet_s(now_s)
        # An ETA from the pace so far means nothing once nothing moves: it would only grow. Unknown, then.
        eta = eta_s(progress, now_s - phase_start_s) if quiet < RECENT_S else None
        evidence: dict[str, Any] = {
            "phase": phase, "phase_elapsed_s": round(now_s - phase_start_s, 1), "progress": progress,
            "eta_s": _round(eta), "probe": probe,
            "quiet_s": round(quiet, 1), "budget_s": round(budget, 1),
            # "Recently" is shorter than the budget, so a stalled verdict never names a signal as moving.
            "moving": [SIGNAL_WORDS[m] for m in self.moving(now_s, min(RECENT_S, budget / 2))],
            "still_for_s": {SIGNAL_WORDS[k]: round(now_s - t, 1) for k, t in self.last_moved.items()
                            if _readable(k, sample)},
            **_sample_facts(sample),
        }
        if ready_line_s is not None:
            evidence["ready_line_s"] = round(ready_line_s, 2)
        if quiet >= budget:
            where = (f"after the ready line (at {ready_line_s:.1f} s) the probe still says {probe or 'down'}"
                     if after_ready_line else f"in phase '{phase}'")
            return Verdict(state="stalled",
                           reason=f"nothing moved for {quiet:.0f} s {where} (budget {budget:.0f} s): "
                                  + _still_words(self.last_moved, now_s, sample),
                           evidence=evidence)
        if phase == "starting" and sample is not None and sample.log_lines == 0:
            return Verdict(state="starting", reason="process started; no recognised log line yet",
                           evidence=evidence)
        return Verdict(state="loading", reason=_loading_words(phase, progress, evidence, sample),
                       evidence=evidence)


def eta_words(evidence: dict[str, Any], stalled: bool = False) -> str:
    """"ETA 40 s", or why there is none: "ETA unknown: nothing moved for 12 s" ("stalled for" once declared)."""
    if evidence.get("eta_s") is not None:
        return f"ETA {evidence['eta_s']:.0f} s"
    quiet = evidence.get("quiet_s")
    if quiet is not None and quiet >= RECENT_S:
        return f"ETA unknown: {'stalled' if stalled else 'nothing moved'} for {quiet:.0f} s"
    return "ETA unknown"


def crashed_verdict(returncode: int | None, phase: str, log_tail: list[str], failure_line: str | None = None,
                    when: str = "during start-up") -> Verdict:
    """A process that exited before it was ready (or after, with `when`)."""
    sig = signal_name(returncode)
    how = f"killed by {sig}" if sig else f"exit code {returncode}"
    evidence: dict[str, Any] = {"exit_code": returncode, "exit_signal": sig, "phase": phase,
                                "log_tail": log_tail}
    reason = f"{how} {when} (phase '{phase}')"
    if sig == "SIGKILL":
        evidence["hint"] = OOM_HINT
        reason += "; SIGKILL is most often the OOM killer"
    if failure_line:
        evidence["engine_says"] = failure_line
        reason += f"; the engine said: {failure_line.strip()[:200]}"
    return Verdict(state="crashed", reason=reason, evidence=evidence)


# --------------------------------------------------------------------------------------------------------------
# Words
# --------------------------------------------------------------------------------------------------------------

def _reads(s: EvidenceSample) -> int | None:
    """Storage reads and read() calls together: mmap'd page-cache hits show in neither, RSS covers those."""
    if s.read_bytes is None and s.read_chars is None:
        return None
    return (s.read_bytes or 0) + (s.read_chars or 0)


def _readable(signal: str, s: EvidenceSample | None) -> bool:
    """Whether a signal could be read at all: one we never saw (no bar in this phase, no NVML, another user's
    process) is not worth naming."""
    if s is None:
        return True
    if signal == "log":
        return s.log_bytes is not None or s.log_lines > 0  # doctor without a log has no lines to count
    if signal == "progress":
        return s.progress is not None
    if signal == "gpu_memory":
        return s.gpu_memory_bytes is not None
    if signal in ("reads", "memory", "cpu", "processes"):
        return s.cpu_s is not None
    return True


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _sample_facts(s: EvidenceSample | None) -> dict[str, Any]:
    if s is None:
        return {}
    return {"threads": s.threads, "thread_states": s.thread_states, "threads_in_futex": s.threads_in_futex,
            "processes": s.processes, "processes_exited": s.processes_exited, "cpu_s": s.cpu_s,
            "read_bytes": s.read_bytes, "read_chars": s.read_chars, "rss_bytes": s.rss_bytes,
            "gpu_memory_bytes": s.gpu_memory_bytes, "gpu_util_percent": s.gpu_util_percent}


def _threads_words(s: EvidenceSample | None) -> str:
    if s is None or not s.threads:
        return ""
    text = f"{s.threads} threads"
    if s.threads_in_futex:
        text += f", {s.threads_in_futex} in futex waits"
    if s.gpu_util_percent is not None:
        text += f", GPU {s.gpu_util_percent:.0f}%"
    return text


def _loading_words(phase: str, progress: float | None, evidence: dict[str, Any], s: EvidenceSample | None) -> str:
    text = phase
    if progress is not None:
        text += f" {progress * 100:.0f}%" + (f" ({eta_words(evidence)})" if progress < 1 else "")
    moving = evidence["moving"]
    text += "; moving: " + (", ".join(moving) if moving else f"nothing for {evidence['quiet_s']:.0f} s "
                                                              f"(budget {evidence['budget_s']:.0f} s)")
    threads = _threads_words(s)
    if threads:
        text += f"; {threads}" + (" (idle threads are normal while loading)" if moving else "")
    return text


def _still_words(last_moved: dict[str, float], now_s: float, s: EvidenceSample | None) -> str:
    parts = [f"{SIGNAL_WORDS[name]} still for {now_s - t:.0f} s" for name, t in last_moved.items()
             if _readable(name, s)]
    threads = _threads_words(s)
    return ", ".join(parts) + (f"; {threads}" if threads else "")
