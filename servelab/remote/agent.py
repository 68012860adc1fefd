"""The far side's command line, `servelab remote …` (hidden from --help: only servelab calls it, through SSH).

    servelab remote hello                       the protocol, version and interpreter, as JSON
    servelab remote start [opts] -- ARGV…       start `servelab ARGV…` detached (worker.py); its job directory
    servelab remote follow DIR [--offset N]     stream DIR's events from byte N; stdin "stop" lines stop it
    servelab remote stop DIR                    ask the job to stop, as Ctrl-C would
    servelab remote pack DIR PATH               a tar of DIR/PATH on stdout, its manifest (SHA-256 of each file) last

A job lives in its own directory under the root (default ~/.servelab/remote, or --root): job.json (what to run,
the disconnect policy), events.jsonl (protocol.py), controller.alive (touched by a follower each time its
controller says it is there: its age is how long the controller has been gone), stop.request (a line per stop
asked), worker.pid.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Optional

import typer

from servelab import __version__
from servelab.remote.protocol import BEAT_S, PROTOCOL, encode

DEFAULT_ROOT = "~/.servelab/remote"
DISCONNECT_POLICIES = ("stop", "keep")
MANIFEST = "MANIFEST.json"
NO_JOB = 4  # follow's exit status when there is no such job directory
POLICY_HELP = "What the engine does when the controller is gone past the grace period."

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="The far side of --on ssh://… (called by servelab over SSH).")


def job_root(root: str | None) -> Path:
    return Path(os.path.expanduser(root or os.environ.get("SERVELAB_REMOTE_ROOT") or DEFAULT_ROOT))


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


@app.command()
def hello() -> None:
    """What this side speaks."""
    print(json.dumps({"protocol": PROTOCOL, "version": __version__, "python": sys.executable,
                      "host": socket.gethostname(), "pid": os.getpid()}))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def start(
    ctx: typer.Context,
    root: Annotated[Optional[str], typer.Option(help="Where job directories go.")] = None,
    grace: Annotated[float, typer.Option(help="Seconds without a controller before the policy applies.")] = 60.0,
    on_disconnect: Annotated[str, typer.Option(help=POLICY_HELP)] = "stop",
    columns: Annotated[Optional[int], typer.Option(help="The controller's terminal width.")] = None,
    stdin_json: Annotated[bool, typer.Option(
        help="Read {\"env\": {…}, \"files\": {name: text}} from stdin: environment variables (an API key) for "
             "the worker only, never in job.json, a command line or a log; files written into the job directory "
             "(an experiment file) before it starts.")] = False,
) -> None:
    """Start `servelab ARGV…` detached from this SSH session; print its job directory and pid as JSON."""
    argv = list(ctx.args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        _fail("nothing to run: servelab remote start [options] -- COMMAND ARGS…")
    if on_disconnect not in DISCONNECT_POLICIES:
        _fail(f"unknown --on-disconnect '{on_disconnect}': use stop or keep")
    env = dict(os.environ)
    given: dict = {}
    if stdin_json:
        try:
            given = json.loads(sys.stdin.read() or "{}")
        except ValueError:
            given = None
        if not isinstance(given, dict):
            _fail("--stdin-json: stdin is not a JSON object")
        env.update({str(k): str(v) for k, v in (given.get("env") or {}).items()})
    job_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
    job_dir = job_root(root) / job_id
    try:
        # this user's only: job.json holds the command line, engine flags after `--` included, an experiment
        # file the cell's environment, events.jsonl every line the command printed
        os.umask(0o077)
        job_dir.mkdir(parents=True, mode=0o700)
        job_dir = job_dir.resolve()  # as the worker's command line and every later call name it
        (job_dir / "job.json").write_text(json.dumps({
            "argv": argv, "grace_s": grace, "on_disconnect": on_disconnect, "columns": columns,
            "created": time.time(), "version": __version__, "protocol": PROTOCOL}))
        for name, text in (given.get("files") or {}).items():
            if "/" in name or name.startswith("."):
                _fail(f"--stdin-json: a file name must be a plain name, not {name!r}")
            (job_dir / name).write_text(str(text))
        (job_dir / "events.jsonl").touch()
        (job_dir / "controller.alive").touch()
    except OSError as exc:
        _fail(f"cannot create the job directory {job_dir} on {socket.gethostname()}: {exc.strerror or exc}")
    worker = subprocess.Popen([sys.executable, "-m", "servelab.remote_job", str(job_dir)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, close_fds=True, cwd=job_dir, env=env)
    try:
        (job_dir / "worker.pid").write_text(str(worker.pid))
    except OSError as exc:  # a disk that filled just now: a job nobody could follow is not left running
        worker.kill()
        _fail(f"cannot write {job_dir / 'worker.pid'} on {socket.gethostname()}: {exc.strerror or exc}")
    print(json.dumps({"dir": str(job_dir), "pid": worker.pid}), flush=True)


def worker_alive(job_dir: Path) -> bool:
    """Whether the job's worker process still runs (a reused pid running something else does not count)."""
    try:
        pid = int((job_dir / "worker.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return False
    # this job's worker: its directory is on its command line (another job's worker may have the pid after a reboot)
    return (b"servelab.remote_job" in cmdline and os.fsencode(job_dir.resolve()) in cmdline
            and stat.rsplit(")", 1)[-1].split()[0] != "Z")


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except FileNotFoundError:
        path.touch()


@app.command()
def follow(
    job_dir: Annotated[Path, typer.Argument(help="The job directory `start` printed.")],
    offset: Annotated[int, typer.Option(help="Byte offset in events.jsonl to resume from.")] = 0,
) -> None:
    """Stream the job's events from `offset` until its exit line; while the controller says it is there (its
    "alive" lines on stdin), keep controller.alive fresh."""
    events = job_dir / "events.jsonl"
    if not events.exists():
        _fail(f"no job at {job_dir} on {socket.gethostname()} (gone after a reboot, or cleaned up?)", NO_JOB)
    out = sys.stdout.buffer
    alive = job_dir / "controller.alive"
    _touch(alive)  # the controller has just connected
    try:  # the job's policy, for a controller that did not start it (`attach`); not a line of the file
        job = json.loads((job_dir / "job.json").read_text())
        out.write((encode("job", on_disconnect=job.get("on_disconnect"), grace_s=job.get("grace_s")) + "\n").encode())
        out.flush()
    except (OSError, ValueError):
        pass

    def relay_stdin() -> None:
        """The controller's lines: "alive" twice a second, "stop" per Ctrl-C. Only they keep the controller alive,
        not this follower's own life: over a link gone silent (a laptop asleep, a cable cut without a FIN) it
        goes on writing into the connection's buffers, long after anybody reads them. Each line touches the file:
        skipping some to save a syscall would double the gap a short grace has to absorb."""
        for line in sys.stdin:
            _touch(alive)
            if line.strip() == "stop":
                _request_stop(job_dir)
    threading.Thread(target=relay_stdin, daemon=True).start()

    last_sent = 0.0
    pending = b""
    with open(events, "rb") as f:
        f.seek(offset)
        while True:
            now = time.monotonic()
            chunk = f.read(1 << 16)
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    out.write(line + b"\n")
                    if line.startswith(b'{"k":"exit"'):
                        out.flush()
                        return
                out.flush()
                last_sent = now
                continue
            if not worker_alive(job_dir):
                rest = f.read()
                if rest:
                    pending += rest
                    continue
                out.write((encode("lost", why=_why_lost(job_dir)) + "\n").encode())
                out.flush()
                raise typer.Exit(1)
            if now - last_sent >= BEAT_S:
                out.write((encode("beat") + "\n").encode())
                out.flush()
                last_sent = now
            time.sleep(0.05)


def _why_lost(job_dir: Path) -> str:
    try:
        free = os.statvfs(job_dir)
        if free.f_bavail * free.f_frsize < 1 << 20:
            return (f"the remote servelab ended without its exit line, and the disk of {job_dir} is full "
                    f"({free.f_bavail * free.f_frsize:,} bytes free)")
    except OSError:
        pass
    return "the remote servelab ended without its exit line (killed, or the host lost power)"


@app.command()
def stop(job_dir: Annotated[Path, typer.Argument(help="The job directory.")]) -> None:
    """Ask the job to stop, as Ctrl-C would."""
    if not (job_dir / "job.json").exists():
        _fail(f"no job at {job_dir}")
    _request_stop(job_dir)


def _request_stop(job_dir: Path) -> None:
    """A line in stop.request, which the worker's watch turns into its Ctrl-C; where that line cannot be written
    (a full disk), the SIGINT itself, so that a stop is never lost."""
    try:
        with open(job_dir / "stop.request", "a") as f:
            f.write(f"{time.time()}\n")
    except OSError:
        if worker_alive(job_dir):
            os.kill(int((job_dir / "worker.pid").read_text()), signal.SIGINT)


def file_digest(path: Path) -> tuple[str, int]:
    """(SHA-256 hex, size) of a file, read in blocks: the manifest's entry, written here and checked there."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


@app.command()
def pack(
    job_dir: Annotated[Path, typer.Argument(help="The job directory.")],
    path: Annotated[str, typer.Argument(help="What to send, relative to the job directory.")],
) -> None:
    """A tar stream of DIR/PATH on stdout; its last member, MANIFEST.json, holds every file's size and SHA-256,
    so the receiving side knows the copy is whole before it uses any of it."""
    base = (job_dir / path).resolve()
    if not base.is_relative_to(job_dir.resolve()) or not base.exists():
        _fail(f"nothing at {job_dir / path}")
    manifest: dict[str, dict[str, object]] = {}
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for file in sorted(p for p in base.rglob("*") if p.is_file() and not p.is_symlink()):
            name = file.relative_to(base).as_posix()
            if name.startswith("servelab.db"):  # the far side's own store: the near side keeps its own
                continue
            digest, size = file_digest(file)  # read twice, never held whole: records can be large
            manifest[name] = {"size": size, "sha256": digest}
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = size, int(file.stat().st_mtime), 0o644
            with open(file, "rb") as data:
                tar.addfile(info, data)
        blob = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(blob), int(time.time())
        tar.addfile(info, io.BytesIO(blob))
