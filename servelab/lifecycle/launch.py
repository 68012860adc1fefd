"""Bring an engine up: check the port, start it supervised, follow its log and its readiness probe until ready.

Ready means the probe says so (`adapter.probe_state` of GET `probe_path`) while the process is alive: a log line
alone is never trusted (a server can print "listening" and still answer 503, or the line can come from a
different process). The log gives the phases in between and the evidence when start-up fails.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from servelab.engines import get_engine
from servelab.engines.base import EngineAdapter, EngineSpec, Launch
from servelab.errors import EngineFailed, UserError
from servelab.lifecycle.phases import LogTailer, PhaseTracker
from servelab.lifecycle.supervisor import SupervisedProcess, start_process
from servelab.provenance import build_provenance, relevant_env, utc_now_iso
from servelab.records import LaunchResult, LintFinding, Phase, Provenance, Verdict

POLL_S = 0.05  # log and probe cadence: ready is seen within ~2 polls of the server answering 200
UPDATE_EVERY_S = 0.5  # on_update is called at least this often, even when nothing changed
PROBE_TIMEOUT_S = 2.0  # a probe that takes longer reads "unknown" (port accepted, nobody answers)
LOG_TAIL_LINES = 20
OOM_HINT = ("SIGKILL during start-up is most often the OS OOM killer: check `dmesg` or `journalctl -k` for "
            "'Out of memory', and try a smaller model, context or --parallel")


@dataclass(frozen=True)
class LaunchStatus:
    """What a live view needs to show, handed to `on_update`."""

    elapsed_s: float
    phase: str
    phase_elapsed_s: float  # time in the current phase: the base of an ETA
    progress: float | None  # 0..1 when the log says n/total
    detail: str | None
    last_line: str | None
    probe: str  # the adapter's reading of the last probe answer: down, loading, ready, unknown
    pid: int

    def key(self) -> tuple[Any, ...]:
        """Everything but the clocks: a change here is worth an update."""
        return self.phase, self.progress, self.detail, self.last_line, self.probe


# --------------------------------------------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------------------------------------------

def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise UserError(f"cannot resolve host '{host}': {exc.strerror}") from None
    return family, sockaddr


def port_in_use(host: str, port: int) -> bool:
    """True when an engine could not listen on host:port because something else holds it."""
    family, sockaddr = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so a connection left in TIME_WAIT does not block them and should not block us.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}",
                            hint="use a local address with --host and a free port with --port") from None
    return False


def free_port(host: str = "127.0.0.1") -> int:
    family, sockaddr = _address(host, 0)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(sockaddr)
        return int(sock.getsockname()[1])


def ensure_port_free(host: str, port: int) -> None:
    if port_in_use(host, port):
        raise UserError(f"port {port} on {host} is already in use",
                        hint=f"stop what listens there, or choose another port with --port (e.g. --port "
                             f"{free_port(host)})")


# --------------------------------------------------------------------------------------------------------------
# The readiness probe
# --------------------------------------------------------------------------------------------------------------

def http_get(url: str, path: str, timeout_s: float, max_bytes: int | None = None) -> tuple[int, bytes]:
    """One GET. http.client rather than urllib: urllib honours HTTP_PROXY, and a proxy must never see loopback
    probes. Raises OSError (refused, reset, timeout) or http.client.HTTPException."""
    parts = urlsplit(url)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = connection_type(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        body = response.read() if max_bytes is None else response.read(max_bytes)
        return response.status, body
    finally:
        conn.close()


@dataclass(frozen=True)
class ProbeReading:
    state: str
    http_status: int | None
    at_s: float  # seconds since launch when the answer (or the refusal) came


class Prober:
    """Probes in a thread of its own, so a server that accepts and never answers cannot stall the start-up loop."""

    def __init__(self, url: str, path: str, adapter: EngineAdapter, clock: Callable[[], float],
                 interval_s: float = POLL_S, timeout_s: float = PROBE_TIMEOUT_S):
        self._url, self._path, self._adapter, self._clock = url, path, adapter, clock
        self._interval_s, self._timeout_s = interval_s, timeout_s
        self.latest: ProbeReading | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servelab-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._timeout_s + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.latest = self.probe_once()
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - began)))

    def probe_once(self) -> ProbeReading:
        try:
            status, body = http_get(self._url, self._path, self._timeout_s, max_bytes=4096)
        except TimeoutError:
            return ProbeReading("unknown", None, self._clock())
        except (OSError, http.client.HTTPException):  # refused, reset, closed early: nobody is serving yet
            return ProbeReading(self._adapter.probe_state(None, ""), None, self._clock())
        state = self._adapter.probe_state(status, body.decode("utf-8", errors="replace"))
        return ProbeReading(state, status, self._clock())


# --------------------------------------------------------------------------------------------------------------
# The running engine
# --------------------------------------------------------------------------------------------------------------

class RunningEngine:
    """An engine that answered its readiness probe. A context manager: leaving the block stops it."""

    def __init__(self, *, spec: EngineSpec, adapter: EngineAdapter, launch: Launch, process: SupervisedProcess,
                 tracker: PhaseTracker, started_at: str, ready_s: float, ready_probe: ProbeReading):
        self.spec = spec
        self.adapter = adapter
        self.launch = launch
        self.process = process
        self.url = launch.url
        self.served_model = launch.served_model
        self.log_path = process.log_path
        self.pid = process.pid
        self.ready_s = ready_s
        self.started_at = started_at
        self._tracker = tracker
        self._ready_probe = ready_probe
        self._stopped = False
        self._runtime_config: dict[str, Any] | None = None

    @property
    def phases(self) -> list[Phase]:
        return self._tracker.phases

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def runtime_config(self) -> dict[str, Any] | None:
        """What the running server says it was started with (JSON of the adapter's first config path)."""
        if self._runtime_config is None and self.alive and self.adapter.config_paths:
            try:
                status, body = http_get(self.url, self.adapter.config_paths[0], PROBE_TIMEOUT_S)
                parsed = json.loads(body) if status == 200 else None
                self._runtime_config = parsed if isinstance(parsed, dict) else None
            except (OSError, http.client.HTTPException, ValueError):
                pass
        return self._runtime_config

    def lint(self) -> list[LintFinding]:
        return self.adapter.lint(self.spec, self.launch.command, self.runtime_config())

    def result(self) -> LaunchResult:
        evidence: dict[str, Any] = {
            "probe": f"GET {self.adapter.probe_path}", "probe_status": self._ready_probe.http_status,
            "ready_line_s": self._tracker.ready_line_s, "port_answered_s": self._tracker.port_answered_s,
            "pid": self.pid,
        }
        if self.alive or self._stopped:
            verdict = Verdict(state="ready", reason=f"{self.adapter.probe_path} answered "
                                                    f"{self._ready_probe.http_status} after {self.ready_s:.2f} s",
                              evidence={**evidence, "stopped_by_servelab": self._stopped})
        else:
            verdict = Verdict(state="crashed",
                              reason=f"the engine died after start-up ({self.process.describe_exit()})",
                              evidence={**evidence, "exit_code": self.process.returncode,
                                        "log_tail": self.process.log_tail(LOG_TAIL_LINES)})
        return LaunchResult(engine=self.adapter.name, url=self.url, ready_s=self.ready_s, phases=self.phases,
                            verdict=verdict, log_path=str(self.log_path), lint=self.lint())

    def provenance(self) -> Provenance:
        return _provenance(self.spec, self.adapter, self.launch, self.started_at)

    def stop(self, grace_s: float = 10.0) -> int | None:
        self._stopped = True
        return self.process.stop(grace_s)

    def __enter__(self) -> RunningEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _provenance(spec: EngineSpec, adapter: EngineAdapter, launch: Launch, started_at: str) -> Provenance:
    return build_provenance(
        engine=adapter.name, engine_version=adapter.version(), command=launch.command,
        env=relevant_env(launch.env), model=spec.model, model_path=launch.model_path,
        model_size_bytes=launch.extra.get("model_size_bytes"), model_format=launch.extra.get("model_format"),
        started_at=started_at)


# --------------------------------------------------------------------------------------------------------------
# Start-up
# --------------------------------------------------------------------------------------------------------------

def start_engine(spec: EngineSpec, log_dir: Path, on_update: Callable[[LaunchStatus], None] | None = None,
                 ready_timeout_s: float = 600.0, stop_grace_s: float = 10.0) -> RunningEngine:
    """Start the engine `spec` describes and return once its probe says ready.

    Raises UserError before anything starts (unknown engine, port in use, missing model), EngineFailed when the
    process dies or is not ready within `ready_timeout_s`. On any failure or interruption (Ctrl-C, an exception
    from `on_update`) the whole process group is stopped before the exception propagates.
    """
    adapter = get_engine(spec.engine)
    port = spec.port or free_port(spec.host)
    ensure_port_free(spec.host, port)
    launch = adapter.launch(spec, port)
    log_path = Path(log_dir) / f"{adapter.name}-{port}.log"
    tracker = PhaseTracker(adapter)
    started_at = utc_now_iso()
    t0 = time.monotonic()
    process = start_process(launch.command, log_path, env=launch.env)
    try:
        ready_s, probe = _watch_startup(adapter, launch, process, tracker, lambda: time.monotonic() - t0,
                                        on_update, ready_timeout_s)
    except BaseException:
        process.stop(stop_grace_s)
        raise
    return RunningEngine(spec=spec, adapter=adapter, launch=launch, process=process, tracker=tracker,
                         started_at=started_at, ready_s=ready_s, ready_probe=probe)


def _watch_startup(adapter: EngineAdapter, launch: Launch, process: SupervisedProcess, tracker: PhaseTracker,
                   clock: Callable[[], float], on_update: Callable[[LaunchStatus], None] | None,
                   ready_timeout_s: float) -> tuple[float, ProbeReading]:
    tailer = LogTailer(process.log_path, start_offset=process.log_offset)
    prober = Prober(launch.url, adapter.probe_path, adapter, clock)
    prober.start()
    last_key: tuple[Any, ...] | None = None
    last_update_s = float("-inf")
    try:
        while True:
            now = clock()
            for line in tailer.read_lines():
                tracker.feed(line, now)
            reading = prober.latest
            if reading is not None:
                tracker.observe_probe(reading.state, reading.at_s)
            exited = process.poll() is not None
            if reading is not None and reading.state == "ready" and not exited:
                # The answer came at reading.at_s; a log line read later must not make the timeline go backwards.
                ready_s = max(reading.at_s, tracker.current.start_s)
                tracker.mark_ready(ready_s)
                if on_update is not None:
                    on_update(_status(tracker, clock(), "ready", process.pid))
                return ready_s, reading
            if exited:
                for line in tailer.read_lines() + tailer.flush():
                    tracker.feed(line, now)
                tracker.close(now)
                raise _died(adapter, launch, process, tracker, now)
            if now >= ready_timeout_s:
                tracker.close(now)
                raise _timed_out(adapter, launch, process, tracker, now, ready_timeout_s)
            status = _status(tracker, now, reading.state if reading else "down", process.pid)
            if on_update is not None and (status.key() != last_key or now - last_update_s >= UPDATE_EVERY_S):
                on_update(status)
                last_key, last_update_s = status.key(), now
            time.sleep(max(0.0, POLL_S - (clock() - now)))
    finally:
        prober.stop()
        tailer.close()


def _status(tracker: PhaseTracker, now: float, probe: str, pid: int) -> LaunchStatus:
    phase = tracker.current
    return LaunchStatus(elapsed_s=now, phase=phase.name, phase_elapsed_s=max(0.0, now - phase.start_s),
                        progress=phase.progress, detail=phase.detail, last_line=tracker.last_line, probe=probe,
                        pid=pid)


def _died(adapter: EngineAdapter, launch: Launch, process: SupervisedProcess, tracker: PhaseTracker,
          now: float) -> EngineFailed:
    tail = process.log_tail(LOG_TAIL_LINES)
    how = process.describe_exit()
    message = (f"{adapter.title} {how} during start-up after {now:.1f} s (phase '{tracker.current.name}')"
               + ("; last log lines:\n  " + "\n  ".join(tail) if tail else "; it wrote nothing to its log"))
    hint = OOM_HINT if process.exit_signal == "SIGKILL" else f"full log: {process.log_path}"
    failure = EngineFailed(message, hint, exit_code=process.returncode, log_tail=tail)
    verdict = Verdict(state="crashed", reason=f"{how} during start-up",
                      evidence={"exit_code": process.returncode, "exit_signal": process.exit_signal,
                                "phase": tracker.current.name, "log_tail": tail})
    _attach_result(failure, adapter, launch, process, tracker, verdict)
    return failure


def _timed_out(adapter: EngineAdapter, launch: Launch, process: SupervisedProcess, tracker: PhaseTracker,
               now: float, timeout_s: float) -> EngineFailed:
    tail = process.log_tail(LOG_TAIL_LINES)
    phase = tracker.current
    silent_s = now - tracker.last_line_s if tracker.last_line_s is not None else now
    message = (f"{adapter.title} was not ready after {timeout_s:.0f} s: phase '{phase.name}' for "
               f"{now - phase.start_s:.0f} s, log silent for {silent_s:.0f} s, probe {tracker.probe_state or 'down'}"
               + ("; last log lines:\n  " + "\n  ".join(tail) if tail else ""))
    # A log that keeps moving means slow (give it more time); a silent one in the same phase suggests a hang.
    hint = ("the log was still moving: a larger --ready-timeout may be all it needs" if silent_s < 30
            else f"the log stopped moving: it may be hung; full log: {process.log_path}")
    failure = EngineFailed(message, hint, exit_code=None, log_tail=tail)
    verdict = Verdict(state="stalled", reason=f"not ready after {timeout_s:.0f} s",
                      evidence={"phase": phase.name, "log_silent_s": round(silent_s, 1),
                                "probe": tracker.probe_state, "log_tail": tail})
    _attach_result(failure, adapter, launch, process, tracker, verdict)
    return failure


def _attach_result(failure: EngineFailed, adapter: EngineAdapter, launch: Launch, process: SupervisedProcess,
                   tracker: PhaseTracker, verdict: Verdict) -> None:
    """The failed launch as a record, for a run directory's summary."""
    failure.launch_result = LaunchResult(
        engine=adapter.name, url=launch.url, ready_s=None, phases=tracker.phases, verdict=verdict,
        log_path=str(process.log_path))
