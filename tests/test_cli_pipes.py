"""Pipes and sockets that close under servelab: a reader of its output that goes away (`servelab … | head`) is a
quiet exit, and an engine that closes a connection servelab is still writing to is an error servelab handles,
never a SIGPIPE that kills it with every result in memory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SERVELAB = str(Path(sys.executable).with_name("servelab"))


def test_a_reader_that_went_away_is_a_quiet_exit_without_a_traceback():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (head) is gone before servelab prints its first line
    try:
        proc = subprocess.run([SERVELAB, "--help"], stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 1, proc.returncode  # click's answer to EPIPE; -13 would be death by SIGPIPE
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr, proc.stderr


def test_servelab_survives_writing_to_a_connection_its_peer_closed():
    # servelab's entry point runs a command that writes to a socket whose peer has closed, as a request body to an
    # engine that just died is written. With SIGPIPE at its default the write kills the process (-13).
    script = """
import socket, sys
import servelab.cli as cli

def command():
    ours, engine = socket.socketpair()
    engine.close()
    try:
        for _ in range(3):
            ours.sendall(b"x" * 65536)
    except BrokenPipeError:
        print("EPIPE seen, still running")
        return
    print("no error")

cli.app = command
cli.main()
print("main returned")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.splitlines() == ["EPIPE seen, still running", "main returned"]
