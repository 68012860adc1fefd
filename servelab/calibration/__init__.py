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
from collections.abc import Iterator
from typing import Any

from servelab.calibration.script import Script, TokenCounts, count_tokens, token_text

__all__ = ["CalibrationHandle", "Script", "TokenCounts", "count_tokens", "separate_cpus", "start_calibration_server",
           "token_text"]

STARTUP_TIMEOUT_S = 30.0


class CalibrationHandle:
    """A running calibration server process. Use it as a context manager, or call stop()."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: str):
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def truth(self, calibration_id: str) -> dict[str, Any]:
        """GET /calibration/truth/<id>: what the server sent for that request, and when."""
        with urllib.request.urlopen(f"{self.url}/calibration/truth/{calibration_id}", timeout=5) as r:
            return json.loads(r.read())

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> CalibrationHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_calibration_server(default: Script | None = None, *, host: str = "127.0.0.1",
                             spin_us: float | None = None, writer: str = "precise") -> CalibrationHandle:
    """Start `python -m servelab.calibration.server` on a free port and wait until GET /health answers 200.

    The server binds port 0 itself and reports the port on its first stdout line, so there is no window in
    which another process could take a port picked here.
    """
    log = tempfile.NamedTemporaryFile(prefix="servelab-calibration-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "servelab.calibration.server", "--host", host, "--port", "0"]
    if default is not None:
        cmd += ["--default-script", default.model_dump_json()]
    if spin_us is not None:
        cmd += ["--spin-us", str(spin_us)]
    if writer != "precise":
        cmd += ["--writer", writer]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    handle = CalibrationHandle(proc, "", log.name)
    try:
        handle.url = f"http://{host}:{_read_port(proc)}"
        _wait_healthy(handle)
    except BaseException:
        handle.stop()
        raise
    return handle


def _read_port(proc: subprocess.Popen) -> int:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""  # the server prints it once listening ("" if it exited)
    parts = line.split()
    if len(parts) != 3 or parts[0] != "LISTENING":
        raise RuntimeError(f"calibration server did not start (exit code {proc.poll()}, said {line!r})")
    return int(parts[2])


def _wait_healthy(handle: CalibrationHandle) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            raise RuntimeError(f"calibration server exited with {handle.proc.returncode}")
        try:
            with urllib.request.urlopen(handle.url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.02)
    raise RuntimeError("calibration server did not answer /health in time")


@contextlib.contextmanager
def separate_cpus(server_pid: int) -> Iterator[dict[str, list[int]] | None]:
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
        os.sched_setaffinity(server_pid, {cpus[-1]})
        os.sched_setaffinity(0, set(cpus[:-1]))
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield {"server_cpus": cpus[-1:], "client_cpus": cpus[:-1]}
    finally:
        os.sched_setaffinity(0, mine)
