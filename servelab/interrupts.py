"""SIGTERM and SIGHUP behave like Ctrl-C (issue 11 item 5).

CI cancelling a job, `docker stop`, systemd stopping a unit and a closed terminal send SIGTERM or SIGHUP, not
SIGINT. Python's default for both is to die on the spot: requests in flight lost, no summary, the engine left to
its parent-death signal. `install()` makes each of them do exactly what Ctrl-C does at that moment: whatever
handles SIGINT then (asyncio's runner cancelling the main task, or Python raising KeyboardInterrupt) is called,
so `bench`, `run` and `up` record the requests in flight as cancelled, write the summary and stop the engine.

Exit codes: 128 + the signal's number, as a shell reports a process killed by it: 130 after Ctrl-C (SIGINT),
143 after SIGTERM, 129 after SIGHUP. `up`, whose normal end is being stopped, exits 0 after any of the three once
its engine was stopped cleanly. A second signal while stopping is a second Ctrl-C (the stop is hurried).
A signal that was ignored when servelab started (`nohup` ignores SIGHUP) stays ignored.

Once the measurement is over and its results are being written (`deferred()`), a further Ctrl-C, SIGTERM or SIGHUP
is held until they are written and printed: a second Ctrl-C 0.1 s after the first no longer ends the command
between the files and the `--json` result it prints (issue 27). The exit code still says it was interrupted.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_received: list[int] = []  # the stop signals received, in order (SIGINT is recorded by `exit_code` callers)


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # asyncio's runner: cancel the main task; else default_int_handler: raise
        return
    raise KeyboardInterrupt  # SIGINT ignored or default: still stop as Ctrl-C would have


def install() -> None:
    """Route SIGTERM and SIGHUP to whatever handles SIGINT. Main thread only; a no-op elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            continue
        signal.signal(sig, _as_ctrl_c)


def received() -> int | None:
    """The first stop signal received (SIGTERM or SIGHUP), or None."""
    return _received[0] if _received else None


def exit_code() -> int:
    """The exit status of a run that was interrupted: 143 (SIGTERM), 129 (SIGHUP), else 130 (Ctrl-C)."""
    first = received()
    return 128 + int(first) if first is not None else 130


@contextmanager
def deferred() -> Iterator[list[int]]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while the results are written and printed: the signals that arrive are
    collected in the yielded list (the first stop signal is remembered for `exit_code`), not raised. Main thread
    only; elsewhere nothing is held."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)
        if signum != signal.SIGINT and not _received:
            _received.append(signum)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    for sig, handler in previous.items():
        if handler != signal.SIG_IGN:
            signal.signal(sig, hold)
    try:
        yield held
    finally:
        for sig, handler in previous.items():
            if handler != signal.SIG_IGN and handler is not None:
                signal.signal(sig, handler)
