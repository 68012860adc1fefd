"""`servelab doctor`: one diagnosis for a server servelab did not start, from any of its pid, its log and its URL.

It watches for a few seconds (evidence samples, new log lines, the readiness probe) and judges with the same
rules as start-up (lifecycle/diagnose.py). It fills in what it was not given where the host can tell it: the URL
from the process tree's listening sockets (`--pid` alone), the process from whoever listens on a local URL's port
(`--url` alone), and the log from the process's stdout/stderr when they are a file. A server whose readiness probe
answers 200, or that lists its models at /v1/models, is ready whatever its log says. Nothing listening at the URL
and no process or log to look at is "not running"; a pid with no process and no log is "no such process".
What it still cannot see it says: without a pid there are no process counters; without a log no phase. Before the
window it only knows when the log was last written, so a stall is declared when the log has been silent for the
phase's budget *and* nothing moved during the window (the assumption is named in the evidence); without a log the
window alone must cover the budget.

With a live pid it also reads the stacks of the whole process tree (lifecycle/stacks/), in a thread alongside the
window and spread over it, so they cost next to no time: each process's activity ("TP3 scheduler: in all_reduce,
stack unchanged for 3.0 s") and the tree's in one line, which a stalled or loading verdict names in its evidence
(`stacks`), and a stall in its reason. A server ready at the first probe is read twice, 0.5 s apart (its window
ends at once); one that answers its probe while its stacks look deadlocked says so and exits 1 (`name_the_stacks`,
`looks_hung`). `stacks=False` skips them; `raw_stacks` adds the dumps as text.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from servelab.engines import REGISTRY, get_engine
from servelab.engines.base import EngineAdapter, EngineSpec
from servelab.errors import UserError
from servelab.host.gpu_telemetry.snapshot import gpu_snapshot, held_by
from servelab.lifecycle.diagnose import StartupJudge, crashed_verdict
from servelab.lifecycle.evidence import EvidenceSampler
from servelab.lifecycle.observe import StartupObserver
from servelab.lifecycle.phases import LogTailer, PhaseTracker
from servelab.lifecycle.probe import PROBE_TIMEOUT_S, http_get
from servelab.lifecycle.readback import lint_all, log_lines_for_lint, read_runtime_config
from servelab.lifecycle.stacks import read_stacks
from servelab.records import Diagnosis, StackReport, Verdict

STACK_SAMPLES = 3
STACK_MAX_INTERVAL_S = 1.5
STACK_DEADLINE_S = 10.0  # all samples of every process, whatever the window
READY_STACK_SAMPLES = 2  # a server ready at the first probe: enough to see whether anything moves
READY_STACK_INTERVAL_S = 0.5
NO_LOG_PHASE = "unknown (no log)"  # the phase when there is no log to read it from
MODELS_PATH = "/v1/models"
_SPEED = re.compile(r"--speed[= ](\d+(?:\.\d+)?)")
class _Generic(EngineAdapter):
    """An engine doctor cannot name: no phases, probe /health."""

    name = "unknown"
    title = "unknown engine"


def diagnose(*, pid: int | None = None, log: Path | None = None, url: str | None = None, engine: str | None = None,
             seconds: float = 3.0, interval_s: float = 0.5, stacks: bool = True, raw_stacks: bool = False
             ) -> Diagnosis:
    if pid is None and log is None and url is None:
        raise UserError("doctor needs at least one of --pid, --log, --url")
    if log is not None and not Path(log).is_file():
        raise UserError(f"log file {log} does not exist")
    url = url.rstrip("/") if url else None
    notes: list[str] = []
    cmdline = _cmdline(pid) if pid is not None else None
    if pid is not None and cmdline is None:
        if log is not None:  # the log says it ran: it has exited
            return _gone(_identify(engine, None, url, log), pid, log, url)
        if url is None:
            return _no_such_process(pid)
        notes.append(f"no live process with pid {pid}: judged by the URL alone")
    # What was not given, from the host: the URL from the tree's listening sockets, the pid from a local URL's
    # listener, the log from the process's stdout/stderr.
    live_pid = pid if cmdline is not None else None
    candidates: list[str] = []
    if url is None and live_pid is not None:
        candidates = listening_urls(live_pid)
        if not candidates:
            notes.append(f"pid {live_pid} listens on no TCP port (yet): no readiness probe")
    if live_pid is None and url is not None and pid is None:
        found = _listener_of(url)
        if found is not None:
            live_pid, cmdline = found, _cmdline(found)
            notes.append(f"pid {found} found listening on the URL's port")
    if log is None and live_pid is not None:
        log = output_file(live_pid)
        if log is not None:
            notes.append(f"log found as the process's output: {log}")
    adapter = _identify(engine, cmdline, url or (candidates[0] if candidates else None), log)
    if url is None and candidates:
        url = _pick_url(adapter, candidates)
        notes.append(f"URL {url} found from the process's listening sockets"
                     + (f" (of {', '.join(candidates)})" if len(candidates) > 1 else ""))

    tracker = PhaseTracker(adapter)
    log_age_s: float | None = None
    tailer: LogTailer | None = None
    if log is not None:
        for line in log_lines_for_lint(Path(log)):  # the log so far: where start-up has got to
            tracker.feed(line, 0.0)
        log_age_s = max(0.0, time.time() - os.stat(log).st_mtime)
        tailer = LogTailer(Path(log), start_offset=os.stat(log).st_size)
        notes.append(f"log last written {log_age_s:.0f} s ago")

    wants_stacks = stacks and live_pid is not None
    stack_reader: _StackReader | None = None  # started after the first probe, which says how long to watch
    if stacks and live_pid is None and raw_stacks:
        notes.append("--stacks needs a live process (--pid, or a local URL whose listener can be found)")
    sampler = EvidenceSampler(live_pid, Path(log) if log else None)
    before = -(log_age_s or 0.0)  # assumed: nothing moved between the last log write and the window
    judge = StartupJudge(adapter, None, None, t0_s=before)
    observer = StartupObserver(adapter, tracker, sampler, judge)
    t0 = time.monotonic()
    probe_state, probe_status = None, None
    try:
        while True:
            now = time.monotonic() - t0
            if tailer is not None:
                observer.feed(tailer.read_lines(), now)
                tracker.feed_partial(tailer.pending(), now)
            if url is not None:
                probe_state, probe_status = _probe(adapter, url)
            observer.sample(now, probe_state, phase=None if log is not None else NO_LOG_PHASE)
            if wants_stacks and stack_reader is None:
                stack_reader = _StackReader(live_pid, adapter, seconds, raw_stacks, ready=probe_state == "ready")
            if live_pid is not None and not _alive(live_pid):
                if stack_reader is not None:
                    stack_reader.result()  # its py-spy runs end within their deadline; nothing left behind
                return _gone(adapter, live_pid, log, url, samples=sampler.samples)
            if probe_state == "ready" or now >= seconds:
                break  # a ready answer is the verdict: no need to watch the rest of the window
            if probe_state == "down" and live_pid is None and tailer is None:
                break  # a refused URL with no process or log to watch: the window would only repeat the refusal
            time.sleep(interval_s)
    finally:
        sampler.close()
        if tailer is not None:
            tailer.close()

    now = time.monotonic() - t0
    current = tracker.current
    models = _models(url) if url is not None and probe_state not in (None, "down") else None
    if probe_state == "ready" or (probe_state == "unknown" and models):
        why = (f"GET {adapter.probe_path} answered {probe_status}" if probe_state == "ready"
               else f"GET {MODELS_PATH} lists {len(models or [])} model(s) (GET {adapter.probe_path} answered "
                    f"{probe_status})")
        verdict = Verdict(state="ready", reason=why
                          + (f"; serving {', '.join(models[:3])}" if models and probe_state == "ready" else "")
                          + ("; the log's ready line is there too" if tracker.ready_line_s is not None else ""),
                          evidence={"probe_status": probe_status, "models": models, **_facts(sampler)})
    elif probe_state == "down" and live_pid is None and log is None:
        verdict = Verdict(state="not running",
                          reason=f"nothing listens at {url} (connection refused) and there is no process or log to "
                                 f"look at; if it is still loading (SGLang opens its port only when ready), give "
                                 f"--pid or --log",
                          evidence={"probe": "down", "url": url})
    elif tracker.ready_line_s is not None and url is None:
        verdict = Verdict(state="ready", reason="the log says ready (its ready line is there); give --url to "
                                                "confirm with the readiness probe",
                          evidence={"probe": None, **_facts(sampler)})
    else:
        phase = current.name if log is not None else NO_LOG_PHASE
        verdict = judge.verdict(now, phase=phase, phase_start_s=before, progress=current.progress,
                                probe=probe_state, ready_line_s=tracker.ready_line_s, last_line=tracker.last_line)
        verdict.evidence["window_s"] = round(now, 1)
        if log_age_s is not None:
            verdict.evidence["assumed"] = ("counters were as still before the window as during it, back to the "
                                           "log's last write")
        elif verdict.state != "stalled":
            verdict.evidence["assumed"] = ("no log: the phase is unknown, and a stall needs the window itself "
                                           f"(--seconds) to cover the budget ({verdict.evidence['budget_s']:.0f} s)")
    if tracker.last_line:
        verdict.evidence["last_line"] = tracker.last_line

    config = read_runtime_config(url, adapter) if url and probe_state not in (None, "down") else None
    lint = lint_all(adapter, EngineSpec(engine=adapter.name, model="-"), cmdline or [], config,
                    log_lines_for_lint(Path(log)) if log else [])
    report = stack_reader.result() if stack_reader is not None else None
    name_the_stacks(verdict, report, probe_path=adapter.probe_path)
    if report is not None and report.samples and (verdict.evidence.get("thread_states") or {}).get("t"):
        # py-spy pauses a process while it reads its stacks (ptrace): a sample taken meanwhile finds its threads in
        # the tracing stop, which says nothing about the engine
        notes.append("threads in state t were paused by py-spy reading their stacks, not by the engine")
    gpus, gpus_note, engine_gpus = _gpus(live_pid, sampler)
    return Diagnosis(engine=adapter.name if not isinstance(adapter, _Generic) else None, pid=pid or live_pid,
                     log_path=str(log) if log else None, url=url, verdict=verdict, phases=tracker.phases,
                     samples=sampler.samples, lint=lint, stacks=report.raw if report is not None else None,
                     stack_report=report, gpus=gpus, gpus_note=gpus_note, engine_gpus=engine_gpus, notes=notes)


def _gpus(live_pid: int | None, sampler: EvidenceSampler) -> tuple[list, str | None, list[int]]:
    """This host's GPUs as the verdict is given, and which the server's processes (the tree the evidence watched)
    hold: read only when its process is here (a URL alone may be another host's server, whose GPUs these are
    not)."""
    if live_pid is None:
        return [], "not read: the server's process is not on this host (give --pid to read its GPUs)", []
    readings, note = gpu_snapshot()
    tree = {live_pid, *(p.pid for p in sampler.tree())}
    return readings, note, [r.gpu for r in readings if held_by(r, tree)]


class _StackReader:
    """read_stacks in a thread, its samples spread over doctor's window so that it adds next to no time."""

    def __init__(self, pid: int, adapter: EngineAdapter, window_s: float, raw: bool, ready: bool = False) -> None:
        # A server that answers at once ends the window at once: two samples half a second apart still tell a
        # deadlock (nothing moves) from a server at work, at half a second's cost instead of the window's.
        samples = READY_STACK_SAMPLES if ready else STACK_SAMPLES
        interval = (READY_STACK_INTERVAL_S if ready
                    else max(0.2, min(STACK_MAX_INTERVAL_S, window_s / (STACK_SAMPLES - 1))))
        self._report: StackReport | None = None
        self._thread = threading.Thread(target=self._read, args=(pid, adapter, samples, interval, raw),
                                        name="stacks", daemon=True)
        self._thread.start()

    def _read(self, pid: int, adapter: EngineAdapter, samples: int, interval: float, raw: bool) -> None:
        self._report = read_stacks(pid, None if isinstance(adapter, _Generic) else adapter, samples=samples,
                                   interval_s=interval, deadline_s=STACK_DEADLINE_S, raw=raw)

    def result(self) -> StackReport:
        self._thread.join(STACK_DEADLINE_S + 5.0)
        return self._report or StackReport(unavailable="the stacks were not read in time",
                                           summary="the stacks were not read in time")


def name_the_stacks(verdict: Verdict, report: StackReport | None, probe_path: str = "/health") -> None:
    """A stalled or loading verdict says what the stacks showed: in its evidence, and at the end of a stall's
    reason (the stall is judged by the counters; the stacks say where it stands). A ready verdict is the probe's
    answer, and a server can answer its health check while every request hangs: when its stacks look deadlocked
    or stuck its reason says so (and doctor exits 1, `looks_hung`); only stacks that say idle, or none at all,
    earn the sentence that idle threads are normal."""
    said = (report.summary or report.unavailable) if report is not None else None
    if verdict.state == "ready":
        if report is not None and said:
            verdict.evidence["stacks"] = said
            verdict.evidence["stacks_verdict"] = report.verdict
        if report is not None and report.unavailable is None and report.verdict in ("deadlock", "stuck"):
            who = "its ranks" if any(p.role and "TP" in p.role for p in report.processes) else "its processes"
            looks = "look deadlocked" if report.verdict == "deadlock" else "look stuck"
            verdict.reason = (f"{verdict.reason}; it answers {probe_path} but {who} {looks}: {said} "
                              "(requests may hang)")
        elif report is None or report.unavailable is not None or report.verdict == "idle":
            verdict.reason += "; idle threads are normal for a server waiting for requests"
        return
    if report is None or verdict.state not in ("stalled", "loading") or not said:
        return
    verdict.evidence["stacks"] = said
    verdict.evidence["stacks_verdict"] = report.verdict
    if verdict.state == "stalled" and report.unavailable is None:
        verdict.reason = f"{verdict.reason.rstrip('.')}; the stacks: {said}"
    elif report.unavailable is None and report.verdict == "deadlock":
        # Within its budget the counters cannot call it stalled yet; ranks that disagree on a collective will not
        # move again, so the reason says so now rather than when the budget runs out.
        verdict.reason = f"{verdict.reason.rstrip('.')}; but the stacks: {said}"


def looks_hung(d: Diagnosis) -> bool:
    """Whether doctor exits 1: a server that is not serving, or one that answers its health check while its
    stacks look deadlocked (or one still loading by its counters whose ranks disagree on a collective). The state
    stays what the probe and the counters said ("ready": it does answer), so scripts that read
    the state see no new value; the exit code and the reason carry the warning. A ready server whose stacks look
    merely stuck exits 0: a wait the signatures cannot name is no proof that requests hang."""
    if d.verdict.state in ("stalled", "crashed", "not running", "no such process"):
        return True
    return d.verdict.state in ("ready", "loading") and d.verdict.evidence.get("stacks_verdict") == "deadlock"


# --------------------------------------------------------------------------------------------------------------
# What the host can tell: listening sockets, the listener of a port, the process's output file
# --------------------------------------------------------------------------------------------------------------

def listening_urls(pid: int) -> list[str]:
    """http://HOST:PORT for each TCP port the process tree listens on, lowest port first (a wildcard address is
    reached on loopback)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found: dict[int, str] = {}
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.status != psutil.CONN_LISTEN or not c.laddr:
                continue
            host = c.laddr.ip
            if host in ("0.0.0.0", ""):
                host = "127.0.0.1"
            elif host == "::":
                host = "::1"
            found.setdefault(c.laddr.port, f"[{host}]" if ":" in host else host)
    return [f"http://{host}:{port}" for port, host in sorted(found.items())]


def _listener_of(url: str) -> int | None:
    """The one process listening on a local URL's port (None: not local, nobody, several, or hidden from us)."""
    from servelab.host.environment import is_local_host, listening_pids, url_port

    host, port = url_port(url)
    if not is_local_host(host) or port is None:
        return None
    listener = listening_pids(port)
    return listener.pids[0] if len(listener.pids) == 1 else None


def output_file(pid: int) -> Path | None:
    """The regular file the process's stderr (else stdout) is written to: an engine started with its output
    redirected to a log (nohup, `> log 2>&1`, servelab's own supervisor). None for a terminal, a pipe, or a
    process we may not look into."""
    for fd in (2, 1):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and not target.startswith("/dev/") and Path(target).is_file():
            return Path(target)
    return None


def _pick_url(adapter: EngineAdapter, candidates: list[str]) -> str:
    """Of several listening ports, the one whose readiness probe or model list answers (ready first)."""
    readings = []
    for candidate in candidates:
        state, _ = _probe(adapter, candidate)
        if state == "ready":
            return candidate
        readings.append((state, candidate))
    for state, candidate in readings:
        if state == "loading" or _models(candidate):
            return candidate
    return candidates[0]


def _models(url: str) -> list[str] | None:
    """The model ids /v1/models lists; None when it does not answer with a list."""
    try:
        status, body = http_get(url, MODELS_PATH, PROBE_TIMEOUT_S, max_bytes=256 * 1024)
        if status != 200:
            return None
        data = json.loads(body).get("data")
    except Exception:  # refused, reset, not JSON, not an object: not a model list
        return None
    if not isinstance(data, list):
        return None
    return [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]


# --------------------------------------------------------------------------------------------------------------
# Which engine is it?
# --------------------------------------------------------------------------------------------------------------

def _identify(engine: str | None, cmdline: list[str] | None, url: str | None, log: Path | None) -> EngineAdapter:
    if engine:
        adapter = get_engine(engine)
    else:
        adapter = _by_cmdline(cmdline) or _by_fingerprint(url) or _by_log(log) or _Generic()
    speed = _SPEED.search(" ".join(cmdline or []))
    if speed and hasattr(adapter, "_speed"):
        adapter._speed = float(speed.group(1))  # a replay's budgets shrink with its speed
    return adapter


def _by_cmdline(cmdline: list[str] | None) -> EngineAdapter | None:
    if not cmdline:
        return None
    text = " ".join(cmdline)
    # Longest marker first: "servelab.engines.replay --script sglang" must beat SGLang's own markers.
    candidates = [(len(m), cls) for cls in REGISTRY.values() for m in cls.cmdline_markers if m in text]
    return max(candidates, key=lambda c: c[0])[1]() if candidates else None


def _by_fingerprint(url: str | None) -> EngineAdapter | None:
    if not url:
        return None
    for cls in REGISTRY.values():
        adapter = cls()
        if not adapter.fingerprint_path:
            continue
        try:
            status, body = http_get(url, adapter.fingerprint_path, PROBE_TIMEOUT_S)
            if status == 200 and adapter.fingerprint(json.loads(body)):
                return adapter
        except (OSError, ValueError, Exception):
            continue
    return None


def _by_log(log: Path | None) -> EngineAdapter | None:
    """The adapter whose phase patterns and ready line recognise the most lines of the log."""
    if log is None:
        return None
    lines = log_lines_for_lint(Path(log))[:5000]
    best: tuple[int, EngineAdapter | None] = (0, None)
    for cls in REGISTRY.values():
        adapter = cls()
        patterns = [p.regex for p in adapter.phases] + ([adapter.ready_line] if adapter.ready_line else [])
        if not patterns:
            continue
        score = sum(1 for line in lines if any(p.search(line) for p in patterns))
        if score > best[0]:
            best = (score, adapter)
    return best[1]


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------

def _cmdline(pid: int) -> list[str] | None:
    """The process's command line; None when it does not exist (or is a zombie: it has exited)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.cmdline()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return []


def _alive(pid: int) -> bool:
    return _cmdline(pid) is not None


def _probe(adapter: EngineAdapter, url: str) -> tuple[str, int | None]:
    try:
        status, body = http_get(url, adapter.probe_path, PROBE_TIMEOUT_S, max_bytes=4096)
    except TimeoutError:
        return "unknown", None
    except Exception:  # refused, reset: nobody serves there
        return adapter.probe_state(None, ""), None
    return adapter.probe_state(status, body.decode("utf-8", errors="replace")), status


def _facts(sampler: EvidenceSampler) -> dict[str, Any]:
    if not sampler.samples:
        return {}
    s = sampler.samples[-1]
    return {"threads": s.threads, "thread_states": s.thread_states, "threads_in_futex": s.threads_in_futex,
            "processes": s.processes, "rss_bytes": s.rss_bytes, "gpu_util_percent": s.gpu_util_percent}


def _gone(adapter: EngineAdapter, pid: int, log: Path | None, url: str | None, samples: list | None = None
          ) -> Diagnosis:
    tail = log_lines_for_lint(Path(log))[-20:] if log else []
    failure = None
    if adapter.failure_lines is not None:
        matches = [line for line in tail if adapter.failure_lines.search(line)]
        failure = matches[-1] if matches else None
    verdict = crashed_verdict(None, "unknown", tail, failure)
    # Not our child: its exit status went to its own parent, so the signal cannot be known from here.
    verdict.reason = f"no live process with pid {pid}: it has exited (its exit status went to its parent)" + (
        f"; the engine said: {failure.strip()[:200]}" if failure else "")
    return Diagnosis(engine=adapter.name if not isinstance(adapter, _Generic) else None, pid=pid,
                     log_path=str(log) if log else None, url=url, verdict=verdict, samples=samples or [],
                     notes=["check `dmesg` for an OOM kill if it died during start-up"])


def _no_such_process(pid: int) -> Diagnosis:
    verdict = Verdict(state="no such process",
                      reason=f"there is no process with pid {pid}: it never existed, or it exited and its parent "
                             f"reaped it (give --log to tell which, --url to ask the server itself)",
                      evidence={"pid": pid})
    return Diagnosis(pid=pid, verdict=verdict)
