"""Keep a real engine's stacks as a fixture: py-spy's JSON for every process of its tree, a few samples.

    python tests/stack_programs/capture_fixture.py PID OUT.json --engine llamacpp --version "xllamacpp 2026.10" \
        --state idle

The file holds py-spy's own output (one list of threads per process per sample) with the command lines
redacted, so tests replay the classifier on exactly what py-spy printed for the real engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from servelab.lifecycle.stacks.capture import dump_process, find_py_spy, process_tree, py_spy_version
from servelab.redaction import redact_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("pid", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--engine", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    binary = find_py_spy()
    if binary is None:
        print("py-spy is not installed", file=sys.stderr)
        return 1
    pids, commands, _ = process_tree(args.pid)
    processes = [{"pid": pid, "command": redact_command(commands.get(pid, [])), "samples": []} for pid in pids]
    t0 = time.monotonic()
    for index in range(args.samples):
        if index:
            time.sleep(args.interval)
        for proc in processes:
            dump = dump_process(binary, proc["pid"], 5.0)
            proc["samples"].append({"t_s": round(dump.t_s - t0, 3), "threads": json.loads(dump.raw) if dump.raw
                                    else None, "error": dump.error, "native": dump.native, "cpu_s": dump.cpu_s})
    args.out.write_text(json.dumps({"engine": args.engine, "version": args.version, "state": args.state,
                                    "tool": py_spy_version(binary), "processes": processes}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
