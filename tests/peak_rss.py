"""A command's own peak RSS, measured so that the test process's memory never counts.

`os.wait4` on a child the test forked reports a ru_maxrss that includes the memory the child had before it
exec'd: a fork (or vfork) starts as the parent, and the kernel folds that image's high-water mark into the
child's. A pytest process that has grown past the bound after a thousand tests would then fail every bound,
whatever the command did. So the command runs under a small launcher (a few MB): the launcher forks and execs it,
and the launcher's wait4 of it is the command's own peak.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_LAUNCHER = """
import os, sys
report, argv = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execv(argv[0], argv)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as fh:
    fh.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def run_measured(argv: list[str], timeout: float, stdout, stderr) -> tuple[int, float, float]:
    """Run `argv` (argv[0] an absolute path) with its output to the given files: (exit code as the command's,
    wall seconds, the command's own peak RSS in MB). Past `timeout` the whole group is killed and AssertionError
    raised."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "peak"
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(report), *argv], stdout=stdout, stderr=stderr,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"{' '.join(argv[:4])} ran past {timeout} s") from None
        wall = time.monotonic() - t0
        peak_kb = int(report.read_text()) if report.exists() else 0
    return code, wall, peak_kb / 1024
