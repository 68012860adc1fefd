"""The far side's detached process: run `servelab ARGV…` as a local run would, and write what it does as events.

`python -m servelab.remote_job JOB_DIR` (the entry module, which hands servelab's CLI to `main`), started by
`servelab remote start` in a session of its own, so the SSH session ending does not end it. It
- points its standard output and error at pipes read by two threads, each line becoming an event (protocol.py);
  the command itself sees a pipe, so it prints as it does into a CI log: plain lines, no redraws;
- has the start-up view write the live statuses as events (events_view.py), which the controller draws with the
  same view a local run uses;
- watches the controller: a stop request (a follower relays Ctrl-C) is a SIGINT to itself, which every command
  handles as Ctrl-C (the engine stopped, what was measured kept); with --on-disconnect stop, a controller gone
  longer than the grace period (no follower touched controller.alive) is the same SIGINT, so nothing is left
  holding the GPUs. The engine's own guard (lifecycle/guard.py) stops it if this process is killed outright.
- writes the command's exit status as the last event.
"""

from __future__ import annotations

import json
from collections.abc import Callable
import os
import signal
import sys
import threading
import time
from pathlib import Path

from servelab.remote import events_view
from servelab.report import live
from servelab.remote.protocol import encode

WATCH_EVERY_S = 0.25
RESTOP_AFTER_S = 30.0  # a stop that did not end the command by then is asked again (a hurried stop)


class EventLog:
    """events.jsonl, appended by several threads, a whole line at a time. The first write that fails (a full
    disk) stops the command, as Ctrl-C would: nobody could see it any more, so an engine left serving would be one
    nobody knows of. Later lines are dropped; the follower then says the worker ended without its exit line, and
    that the disk is full."""

    def __init__(self, path: Path):
        self._file = open(path, "a", encoding="ascii")
        self._lock = threading.Lock()
        self.failed: OSError | None = None

    def write(self, kind: str, **fields) -> None:
        line = encode(kind, **fields) + "\n"
        with self._lock:
            if self.failed is not None:
                return
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                self.failed = exc
                os.kill(os.getpid(), signal.SIGINT)

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass


def _relay(fd: int, kind: str, log: EventLog) -> None:
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                log.write(kind, s=line.decode("utf-8", "replace").rstrip("\r"))
        if pending:
            log.write(kind, s=pending.decode("utf-8", "replace"))


def _capture(fd: int, kind: str, log: EventLog) -> threading.Thread:
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    thread = threading.Thread(target=_relay, args=(read_end, kind, log), daemon=True)
    thread.start()
    return thread


class ControllerWatch(threading.Thread):
    """Stop requests and the controller's absence, turned into SIGINT for the main thread."""

    def __init__(self, job_dir: Path, grace_s: float, on_disconnect: str, log: EventLog):
        super().__init__(daemon=True)
        self.job_dir, self.grace_s, self.on_disconnect, self.log = job_dir, grace_s, on_disconnect, log
        self.done = threading.Event()
        self._stops_seen = 0
        self._stopped_at: float | None = None

    def _interrupt(self, why: str) -> None:
        now = time.monotonic()
        if self._stopped_at is not None and now - self._stopped_at < RESTOP_AFTER_S and why != "request":
            return
        self._stopped_at = now
        os.kill(os.getpid(), signal.SIGINT)

    def run(self) -> None:
        alive, stops = self.job_dir / "controller.alive", self.job_dir / "stop.request"
        while not self.done.wait(WATCH_EVERY_S):
            try:
                requested = len(stops.read_text().splitlines())
            except OSError:
                requested = 0
            if requested > self._stops_seen:
                self._stops_seen = requested
                self._interrupt("request")
                continue
            if self.on_disconnect != "stop":
                continue
            try:
                gone_s = time.time() - alive.stat().st_mtime
            except OSError:
                gone_s = 0.0
            if gone_s > self.grace_s:
                if self._stopped_at is None:
                    self.log.write("err", s=f"servelab: the controller has been gone for {gone_s:.0f} s (grace "
                                            f"{self.grace_s:g} s): stopping, as --on-disconnect stop says")
                self._interrupt("disconnect")


def main(job_dir: Path, command: Callable[[], object]) -> int:
    """Run `command` (servelab's CLI, given by the entry module remote_job.py: this package sits below cli.py)
    with the job's argv; its exit status."""
    job = json.loads((job_dir / "job.json").read_text())
    os.chdir(job_dir)
    if job.get("columns"):
        os.environ["COLUMNS"] = str(job["columns"])
    log = EventLog(job_dir / "events.jsonl")
    readers = [_capture(1, "out", log), _capture(2, "err", log)]
    # line-buffered, so each line is an event as it is written, not when a block fills
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    live.event_view = events_view.EventWriter(log.write)  # every start-up view writes events
    watch = ControllerWatch(job_dir, float(job.get("grace_s", 60.0)), job.get("on_disconnect", "stop"), log)
    watch.start()
    code = 0
    sys.argv = ["servelab", *job["argv"]]
    try:
        command()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - whatever happened, the controller must hear how it ended
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 3
    watch.done.set()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the pipes' last writers gone: the relays read to their end
    os.dup2(devnull, 2)
    for reader in readers:
        reader.join(timeout=10)
    log.write("exit", code=code)
    log.close()
    return code

