"""A scripted OpenAI-compatible server: the ground truth for servelab's client accuracy and fault tests.

    with start_calibration_server() as cal:
        # POST {cal.url}/v1/chat/completions with "calibration": {...} in the body and an X-Calibration-Id header,
        # then GET {cal.url}/calibration/truth/<id> (or cal.truth(id)) for what was sent and when.

The server runs in its own process so it never shares an event loop (or a GIL) with the client under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from servelab.calibration.script import Script, TokenCounts, count_tokens, token_text

__all__ = ["CalibrationHandle", "Script", "TokenCounts", "count_tokens", "separate_cpus", "start_calibration_server",
           "token_text"]

STARTUP_TIMEOUT_S = 30.0


class CalibrationHandle:
    """A running calibration server: one process, or several sharing its port (`processes=N`). Use it as a
    context manager, or call stop()."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: str):
        self.proc = proc  # the first (or only) process
        self.url = url
        self.log_path = log_path
        self.procs: list[subprocess.Popen] = [proc]
        self.own_urls: list[str] = []  # with several processes: each one's own port (its truths)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def truth(self, calibration_id: str) -> dict[str, Any]:
        """GET /calibration/truth/<id>: what the server sent for that request, and when (asked of each process in
        turn when there are several: the one that served the request holds it)."""
        for base in self.own_urls or [self.url]:
            try:
                with urllib.request.urlopen(f"{base}/calibration/truth/{calibration_id}", timeout=5) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as exc:
                if exc.code != 404 or base == (self.own_urls or [self.url])[-1]:
                    raise
        raise LookupError(calibration_id)

    def summary(self, since_ns: int = 0) -> dict[str, Any]:
        """What /calibration/summary says, over every process: the gaps the server wrote (ms, p50/p90/p99 by the
        definition servelab's figures use), tokens, span, and how late its writes were against their targets
        (`late_ms_p99`: the server's own lag, a server that could not keep its schedule)."""
        from servelab.quantiles import percentile

        gaps: list[float] = []
        late: list[float] = []
        requests = tokens = 0
        first = last = None
        for base in self.own_urls or [self.url]:
            with urllib.request.urlopen(f"{base}/calibration/summary?since_ns={since_ns}&raw=1", timeout=60) as r:
                part = json.loads(r.read())
            gaps += part["gaps_ms"]
            late += part["late_ms"]
            requests += part["requests"]
            tokens += part["tokens"]
            if part["first_ns"] is not None:
                first = part["first_ns"] if first is None else min(first, part["first_ns"])
            if part["last_ns"] is not None:
                last = part["last_ns"] if last is None else max(last, part["last_ns"])
        gaps.sort()
        late.sort()
        span_s = (last - first) / 1e9 if first is not None and last is not None else 0.0

        def pct(values: list[float], q: float) -> float | None:
            return percentile(values, q) if values else None

        return {"requests": requests, "tokens": tokens, "itl_ms_mean": sum(gaps) / len(gaps) if gaps else None,
                "itl_ms_p50": pct(gaps, 50), "itl_ms_p90": pct(gaps, 90), "itl_ms_p99": pct(gaps, 99),
                "itl_samples": len(gaps), "span_s": span_s, "tokens_s": tokens / span_s if span_s > 0 else None,
                "late_ms_p50": pct(late, 50), "late_ms_p99": pct(late, 99), "processes": len(self.procs)}

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout` (every process)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
            if proc.stdout is not None:
                proc.stdout.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> CalibrationHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_calibration_server(default: Script | None = None, *, host: str = "127.0.0.1",
                             spin_us: float | None = None, writer: str = "precise",
                             processes: int = 1) -> CalibrationHandle:
    """Start `python -m servelab.calibration.server` on a free port and wait until GET /health answers 200.

    The server binds port 0 itself and reports the port on its first stdout line, so there is no window in
    which another process could take a port picked here. With `processes` > 1 they share the port (SO_REUSEPORT:
    the kernel spreads connections over them), so the server is not what runs out of CPU when many client
    processes measure against it; `truth` and `summary` then ask every process.
    """
    log = tempfile.NamedTemporaryFile(prefix="servelab-calibration-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "servelab.calibration.server", "--host", host]
    if default is not None:
        cmd += ["--default-script", default.model_dump_json()]
    if spin_us is not None:
        cmd += ["--spin-us", str(spin_us)]
    if writer != "precise":
        cmd += ["--writer", writer]
    shared = ["--reuse-port"] if processes > 1 else []
    proc = subprocess.Popen([*cmd, "--port", "0", *shared], stdout=subprocess.PIPE, stderr=log, text=True)
    handle = CalibrationHandle(proc, "", log.name)
    try:
        port, own = _read_port(proc)
        handle.url = f"http://{host}:{port}"
        if processes > 1:
            handle.own_urls.append(f"http://{host}:{own}")
            for _ in range(processes - 1):
                more = subprocess.Popen([*cmd, "--port", str(port), *shared], stdout=subprocess.PIPE, stderr=log,
                                        text=True)
                handle.procs.append(more)
                handle.own_urls.append(f"http://{host}:{_read_port(more)[1]}")
        _wait_healthy(handle)
    except BaseException:
        handle.stop()
        raise
    finally:
        log.close()
    return handle


def _read_port(proc: subprocess.Popen) -> tuple[int, int]:
    """The port the server listens on, and its own port (the same unless it shares the first with others)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""  # the server prints it once listening ("" if it exited)
    parts = line.split()
    if len(parts) not in (3, 4) or parts[0] != "LISTENING":
        raise RuntimeError(f"calibration server did not start (exit code {proc.poll()}, said {line!r})")
    return int(parts[2]), int(parts[-1])


def _wait_healthy(handle: CalibrationHandle) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc in handle.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"calibration server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(handle.url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.02)
    raise RuntimeError("calibration server did not answer /health in time")


@contextlib.contextmanager
def separate_cpus(server_pid: int | Sequence[int], server_cpus: int = 1) -> Iterator[dict[str, list[int]] | None]:
    """The calibration server on the last CPU and this process (and what it starts: children inherit it) on the
    others, until the block ends. What is measured is then the client's own limit, not client and server fighting
    over the same cores, as they would not on a real deployment (on two cores, unpinned, the selftest's p99 error
    crossed 1 ms at 16 streams; pinned, at 64 or more). Yields which CPUs went where, or None (one CPU, or
    affinity cannot be set)."""
    try:
        mine = os.sched_getaffinity(0)
        cpus = sorted(mine)
        if len(cpus) < 2:
            raise OSError("one CPU")
        k = max(1, min(server_cpus, len(cpus) - 1))
        for pid in ([server_pid] if isinstance(server_pid, int) else server_pid):
            os.sched_setaffinity(pid, set(cpus[-k:]))
        os.sched_setaffinity(0, set(cpus[:-k]))
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield {"server_cpus": cpus[-k:], "client_cpus": cpus[:-k]}
    finally:
        os.sched_setaffinity(0, mine)
