"""The far side's detached job process for `--on ssh://…`: `python -m servelab.remote_job JOB_DIR`.

It sits beside cli.py, above every package, because it runs servelab's command line: remote/worker.py does the
work (events, the controller watch) and is handed `cli.main` here, so the remote package never imports the CLI
that imports it.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from servelab import cli
from servelab.remote.worker import main

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main(Path(sys.argv[1]), cli.main))
