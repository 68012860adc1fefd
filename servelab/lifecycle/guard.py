"""The engine's guard: a tiny process that outlives servelab to stop what servelab started (issue 11 item 5).

A SIGKILLed servelab runs no cleanup. The parent-death signal (supervisor.py) reaches only the engine's first
process; a launcher that forks its server and dies, or a server that double-forks and calls setsid, keeps
listening with no parent servelab knows. So every engine gets a guard:

- servelab marks the engine's environment with `SERVELAB_TREE=<random id>`; every process the engine starts
  inherits it, whatever group or session it moves to (as Jenkins' process-tree killer finds a build's leftovers);
- the guard (this file, run by servelab's interpreter with no servelab import: `python -I -S guard.py PGID ID`)
  sits in a session of its own, blocked reading a pipe whose only writer is servelab;
- when that pipe ends (servelab exited, however it died, or servelab stopped the engine and closed it), the guard
  sends SIGTERM to the engine's process group and to every process carrying the mark, waits up to GRACE_S, sends
  SIGKILL to what is left, and exits.

Limits: a process that replaces its whole environment (`env -i`), or that belongs to another user, is not found
by its mark; one that stayed in the engine's process group is still found through the group.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TREE_VAR = "SERVELAB_TREE"
GRACE_S = 5.0
POLL_S = 0.05


def marked_pids(tree_id: str, proc: str = "/proc") -> list[int]:
    """Every live process whose environment holds SERVELAB_TREE=<tree_id> (this process excluded)."""
    needle = f"{TREE_VAR}={tree_id}".encode()
    found = []
    me = os.getpid()
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"{proc}/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue  # gone, or not ours to read
        if needle + b"\0" in env or env.endswith(needle):
            found.append(int(name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _signal_all(pgid: int, pids: list[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def sweep(pgid: int, tree_id: str, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM the group and the marked processes, SIGKILL what is left after `grace_s`. Returns the marked pids
    found at first."""
    first = marked_pids(tree_id)
    if not first and not _group_alive(pgid):
        return []
    _signal_all(pgid, first, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        # A zombie still reads as alive to killpg, but its environ is empty: the marks are the better clock.
        if not marked_pids(tree_id) and not _group_alive(pgid):
            break
        time.sleep(POLL_S)
    else:
        _signal_all(pgid, marked_pids(tree_id), signal.SIGKILL)
    return first


def main(argv: list[str]) -> int:
    pgid, tree_id = int(argv[1]), argv[2]
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the end of the pipe ends the guard's watch
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    sweep(pgid, tree_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
