"""What `up`, `bench`, `doctor` and `verify` do with `--on ssh://…` or `--on ray:GPU=8`: the same command, run by
servelab on the far side, its output and live view shown here, its results copied back into this side's run
directory and store. Which link carries it (an SSH connection, a Ray actor placed by resources) is `--on`'s
scheme's (placement.py); everything after that is the same controller.

The command line the far side runs is this one's, less the options that only make sense here (FORWARD_DROPS):
one code path for both, so a remote run cannot drift from a local one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from servelab import interrupts
from servelab.errors import UserError
from servelab.remote.connection import SshConnection
from servelab.remote.controller import RemoteJob, RemoteOptions, hello
from servelab.remote.events_view import replay
from servelab.remote.link import display_host
from servelab.remote.placement import RayPlacement, is_ray, parse_on
from servelab.remote.target import SshTarget

# Options of this side only, each with a value: where to run, how, and where results land here.
FORWARD_DROPS = ("--on", "--remote-python", "--remote-dir", "--on-disconnect", "--disconnect-grace", "--out",
                 "--store")
RESULTS = "results"  # the far side's --out, inside the job directory


def forwarded_argv(argv: Sequence[str], command: str, drops: Sequence[str] = FORWARD_DROPS,
                   valued: frozenset[str] = frozenset(), global_flags: Sequence[str] = ("--debug",)) -> list[str]:
    """`argv` (servelab's, without the program name) from `command` on, less the options in `drops` (as
    `--opt value` or `--opt=value`). `valued`: the command's options that take a value (the next word is that
    value whatever it looks like, `--prompt --on` included). Arguments after `--` go through untouched (an
    engine's own options); `global_flags` given before the command go first."""
    args = list(argv)
    try:
        start = args.index(command)
    except ValueError:
        raise UserError(f"cannot find the command `{command}` in the command line to run it remotely") from None
    out = [a for a in args[:start] if a in global_flags] + [command]
    i, rest = start + 1, None
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest = args[i:]
            break
        name, inline = arg.split("=", 1)[0], "=" in arg
        takes_value = arg.startswith("-") and (name in valued or name in drops) and not inline
        width = 2 if takes_value and i + 1 < len(args) else 1
        if not (arg.startswith("-") and name in drops):
            out.extend(args[i:i + width])
        i += width
    return out + (rest or [])


class _Printer:
    """The far side's output lines, here: stdout to stdout, stderr to stderr, in the order they were written."""

    def __init__(self, console: Console, err_console: Console, collect_stdout: bool = False):
        self.console, self.err_console = console, err_console
        self.collect = collect_stdout
        self.stdout: list[str] = []

    def line(self, event: dict[str, Any]) -> None:
        text = str(event.get("s", ""))
        if event["k"] == "out":
            if self.collect:
                self.stdout.append(text)
            else:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()


def ready_note(target: SshTarget | RayPlacement, url: str, node: str | None = None) -> str:
    """Where the engine's URL is, said once it is ready: it is the far host's, not this machine's (`node`: the Ray
    node's address, for a placement)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or 80
    host = parts.hostname or "127.0.0.1"
    if isinstance(target, RayPlacement):
        return (f"{url} is Ray node {node}'s address: the GPUs stay held while this runs; reach it from there "
                f"(--on ssh://{node}), or forward it here with `ssh -N -L {port}:{host}:{port} {node}`")
    ssh = f"ssh -N -L {port}:{host}:{port}" + (f" -p {target.port}" if target.port else "") + \
        f" {target.user + '@' if target.user else ''}{target.host}"
    return (f"{url} is {target.host}'s address: verify and bench it there with --on {target}, or forward it here "
            f"with `{ssh}`")


def _open(on: str) -> tuple[SshTarget | RayPlacement, Any]:
    target = parse_on(on)
    if isinstance(target, RayPlacement):
        from servelab.remote.ray_link import RayLink  # Ray is an extra: imported only for a placement

        return target, RayLink.open(target)
    return target, SshConnection.open(target)


def run_remote(on: str, argv: Sequence[str], options: RemoteOptions, console: Console, err_console: Console,
               *, view=None, collect_stdout: bool = False, fetch: tuple[str, Path] | None = None,
               env_secrets: dict[str, str] | None = None, files: dict[str, str] | None = None
               ) -> tuple[int, RemoteJob, list[str], list[str]]:
    """Run `servelab ARGV…` on the far side to its end: (exit status, job, its stdout lines when collected, the
    files copied back when `fetch` = (path there, directory here))."""
    target, opening = _open(on)
    printer = _Printer(console, err_console, collect_stdout)

    def note(text: str) -> None:
        err_console.print(f"remote: {text}", markup=False, highlight=False, soft_wrap=True)

    with opening as conn:
        if placed := getattr(conn, "placed_note", None):
            note(placed)
        hello(conn, options, note)
        job = RemoteJob.start(conn, options, argv, env_secrets, files)
        with job.interrupts_counted():  # from here a Ctrl-C is a stop the follow sends, never an escape
            note(f"running on {target} in {job.dir} (pid {job.pid})")

            def on_event(event: dict[str, Any]) -> None:
                if event["k"] in ("out", "err"):
                    printer.line(event)
                elif event["k"] == "launch" and view is not None:
                    engine = replay(event, view, display_host(conn))
                    if engine is not None:
                        note(ready_note(target, engine.url, display_host(conn)))

            code = job.follow(on_event, note)
        if code == 130 and interrupts.received() is not None:
            code = interrupts.exit_code()  # SIGTERM or SIGHUP here: its own status, as a local run says it
        copied: list[str] = []
        if fetch is not None:
            copied = job.fetch(*fetch, on_note=note)
        return code, job, printer.stdout, copied


def remote_json(on: str, argv: Sequence[str], options: RemoteOptions, console: Console, err_console: Console,
                env_secrets: dict[str, str] | None = None) -> tuple[int, Any]:
    """A command run there with --json: (exit status, its JSON document)."""
    args = list(argv)
    if "--json" not in args:
        cut = args.index("--") if "--" in args else len(args)
        args.insert(cut, "--json")
    code, _job, lines, _ = run_remote(on, args, options, console, err_console, collect_stdout=True,
                                      env_secrets=env_secrets)
    text = "\n".join(lines).strip()
    if not text:
        return code, None
    try:
        return code, json.loads(text)
    except ValueError:
        raise UserError(f"the remote servelab printed something that is not its JSON result: {text[:200]!r}") \
            from None


def remote_up(on: str, argv: Sequence[str], options: RemoteOptions, console: Console, err_console: Console,
              view) -> int:
    """`servelab up` there, its start-up drawn here by `view`; Ctrl-C here stops the engine there. The exit
    status is the far side's."""
    code, _job, _lines, _ = run_remote(on, argv, options, console, err_console, view=view)
    return code


def remote_bench(on: str, argv: Sequence[str], options: RemoteOptions, console: Console, err_console: Console,
                 out: Path, store_path: Path, env_secrets: dict[str, str] | None = None) -> tuple[int, list[Path]]:
    """`servelab bench` there (the client next to the server), its results copied back into `out` and kept in the
    local store: (exit status, the run directories copied)."""
    from servelab.remote.imports import store_copied_runs

    args = list(argv)
    cut = args.index("--") if "--" in args else len(args)
    args[cut:cut] = ["--out", RESULTS]
    code, job, _lines, copied = run_remote(on, args, options, console, err_console, fetch=(RESULTS, out),
                                           env_secrets=env_secrets)
    runs = store_copied_runs(out, copied, store_path, ran_on=str(parse_on(on)), remote_dir=job.dir)
    for run in runs:
        err_console.print(f"remote: copied {run.name} back to {run} and stored it in {store_path}", markup=False,
                          highlight=False, soft_wrap=True)
    return code, runs


def attach(on: str, job_dir: str, options: RemoteOptions, console: Console, err_console: Console, view) -> int:
    """Follow a job already running there, from its first event."""
    if is_ray(on):
        raise UserError("attach follows a job over ssh:// only: a Ray placement names resources, not the node "
                        "the job is on", hint="attach to that node: servelab attach ssh://NODE JOB_DIR (the "
                                              "note `placed on Ray node …` named it)")
    target, opening = _open(on)
    printer = _Printer(console, err_console)

    def note(text: str) -> None:
        err_console.print(f"remote: {text}", markup=False, highlight=False, soft_wrap=True)

    with opening as conn:
        hello(conn, options, note)
        job = RemoteJob(conn=conn, options=options, dir=job_dir, pid=0)

        def on_event(event: dict[str, Any]) -> None:
            if event["k"] in ("out", "err"):
                printer.line(event)
            elif event["k"] == "launch":
                replay(event, view, target.host)

        return job.follow(on_event, note)
