"""A launcher that double-forks its server (the calibration server), as daemonizing launchers do: the fault tests
and benchmarks/fault_matrix.py give it to `servelab up command` / experiment cells to check that no server
outlives servelab.

    python -m servelab.calibration.launcher PORT MODE PIDFILE SCRIPT_JSON

With MODE "setsid" the server leaves the launcher's process group and session; with "group" it stays in it. The
launcher itself stays, as one that waits on its workers does. The server's pid is written to PIDFILE.
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str]) -> None:
    port, mode, pidfile, script = argv
    child = os.fork()
    if child == 0:
        if mode == "setsid":
            os.setsid()
        if os.fork() != 0:
            os._exit(0)
        with open(pidfile, "w") as fh:
            fh.write(str(os.getpid()))
        os.execv(sys.executable, [sys.executable, "-m", "servelab.calibration.server", "--port", port,
                                  "--default-script", script])
    os.waitpid(child, 0)
    print("launcher: server started", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
