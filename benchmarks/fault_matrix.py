"""The fault matrix (issue #11): every fault of the issue's list, tried against servelab as a user would.

    .venv/bin/python benchmarks/fault_matrix.py [--only SUBSTRING ...] [--out benchmarks/results/fault_matrix.json]

Each case runs the CLI in subprocesses (`python -m servelab.cli ...`, in a directory of its own) against a local
fault server: the calibration server with a scripted fault (`servelab.calibration`), a small aiohttp fake written
here where a fault needs a shape the calibration server does not script (gzip bombs, keep-alive pings forever, a
llama.cpp whose token count jumps to 10^18, a server that echoes the key, hostile model ids and answers), Python's
own `http.server` (501 to every POST), launchers that double-fork a server, the replay engine for launches, and
(issue 27) raw asyncio servers from tests/faulty_server.py for what no HTTP library would send: a 256 MB header
line, two million headers, a server that accepts and never answers, Basic auth required on every request, escape
bytes in answers; those cases also bound peak RSS (RSS_BOUND_27_MB) besides their wall clock.
Every case has a wall-clock bound; a case that reaches it is killed (its whole session) and counted as a hang.

Printed: one row per fault (the issue's item, what was tried, survived or not, exit code, records lost, hung,
secrets found, what happened) and a summary line:

    faults tried N, survived N, records lost 0, hangs 0, secrets found 0, live XSS elements 0

- records lost: the requests the server says it received (the calibration server's /calibration/summary, the
  fake's own count, http.server's request log) minus the records servelab kept (records.jsonl, or the store where
  the disk was full), per case, never below 0;
- secrets found: places (files the case wrote, and its terminal output) that hold the marker. The marker is
  `sk-servelab-MARKER-1234` where it goes in as an API key, and `servelab-MARKER-1234` (no key shape) in other
  flags, environment variables and URL credentials, so that only the flag's or variable's name can hide it;
- live XSS elements: a run whose model id, answers, cell names and error messages carry `<img onerror>`,
  `<script>` and `<svg onload>` payloads is written into report.html and loaded in headless Chromium
  (--dump-dom); injected elements that are live in the DOM, and payloads that ran, are counted (without Chromium,
  the static HTML is parsed instead and the JSON says so).

A case survives when servelab neither crashed (exit 3, a traceback, "internal error") nor hung, lost no record,
leaked no secret, and did what the issue's "Done when" asks of that fault (its check is in the case). Writes
every case, with its commands' wall time and peak memory, to benchmarks/results/fault_matrix.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html.parser
import json
import logging
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fault_matrix.json"
PY = sys.executable
SERVELAB = [PY, "-m", "servelab.cli"]
NEEDLE = "MARKER-1234"  # grepped for: both markers contain it
MARK = f"sk-servelab-{NEEDLE}"  # an API key (key-shaped)
PLAIN = f"servelab-{NEEDLE}"  # a secret whose shape gives nothing away: only its flag's or variable's name can
AS_LIMIT = 4 << 30  # every servelab process runs under this address-space limit: a regression fails the case
BOMB_MIB = 512  # the gzip bomb inflates to this much
PEAK_BOUND_MB = 400  # a client that held the bomb (or a list sized by 10^18) would pass this
EVIL_MODEL = "m\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.invalid\x07link\x1b]8;;\x07[bold]B[/bold]\r\u202e"
RAW_CONTROLS = ("\x1b]", "\x1b[2J", "\x07", "\r", "\u202e")
FIRE = "document.body.appendChild(document.createElement('xss-fired'))"
XSS = {"img": f'<img src=x onerror="{FIRE}">', "script": f"<script>{FIRE}</script>",
       "svg": f'"><svg onload="{FIRE}">'}

LAUNCHER = [sys.executable, "-m", "servelab.calibration.launcher"]  # a double-forking launcher


# ---------------------------------------------------------------------------------------------------------------
# Processes: every servelab command in its own session, bounded in time and memory
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Ran:
    """One finished command."""

    argv: list[str]
    rc: int | None
    out: str
    err: str
    wall_s: float
    peak_mb: float | None  # the process's peak RSS (its own, from wait4)
    hung: bool

    @property
    def text(self) -> str:
        return self.out + self.err

    def crashed(self) -> str | None:
        """Why this looks like a crash (exit 3, a traceback, 'internal error'), or None."""
        if self.rc == 3:
            return "exit 3"
        if "Traceback (most recent call last)" in self.text:
            return "a traceback"
        if "internal error" in self.text:
            return "'internal error'"
        if self.rc is not None and self.rc < 0 and not self.hung:
            return f"killed by {signal.Signals(-self.rc).name}"
        return None


class Spawned:
    """A command running in its own session, its output going to files (read while it runs)."""

    def __init__(self, ctx: Ctx, argv: list[str], env: dict[str, str] | None = None,
                 preexec: Callable[[], None] | None = None, limit_memory: bool = True):
        self.ctx = ctx
        self.argv = argv
        n = len(ctx.commands)
        self.out_path, self.err_path = ctx.term / f"{n}.out", ctx.term / f"{n}.err"
        base = {k: v for k, v in os.environ.items() if not k.startswith("SERVELAB_")}
        base.update({"XDG_CACHE_HOME": str(ctx.dir / ".cache"), "COLUMNS": "120", "PYTHONUNBUFFERED": "1"})
        base["PYTHONPATH"] = str(ROOT)

        def before() -> None:
            if limit_memory:
                resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
            if preexec is not None:
                preexec()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=ctx.dir,
                                         env={**base, **(env or {})}, start_new_session=True, preexec_fn=before)
        self.t0 = time.monotonic()
        self.ran: Ran | None = None
        ctx.spawned.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") + self.err_path.read_text(errors="replace")

    def wait_output(self, needle: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + min(timeout_s, self.ctx.remaining())
        while time.monotonic() < deadline:
            if needle in self.output():
                return True
            if self.proc.poll() is not None:
                return needle in self.output()
            time.sleep(0.05)
        return False

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.returncode is None:
            os.kill(self.proc.pid, sig)

    def finish(self, timeout_s: float | None = None) -> Ran:
        """Wait for the command within `timeout_s` (default: what is left of the case's bound); past it, kill its
        session and count a hang."""
        if self.ran is not None:
            return self.ran
        deadline = time.monotonic() + min(timeout_s if timeout_s is not None else 1e9, self.ctx.remaining())
        hung, status, usage = False, None, None
        while True:
            if self.proc.returncode is not None:  # reaped elsewhere (should not happen)
                status = None
                break
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() >= deadline:
                hung = True
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(self.proc.pid, 0)
                break
            time.sleep(0.02)
        rc = os.waitstatus_to_exitcode(status) if status is not None else self.proc.returncode
        self.proc.returncode = rc
        wall = time.monotonic() - self.t0
        peak = usage.ru_maxrss / 1024 if usage is not None else None
        out, err = self.out_path.read_text(errors="replace"), self.err_path.read_text(errors="replace")
        self.ran = Ran(self.argv, rc, out, err, wall, peak, hung)
        self.ctx.commands.append(self.ran)
        if hung:
            self.ctx.hung = True
        return self.ran

    def cleanup(self) -> None:
        """Whatever is left of its session goes (after the case)."""
        if self.proc.returncode is None:
            self.finish(timeout_s=0.1)
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------------------------
# A case's context: its directories, bound, commands and servers
# ---------------------------------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, root: Path, slug: str, bound_s: float):
        base = root / slug
        self.dir = base / "out"  # what servelab writes (grepped for secrets)
        self.inp = base / "in"  # what the case gives it (not grepped: it holds the secrets on purpose)
        self.term = base / "term"  # captured terminal output (grepped as the terminal)
        for d in (self.dir, self.inp, self.term):
            d.mkdir(parents=True)
        self.bound_s = bound_s
        self.deadline = time.monotonic() + bound_s
        self.hung = False
        self.commands: list[Ran] = []
        self.spawned: list[Spawned] = []
        self.stack = contextlib.ExitStack()

    def remaining(self) -> float:
        return max(0.2, self.deadline - time.monotonic())

    def spawn(self, *args: str, **kw: Any) -> Spawned:
        return Spawned(self, [*SERVELAB, *args], **kw)

    def cli(self, *args: str, timeout_s: float | None = None, **kw: Any) -> Ran:
        return self.spawn(*args, **kw).finish(timeout_s)

    def raw(self, argv: list[str], timeout_s: float | None = None, **kw: Any) -> Ran:
        """A command that is not servelab itself (e.g. servelab inside `unshare`)."""
        return Spawned(self, argv, **kw).finish(timeout_s)

    def server(self, cm: contextlib.AbstractContextManager) -> Any:
        return self.stack.enter_context(cm)

    def secrets(self) -> list[str]:
        """Places holding the marker: files the case wrote, and the terminal output of its commands."""
        found = [str(p.relative_to(self.dir)) for p in self.dir.rglob("*")
                 if p.is_file() and not p.is_symlink() and NEEDLE.encode() in p.read_bytes()]
        found += [f"terminal of `{shown(r.argv)}`" for r in self.commands if NEEDLE in r.text]
        return found

    def close(self) -> None:
        for s in self.spawned:
            s.cleanup()
        self.stack.close()


def shown(argv: list[str]) -> str:
    """A command as the table shows it: servelab's own prefix and long paths shortened."""
    words = []
    for w in argv:
        if w in (PY, "-m", "servelab.cli"):
            continue
        w = w.replace(str(ROOT) + "/", "")
        if w.startswith("/tmp/") and len(w) > 30:
            w = "…/" + Path(w).name
        for secret in (MARK, PLAIN):
            w = w.replace(secret, "<marker>")
        words.append(w if len(w) <= 60 else w[:57] + "…")
    return " ".join(shlex.quote(w) if w and " " in w else w for w in words)


# ---------------------------------------------------------------------------------------------------------------
# Servers and what they received
# ---------------------------------------------------------------------------------------------------------------

def calibration(**script: Any):
    from servelab.calibration import Script, start_calibration_server

    return start_calibration_server(Script(**script))


def received(url: str) -> int:
    """Requests the calibration server received (its own count)."""
    with urllib.request.urlopen(f"{url}/calibration/summary", timeout=5) as r:
        return json.loads(r.read())["requests"]


def progress(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{url}/calibration/summary", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return {"requests": 0, "tokens": 0}


def wait_streaming(url: str, spawned: Spawned, requests: int, tokens: int, timeout_s: float = 40) -> bool:
    """Until the server has `requests` requests and `tokens` tokens out (the server is the judge)."""
    deadline = time.monotonic() + min(timeout_s, spawned.ctx.remaining())
    while time.monotonic() < deadline and spawned.proc.poll() is None:
        seen = progress(url)
        if seen["requests"] >= requests and seen["tokens"] >= tokens:
            return True
        time.sleep(0.05)
    return False


def records(root: Path) -> list[dict[str, Any]]:
    """Every record servelab kept under `root` (every records file; a line that is not a record is none)."""
    from servelab.store.rundir import iter_records

    kept = []
    for path in [*root.rglob("records.jsonl.gz"), *root.rglob("records.jsonl")]:
        kept.extend(json.loads(r.model_dump_json()) for r in iter_records(path))
    return kept


def lost(sent: int, kept: list[dict[str, Any]] | int) -> int:
    return max(0, sent - (kept if isinstance(kept, int) else len(kept)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def wait_file(path: Path, timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    return None


class Fake:
    """A small OpenAI-shaped aiohttp server in a background thread, for faults the calibration server does not
    script. `chat` is the handler of /v1/chat/completions; `received` counts the requests it got."""

    def __init__(self, chat: Callable | None = None, model: str = "fake", extra_routes: dict[str, Callable] | None
                 = None, guard: Callable | None = None):
        from aiohttp import web

        self.received = 0
        self.paths: list[tuple[str, bool]] = []
        self.model = model
        fake = self

        @web.middleware
        async def count(request: web.Request, handler: Callable) -> web.StreamResponse:
            if request.method == "POST" and request.path.startswith("/v1/"):
                fake.received += 1
            if guard is not None:
                denied = guard(request)
                fake.paths.append((request.path, denied is None))
                if denied is not None:
                    return denied
            return await handler(request)

        async def models(request: web.Request) -> web.StreamResponse:
            return web.json_response({"object": "list", "data": [{"id": fake.model, "object": "model",
                                                                  "owned_by": "fake"}]})

        async def health(request: web.Request) -> web.StreamResponse:
            return web.json_response({"status": "ok"})

        self.app = web.Application(middlewares=[count])
        self.app.router.add_get("/v1/models", models)
        self.app.router.add_get("/health", health)
        self.app.router.add_post("/v1/chat/completions", chat or self.stream_words)
        for path, handler in (extra_routes or {}).items():
            self.app.router.add_route("*", path, handler)

    @staticmethod
    def chunk(content: str | None, finish: str | None = None, **extra: Any) -> bytes:
        delta = {} if content is None else {"content": content}
        body = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def stream_words(self, request: Any, words: list[str] | None = None) -> Any:
        """A well-formed stream: the words, a finish chunk, usage, [DONE] (non-streamed: one completion)."""
        from aiohttp import web

        body = await request.json()
        words = words or [f" w{i}" for i in range(int(body.get("max_tokens") or 4))]
        if not body.get("stream"):
            return web.json_response({
                "id": "x", "object": "chat.completion", "created": 0, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(words)},
                             "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in words:
            await resp.write(self.chunk(word))
        usage = {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}
        await resp.write(self.chunk(None, "length") + b"data: " + json.dumps({"choices": [], "usage": usage})
                         .encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    def __enter__(self) -> Fake:
        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = web.AppRunner(self.app, shutdown_timeout=0.2, access_log=None)

        async def start() -> int:
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)}"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            await self.runner.cleanup()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


_BOMB: bytes | None = None


def gzip_bomb() -> bytes:
    """BOMB_MIB MiB of zeros in about BOMB_MIB KB."""
    global _BOMB
    if _BOMB is None:
        enc = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = bytes(1 << 20)
        _BOMB = b"".join(enc.compress(block) for _ in range(BOMB_MIB)) + enc.flush()
    return _BOMB


@contextlib.contextmanager
def http_server_501(ctx: Ctx) -> Iterator[tuple[str, Path]]:
    """`python -m http.server`: 501 Unsupported method to every POST. Yields its URL and its request log."""
    port = free_port()
    www = ctx.inp / "www"
    www.mkdir()
    log = ctx.inp / "http.server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=www,
                                stdout=subprocess.DEVNULL, stderr=fh)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not listening(port):
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(10)


def experiment(ctx: Ctx, doc: dict[str, Any], name: str = "exp.yaml") -> Path:
    path = ctx.inp / name
    # Faults, not a busy machine: a contended trial is only left out (docs/metrics.md#contended-trials).
    doc = {"contention": {"reruns": 0}, **doc}
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def bench_args(url: str, ctx: Ctx, *more: str, model: str | None = "calibration") -> list[str]:
    args = ["bench", url, "--warmup", "0", "--tokenizer", "none", "--out", str(ctx.dir / "runs")]
    return args + (["--model", model] if model else []) + list(more)


def only(*checks: str) -> list[str]:
    """verify's --only, once per check id."""
    return [w for c in checks for w in ("--only", c)]


def printable(text: str) -> str:
    """What a server or servelab said, safe for the table: controls (a bomb's NUL bytes) shown as one dot a run."""
    out, dotted = [], False
    for c in text:
        if c.isprintable():
            out.append(c)
            dotted = False
        elif not dotted:
            out.append("·")
            dotted = True
    return "".join(out)


def one_line(ran: Ran) -> str:
    return printable(" ".join(ran.err.split()))[:200]


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    ok: bool
    outcome: str
    rc: int | None = None
    lost: int | None = None
    xss: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    item: str  # the item number, or "—" for a fault the first pass already survived
    fault: str
    fn: Callable[[Ctx], Verdict]
    bound_s: float


CASES: list[Case] = []


def case(item: str, fault: str, bound_s: float = 40.0):
    def register(fn: Callable[[Ctx], Verdict]) -> Callable[[Ctx], Verdict]:
        CASES.append(Case(item, fault, fn, bound_s))
        return fn
    return register


def crash_or(ran: Ran, *checks: tuple[bool, str]) -> tuple[bool, str]:
    """ok and the outcome text: the first failed check's words, or ''."""
    why = ran.crashed()
    if why:
        return False, f"crashed ({why}): {one_line(ran)[:120]}"
    for good, words in checks:
        if not good:
            return False, words
    return True, ""


def bench_fault(ctx: Ctx, script: dict[str, Any], *more: str, expect_rc: tuple[int, ...] = (1,),
                check: Callable[[list[dict[str, Any]], Ran], tuple[bool, str]] | None = None,
                describe: Callable[[list[dict[str, Any]], Ran], str] | None = None) -> Verdict:
    """bench --out against a calibration server whose every response has the fault; compare what it received with
    what was recorded."""
    cal = ctx.server(calibration(**{"ttft_ms": 2, "itl_ms": 2, "output_tokens": 4, **script}))
    ran = ctx.cli(*bench_args(cal.url, ctx, *(more or ("--mode", "concurrency", "--concurrency", "4",
                                                       "--requests", "12"))))
    sent, kept = received(cal.url), records(ctx.dir)
    kinds: dict[str, int] = {}
    for r in kept:
        kinds[r.get("error_kind") or "ok"] = kinds.get(r.get("error_kind") or "ok", 0) + 1
    ok, why = crash_or(ran, (ran.rc in expect_rc, f"exit {ran.rc}, expected {expect_rc}"),
                       *( [check(kept, ran)] if check else []))
    words = describe(kept, ran) if describe else ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return Verdict(ok, why or f"{len(kept)}/{sent} recorded: {words}", ran.rc, lost(sent, kept))


def kinds_are(*allowed: str) -> Callable[[list[dict[str, Any]], Ran], tuple[bool, str]]:
    def check(kept: list[dict[str, Any]], ran: Ran) -> tuple[bool, str]:
        got = {r.get("error_kind") or "ok" for r in kept}
        return bool(kept) and got <= set(allowed), f"error kinds {sorted(got)}, expected {list(allowed)}"
    return check


# ---- item 1: one malformed chunk costs one request -------------------------------------------------------------

@case("1", 'chunk {"choices":[1]} in every stream, c16 x 64')
def malformed_choices_int(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"raw_frame": 'data: {"choices":[1]}\n\n', "raw_frame_after_events": 2},
                       "--mode", "concurrency", "--concurrency", "16", "--requests", "64", check=kinds_are("parse"))


@case("1", 'chunk "abc" (JSON, not an object) in every stream')
def malformed_string(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"raw_frame": 'data: "abc"\n\n', "raw_frame_after_events": 2}, check=kinds_are("parse"))


@case("1", 'chunk {"a":1} (no chunk at all) in every stream')
def malformed_object(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"raw_frame": 'data: {"a":1}\n\n', "raw_frame_after_events": 2}, expect_rc=(0,),
                       check=kinds_are("ok"))


@case("—", "truncated JSON event mid-stream")
def malformed_json(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"invalid_json_after_events": 2}, check=kinds_are("parse"))


# ---- item 2 / 9: secrets of a launched cell ----------------------------------------------------------------------

def secret_cell(flags: list[str], env: dict[str, str]) -> dict[str, Any]:
    """A launched cell (the calibration server through sh) whose command line carries `flags` (ignored by the
    server: they are sh's positional parameters) and whose environment carries `env`."""
    return {"name": "launched", "engine": "command", "model": "calibration",
            "extra_args": ["sh", "-c", f'exec {PY} -m servelab.calibration.server --port "$0"', "{port}", *flags],
            "env": env, "options": {"probe_path": "/health"}}


def secrets_run(ctx: Ctx, cell: dict[str, Any], *follow: list[str]) -> Verdict:
    doc = {"name": "secrets", "bench": {"single_requests": 2, "max_tokens": 4, "warmup": 0, "sweep": False},
           "verify": {"enabled": False}, "cells": [cell]}
    ran = ctx.cli("run", str(experiment(ctx, doc)), "--out", str(ctx.dir / "runs"), timeout_s=60)
    kept = records(ctx.dir)
    summaries = list(ctx.dir.rglob("summary.json"))
    prov = json.loads(summaries[0].read_text()).get("provenance", {}) if summaries else {}
    later = [ctx.cli(*args, "--out", str(ctx.dir / "runs")) for args in follow]
    ok, why = crash_or(ran, (ran.rc == 0, f"run exit {ran.rc}: {one_line(ran)[:120]}"),
                       (len(kept) == 2, f"{len(kept)} records, expected 2"),
                       (bool(prov.get("command")), "no command in provenance"),
                       *[(r.rc == 0, f"`{shown(r.argv)[:40]}` exit {r.rc}") for r in later])
    hidden = sum(1 for w in prov.get("command", []) if "***" in w) + \
        sum(1 for v in prov.get("env", {}).values() if "***" in str(v))
    return Verdict(ok, why or f"cell measured, {hidden} values shown as *** in provenance"
                   + (f"; then {', '.join(a[0] for a in follow)}" if follow else ""), ran.rc, 0)


@case("2", "launched cell: --api-key, HF_TOKEN, OPENAI_API_KEY, DB_PASSWD; read back", 90)
def secrets_cell_json(ctx: Ctx) -> Verdict:
    cell = secret_cell(["--api-key", PLAIN], {"HF_TOKEN": PLAIN, "OPENAI_API_KEY": MARK, "DB_PASSWD": PLAIN})
    verdict = secrets_run(ctx, cell)
    ids = [p.parent.relative_to(ctx.dir / "runs").as_posix() for p in ctx.dir.rglob("cell.json")]
    run_id = None
    with contextlib.suppress(Exception):
        from servelab.store.db import Store
        from servelab.store.runs import list_runs

        with Store.open(ctx.dir / "runs" / "servelab.db", readonly=True) as db:
            run_id = list_runs(db)[0].run_id
    if run_id is None:
        return Verdict(False, f"no stored run to read back ({ids})", verdict.rc, verdict.lost)
    later = [ctx.cli("runs", "--out", str(ctx.dir / "runs")),
             ctx.cli("show", run_id, "--out", str(ctx.dir / "runs")),
             ctx.cli("export", run_id, "--format", "json", "--to", str(ctx.dir / "export"), "--out",
                     str(ctx.dir / "runs")),
             ctx.cli("report", run_id, "--out", str(ctx.dir / "runs"), "-o", str(ctx.dir / "report.html"))]
    bad = [f"`{shown(r.argv)[:30]}` exit {r.rc}" for r in later if r.rc != 0 or r.crashed()]
    if bad:
        return Verdict(False, "; ".join(bad), verdict.rc, verdict.lost)
    return Verdict(verdict.ok, verdict.outcome + "; runs, show, export, report read it back", verdict.rc,
                   verdict.lost)


@case("9", "launched cell: --admin-api-key, --api-keys, -k, --auth…, GH_PAT, proxy creds", 60)
def secrets_redaction_gaps(ctx: Ctx) -> Verdict:
    cell = secret_cell(["--admin-api-key", PLAIN, "--api-keys", PLAIN, "--openai-api-key", PLAIN, "-k", PLAIN,
                        "--key", PLAIN, "--bearer-token", PLAIN, "--auth", PLAIN],
                       {"MY_PAT": PLAIN, "GH_PAT": PLAIN, "HTTP_PROXY": f"http://user:{PLAIN}@proxy.invalid:3128"})
    return secrets_run(ctx, cell)


# ---- item 3: compressed bodies inflate within bounds -------------------------------------------------------------

def bomb_case(ctx: Ctx, status: int) -> Verdict:
    from aiohttp import web

    bomb = gzip_bomb()

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        ctype = "text/event-stream" if status == 200 else "application/json"
        return web.Response(status=status, body=bomb, headers={"Content-Type": ctype, "Content-Encoding": "gzip"})
    fake = ctx.server(Fake(chat))
    ran = ctx.cli(*bench_args(fake.url, ctx, "--requests", "2", "--max-tokens", "4", model="fake"))
    kept = records(ctx.dir)
    peak = ran.peak_mb or 0
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}, expected 1"),
                       (peak < PEAK_BOUND_MB, f"peak RSS {peak:.0f} MB for a {len(bomb) >> 10} KB body"),
                       (all(not r.get("ok") for r in kept), "a bomb was counted ok"))
    detail = (kept[0].get("error_detail") or "")[:60] if kept else ""
    return Verdict(ok, why or f"{len(kept)} failed ({kept[0].get('error_kind') if kept else '-'}: {detail}), "
                   f"peak RSS {peak:.0f} MB for {BOMB_MIB} MiB in {len(bomb) >> 10} KB", ran.rc,
                   lost(fake.received, kept), extra={"peak_mb": peak})


@case("3", f"gzip bomb ({BOMB_MIB} MiB of zeros) as a 200 event stream")
def gzip_bomb_200(ctx: Ctx) -> Verdict:
    return bomb_case(ctx, 200)


@case("3", f"gzip bomb ({BOMB_MIB} MiB of zeros) as a 500 error body")
def gzip_bomb_500(ctx: Ctx) -> Verdict:
    return bomb_case(ctx, 500)


@case("—", "one 1 MiB SSE event (past aiohttp's 64 KiB line limit)")
def big_event(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"big_event_bytes": 1 << 20}, "--requests", "3", expect_rc=(0,), check=kinds_are("ok"))


# ---- item 4: a server's token count sizes nothing ----------------------------------------------------------------

@case("4", "usage.completion_tokens = 10^18")
def usage_10_18(ctx: Ctx) -> Verdict:
    frame = 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1000000000000000000}}\n\n'
    return bench_fault(ctx, {"raw_frame": frame, "raw_frame_after_events": 99}, check=kinds_are("parse"))


@case("4", "llama.cpp timings.predicted_n jumps to 10^18")
def timings_10_18(ctx: Ctx) -> Verdict:
    from aiohttp import web

    async def props(request: web.Request) -> web.StreamResponse:
        return web.json_response({"default_generation_settings": {"n_ctx": 2048}, "total_slots": 4,
                                  "build_info": "b0-fake"})

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(4):
            await resp.write(Fake.chunk(f" w{i}", timings={"predicted_n": i + 1 if i == 0 else 10**18}))
        await resp.write(Fake.chunk(None, "length") + b"data: [DONE]\n\n")
        return resp
    fake = ctx.server(Fake(chat, extra_routes={"/props": props}))
    ran = ctx.cli(*bench_args(fake.url, ctx, "--mode", "concurrency", "--concurrency", "2", "--requests", "6",
                              model="fake"))
    kept = records(ctx.dir)
    peak = ran.peak_mb or 0
    ok, why = crash_or(ran, (ran.rc in (0, 1), f"exit {ran.rc}"), (peak < PEAK_BOUND_MB, f"peak RSS {peak:.0f} MB"),
                       kinds_are("parse")(kept, ran))
    return Verdict(ok, why or f"{len(kept)}/{fake.received} recorded as parse failures, peak RSS {peak:.0f} MB",
                   ran.rc, lost(fake.received, kept))


# ---- item 5 (and 7): signals ------------------------------------------------------------------------------------

SLOW = {"ttft_ms": 5, "itl_ms": 200, "output_tokens": 50}  # 10 s streams: requests are in flight when signalled


def signal_bench(ctx: Ctx, sig: signal.Signals, code: int) -> Verdict:
    cal = ctx.server(calibration(**SLOW))
    run = ctx.spawn(*bench_args(cal.url, ctx, "--mode", "concurrency", "--concurrency", "3", "--duration", "60"))
    if not wait_streaming(cal.url, run, 3, 9):
        ran = run.finish(1)
        return Verdict(False, f"never streaming (exit {ran.rc}): {one_line(ran)[:100]}", ran.rc)
    run.signal(sig)
    ran = run.finish(30)
    sent, kept = received(cal.url), records(ctx.dir)
    summaries = list(ctx.dir.rglob("summary.json"))
    interrupted = bool(summaries) and json.loads(summaries[0].read_text()).get("interrupted") is True
    ok, why = crash_or(ran, (ran.rc == code, f"exit {ran.rc}, expected {code}"),
                       (interrupted, "no summary saying interrupted"),
                       (all(r.get("error_kind") == "cancelled" for r in kept), "records not cancelled"),
                       (not list(ctx.dir.rglob("*.tmp")), ".tmp left behind"))
    return Verdict(ok, why or f"{len(kept)}/{sent} in flight recorded as cancelled, summary interrupted, "
                   f"exit {ran.rc} after {ran.wall_s:.1f} s", ran.rc, lost(sent, kept))


@case("5", "SIGTERM to bench mid-level (3 streams in flight)")
def sigterm_bench(ctx: Ctx) -> Verdict:
    return signal_bench(ctx, signal.SIGTERM, 143)


@case("5", "SIGHUP to bench mid-level")
def sighup_bench(ctx: Ctx) -> Verdict:
    return signal_bench(ctx, signal.SIGHUP, 129)


@case("—", "SIGINT (Ctrl-C) to bench mid-level")
def sigint_bench(ctx: Ctx) -> Verdict:
    return signal_bench(ctx, signal.SIGINT, 130)


@case("5", "SIGTERM to run mid-bench; engine = launcher that double-forks (setsid)", 60)
def sigterm_run(ctx: Ctx) -> Verdict:
    from servelab.calibration import Script

    pidfile, port = ctx.inp / "server.pid", free_port()
    doc = {"name": "sigterm", "verify": {"enabled": False},
           "bench": {"single_requests": 4, "warmup": 0, "sweep": False, "max_tokens": 50},
           "cells": [{"name": "forking", "engine": "command", "model": "calibration", "port": port,
                      "extra_args": [*LAUNCHER, "{port}", "setsid", str(pidfile),
                                     Script(**SLOW).model_dump_json()]}]}
    run = ctx.spawn("run", str(experiment(ctx, doc)), "--out", str(ctx.dir / "runs"))
    pid = wait_file(pidfile, 30)
    if pid is None:
        ran = run.finish(1)
        return Verdict(False, f"the engine never started: {one_line(ran)[:100]}", ran.rc)
    server = int(pid)
    try:
        url = f"http://127.0.0.1:{port}"
        if not wait_streaming(url, run, 1, 3):
            ran = run.finish(1)
            return Verdict(False, f"never streaming (exit {ran.rc})", ran.rc)
        sent = progress(url)["requests"]  # single-stream, 10 s per request: no other one starts meanwhile
        run.signal(signal.SIGTERM)
        ran = run.finish(40)
        kept = records(ctx.dir)
        stopped = gone(server, 10) and not listening(port)
        ok, why = crash_or(ran, (ran.rc == 143, f"exit {ran.rc}, expected 143"),
                           (stopped, "the double-forked server outlived run"),
                           (bool(kept) and kept[-1].get("error_kind") == "cancelled", "in-flight not cancelled"))
        return Verdict(ok, why or f"{len(kept)}/{sent} recorded (the last cancelled), engine tree gone, exit 143",
                       ran.rc, lost(sent, kept))
    finally:
        with contextlib.suppress(OSError):
            os.kill(server, signal.SIGKILL)


@case("—", "SIGINT to run mid-cell, then run it again (resume)", 60)
def sigint_run_resume(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=5, itl_ms=50, output_tokens=20))  # 1 s requests
    doc = {"name": "resume", "verify": {"enabled": False},
           "bench": {"single_requests": 3, "warmup": 0, "sweep": False, "max_tokens": 20},
           "cells": [{"name": "a", "url": cal.url}, {"name": "b", "url": cal.url}]}
    exp = experiment(ctx, doc)
    first = ctx.spawn("run", str(exp), "--out", str(ctx.dir / "runs"))
    wait_streaming(cal.url, first, 2, 25, 30)
    first.signal(signal.SIGINT)
    one = first.finish(30)
    again = ctx.cli("run", str(exp), "--out", str(ctx.dir / "runs"), timeout_s=40)
    sent, kept = received(cal.url), records(ctx.dir)
    cells = {p.parent.name: json.loads(p.read_text()).get("status") for p in ctx.dir.rglob("summary.json")}
    ok, why = crash_or(one, (one.rc == 130, f"first exit {one.rc}"), (again.crashed() is None,
                                                                   f"resume crashed ({again.crashed()})"),
                       (again.rc == 0, f"resume exit {again.rc}: {one_line(again)[:80]}"),
                       ("resum" in again.text.lower(), "the second run did not say it resumed"))
    return Verdict(ok, why or f"interrupted (130), resumed (0); {len(kept)}/{sent} recorded, cells {cells}",
                   again.rc, lost(sent, kept))


def up_until_serving(ctx: Ctx, *args: str, timeout_s: float = 30, **kw: Any) -> tuple[Spawned, bool]:
    up = ctx.spawn("up", *args, **kw)
    return up, up.wait_output("press Ctrl-C", timeout_s)


@case("5", "SIGKILL to up; engine = launcher that double-forks (setsid)", 45)
def sigkill_up(ctx: Ctx) -> Verdict:
    from servelab.calibration import Script

    pidfile, port = ctx.inp / "server.pid", free_port()
    up, serving = up_until_serving(ctx, "command", "--port", str(port), "--log-dir", str(ctx.dir / "logs"), "--",
                                   *LAUNCHER, "{port}", "setsid", str(pidfile),
                                   Script(**SLOW).model_dump_json())
    pid = wait_file(pidfile, 5)
    try:
        if not serving or pid is None:
            ran = up.finish(1)
            return Verdict(False, f"up never served: {one_line(ran)[:100]}", ran.rc)
        up.signal(signal.SIGKILL)
        ran = up.finish(10)
        stopped = gone(int(pid), 15) and not listening(port)
        ok = stopped
        return Verdict(ok, "the guard stopped the double-forked server within 15 s" if ok else
                       "the double-forked server outlived SIGKILL of up", ran.rc, 0)
    finally:
        if pid:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


@case("9", "up: --admin-api-key, --api-key in the engine's flags, HF_TOKEN in env", 40)
def secrets_up(ctx: Ctx) -> Verdict:
    port = free_port()
    up, serving = up_until_serving(ctx, "command", "--port", str(port), "--log-dir", str(ctx.dir / "logs"), "--",
                                   "sh", "-c", f'exec {PY} -m servelab.calibration.server --port "$0"', "{port}",
                                   "--admin-api-key", PLAIN, "--api-key", MARK, env={"HF_TOKEN": PLAIN})
    if not serving:
        ran = up.finish(1)
        return Verdict(False, f"up never served: {one_line(ran)[:100]}", ran.rc)
    up.signal(signal.SIGTERM)
    ran = up.finish(20)
    ok, why = crash_or(ran, (ran.rc == 0, f"exit {ran.rc}"))
    return Verdict(ok, why or "served and stopped; neither key in its output or the engine log", ran.rc, 0)


@case("5", "SIGTERM to up replay-sglang while it loads", 45)
def sigterm_up_loading(ctx: Ctx) -> Verdict:
    import psutil

    port = free_port()
    up = ctx.spawn("up", "replay-sglang", "--port", str(port), "--option", "speed=20", "--log-dir",
                   str(ctx.dir / "logs"))
    loading = up.wait_output("loading", 30)
    tree = []
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = [p.pid for p in psutil.Process(up.pid).children(recursive=True)]
    if not loading:
        ran = up.finish(1)
        return Verdict(False, f"never loading: {one_line(ran)[:100]}", ran.rc)
    up.signal(signal.SIGTERM)
    ran = up.finish(20)
    left = [p for p in tree if not gone(p, 10)]
    ok, why = crash_or(ran, (ran.rc in (0, 143), f"exit {ran.rc}"), (not left, f"{len(left)} engine processes left"),
                       (not listening(port), "the port still answers"))
    return Verdict(ok, why or f"stopped while loading, exit {ran.rc}, {len(tree)} engine processes gone", ran.rc, 0)


@case("7", "Ctrl-C at 4 random moments of a closed-loop level (c6, short streams)", 60)
def ctrl_c_random(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=5, itl_ms=5, output_tokens=8))
    rng = random.Random(11)
    total_sent = total_kept = 0
    codes = []
    for i in range(4):
        before = received(cal.url)
        out = ctx.dir / f"runs{i}"
        run = ctx.spawn("bench", cal.url, "--model", "calibration", "--warmup", "0", "--tokenizer", "none",
                        "--mode", "concurrency", "--concurrency", "6", "--duration", "30", "--out", str(out))
        wait_streaming(cal.url, run, before + 1, 0, 20)
        time.sleep(rng.uniform(0.05, 1.0))
        run.signal(signal.SIGINT)
        ran = run.finish(20)
        codes.append(ran.rc)
        time.sleep(0.2)  # the server finishes counting what was sent in the last moment
        total_sent += received(cal.url) - before
        total_kept += len(records(out))
        why = ran.crashed()
        if why:
            return Verdict(False, f"interrupt {i + 1} crashed ({why})", ran.rc, lost(total_sent, total_kept))
    ok = all(c == 130 for c in codes)
    return Verdict(ok, f"{total_kept}/{total_sent} recorded over 4 interrupts, exits {codes}", codes[-1],
                   lost(total_sent, total_kept))


# ---- item 6: a billion streams for four requests -----------------------------------------------------------------

@case("6", "--concurrency 1000000000 --requests 4")
def billion_streams(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    ran = ctx.cli(*bench_args(cal.url, ctx, "--mode", "concurrency", "--concurrency", "1000000000", "--requests",
                              "4"), timeout_s=30)
    sent, kept = received(cal.url), records(ctx.dir)
    peak = ran.peak_mb or 0
    ok, why = crash_or(ran, (ran.rc == 0, f"exit {ran.rc}: {one_line(ran)[:100]}"), (len(kept) == 4, f"{len(kept)} records"),
                       (peak < PEAK_BOUND_MB, f"peak RSS {peak:.0f} MB"))
    return Verdict(ok, why or f"4 requests in {ran.wall_s:.1f} s, peak RSS {peak:.0f} MB", ran.rc, lost(sent, kept))


# ---- item 8: untrusted text printed inert ------------------------------------------------------------------------

def inert_check(runs: list[Ran]) -> tuple[bool, str]:
    text = "".join(r.text for r in runs)
    raw = [repr(c) for c in RAW_CONTROLS if c in text]
    if raw:
        return False, f"raw controls reached the terminal: {', '.join(raw)}"
    if "\\x1b" not in text:
        return False, "the model id was not printed at all"
    return True, "every escape shown as \\x1b…, [bold] as text"


@case("8", "ANSI/OSC escapes and [bold] in --model (bench, terminal forced)")
def ansi_model_flag(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    ran = ctx.cli(*bench_args(cal.url, ctx, "--requests", "2", "--max-tokens", "4", model=EVIL_MODEL),
                  env={"FORCE_COLOR": "1"})
    sent, kept = received(cal.url), records(ctx.dir)
    ok, why = crash_or(ran, (ran.rc in (0, 1), f"exit {ran.rc}"), inert_check([ran]))
    return Verdict(ok, why or inert_check([ran])[1], ran.rc, lost(sent, kept))


@case("8", "ANSI/OSC escapes in the model id a server lists (verify, bench)")
def ansi_model_server(ctx: Ctx) -> Verdict:
    fake = ctx.server(Fake(model=EVIL_MODEL))
    runs = [ctx.cli("verify", fake.url, *only("models", "chat_stream"), env={"FORCE_COLOR": "1"})]
    before = fake.received  # verify's requests are not records
    runs.append(ctx.cli(*bench_args(fake.url, ctx, "--requests", "2", "--max-tokens", "4", model=None)))
    kept = records(ctx.dir)
    crashed = [r for r in runs if r.crashed()]
    ok, why = (False, f"crashed: {one_line(crashed[0])[:100]}") if crashed else inert_check(runs)
    if ok and (runs[0].rc not in (0, 1) or runs[-1].rc != 0):
        ok, why = False, f"verify exit {runs[0].rc}, bench exit {runs[-1].rc}: {one_line(runs[-1])[:90]}"
    return Verdict(ok, why, runs[-1].rc, lost(fake.received - before, kept))


# ---- item 10: the load waits, stops and knows its limits --------------------------------------------------------

@case("10", "HTTP 429 with Retry-After: 5 (c2 for 3 s)")
def retry_after(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(http_status=429, retry_after="5"))
    ran = ctx.cli(*bench_args(cal.url, ctx, "--mode", "concurrency", "--concurrency", "2", "--duration", "3"))
    sent, kept = received(cal.url), records(ctx.dir)
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}"), (sent <= 4, f"{sent} requests sent in 3 s"),
                       (ran.wall_s < 25, f"took {ran.wall_s:.0f} s"))
    return Verdict(ok, why or f"{sent} requests sent (one per worker, then waited), {len(kept)} recorded",
                   ran.rc, lost(sent, kept))


@case("10", "the server dies mid-level (c2, 1 s streams)")
def server_gone(ctx: Ctx) -> Verdict:
    from servelab.calibration import Script, start_calibration_server

    cal = start_calibration_server(Script(ttft_ms=2, itl_ms=100, output_tokens=10))
    try:
        run = ctx.spawn(*bench_args(cal.url, ctx, "--mode", "concurrency", "--concurrency", "2", "--duration",
                                    "30"))
        wait_streaming(cal.url, run, 4, 0, 30)
        sent = progress(cal.url)["requests"]
        cal.proc.kill()  # no goodbye: every connection dies at once, then nothing listens
        ran = run.finish(40)
    finally:
        cal.stop()
    kept = records(ctx.dir)
    answered = [r for r in kept if r.get("error_kind") != "connect"]  # the ones the server had received
    connect = len(kept) - len(answered)
    ok, why = crash_or(ran, (connect < 60, f"{connect} connect failures (hot loop)"),
                       (ran.wall_s < 30, f"took {ran.wall_s:.0f} s"))
    return Verdict(ok, why or f"{len(answered)}/{sent} received recorded, then {connect} refusals ended the level "
                   f"in {ran.wall_s:.1f} s", ran.rc, lost(sent, answered))


@case("10", "--concurrency 3000 under ulimit -n 256")
def fd_limit(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    ran = ctx.cli(*bench_args(cal.url, ctx, "--mode", "concurrency", "--concurrency", "3000", "--duration", "2"),
                  preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)))
    sent, kept = received(cal.url), records(ctx.dir)
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), (sent == 0, f"{sent} requests sent"))
    return Verdict(ok, why or f"refused before sending: {one_line(ran)[:90]}", ran.rc, lost(sent, kept))


@case("—", "python -m http.server: 501 to every POST (sweep, 3 s levels)")
def http_501(ctx: Ctx) -> Verdict:
    url, log = ctx.server(http_server_501(ctx))
    ran = ctx.cli(*bench_args(url, ctx, "--mode", "sweep", "--duration", "3", model="x"))
    time.sleep(0.2)
    sent = log.read_text(errors="replace").count('"POST ')
    kept = records(ctx.dir)
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}"), (sent < 100, f"{sent} requests (hammered)"),
                       ("HTTP 501" in ran.text, "the error is not named"))
    return Verdict(ok, why or f"{sent} requests, error named with its count, exit 1", ran.rc, lost(sent, kept))


@case("—", "HTTP 500 to every request")
def http_500(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"http_status": 500}, "--mode", "concurrency", "--concurrency", "4", "--requests",
                       "1000", check=kinds_are("http"))


@case("—", "200 text/html (a proxy's 502 page)")
def html_page(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"html": True}, check=kinds_are("http", "parse"))


@case("—", "connection dropped after 2 events")
def disconnect(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"disconnect_after_events": 2}, check=kinds_are("disconnect"))


@case("—", 'in-band data: {"error": ...} after 2 events')
def in_band(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"in_band_error_after_events": 2}, check=kinds_are("in_band"))


@case("—", "stream stalls after 2 events (--timeout-idle 1)")
def stall_mid(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"stall_after_events": 2}, "--requests", "2", "--timeout-idle", "1",
                       check=kinds_are("timeout_idle"))


@case("—", "no first token ever (--timeout-first-byte 1)")
def stall_first(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"stall_after_events": 0}, "--requests", "2", "--timeout-first-byte", "1",
                       check=kinds_are("timeout_first_byte"))


@case("—", "CRLF framing, : ping comments and UTF-8 cut across writes")
def odd_framing(ctx: Ctx) -> Verdict:
    return bench_fault(ctx, {"crlf": True, "sse_comments": True, "split_utf8": True}, "--requests", "3",
                       expect_rc=(0,), check=kinds_are("ok"))


# ---- item 11, 12, 13, 20: storage --------------------------------------------------------------------------------

def can_mount() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


MOUNTS = None


def in_namespace(ctx: Ctx, setup: str, args: list[str], keep: Path | None = None, mounted: Path | None = None,
                 timeout_s: float | None = None) -> Ran:
    """servelab `args` in a private mount namespace after the shell `setup` (what is on `mounted` copied to `keep`
    afterwards: the mount vanishes with the namespace)."""
    save = f'; mkdir -p "{keep}"; cp -a "{mounted}/." "{keep}/"' if keep is not None else ""
    script = f'set -e; {setup}; set +e; "$@"; rc=$?{save}; exit $rc'
    return ctx.raw(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *SERVELAB, *args],
                   timeout_s=timeout_s)


def read_only(path: Path) -> str:
    return f'mkdir -p "{path}"; mount --bind "{path}" "{path}"; mount -o remount,bind,ro "{path}"'


def no_mounts() -> Verdict | None:
    global MOUNTS
    if MOUNTS is None:
        MOUNTS = can_mount()
    return None if MOUNTS else Verdict(False, "not run: needs unshare -m and mount (root)", None, None,
                                       extra={"skipped": True})


@case("11", "bench --out on a read-only filesystem")
def read_only_out(ctx: Ctx) -> Verdict:
    if (skip := no_mounts()) is not None:
        return skip
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    ro = ctx.dir / "ro"
    ran = in_namespace(ctx, read_only(ro), ["bench", cal.url, "--model", "calibration", "--warmup", "0",
                                            "--requests", "2", "--out", str(ro / "bench")])
    sent = received(cal.url)
    line = ran.err.strip()
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), ("EROFS" in line and "\n" not in line,
                                                              f"not one line naming EROFS: {line[:100]}"),
                       (sent == 0, f"{sent} requests sent first"))
    return Verdict(ok, why or f"one line, exit 2, nothing sent: {line[:80]}", ran.rc, lost(sent, 0))


@case("11", "disk fills during bench (96 kB tmpfs, 60 requests, store elsewhere)", 60)
def disk_full(ctx: Ctx) -> Verdict:
    if (skip := no_mounts()) is not None:
        return skip
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=1, output_tokens=40))
    full, kept_dir, store = ctx.dir / "full", ctx.dir / "kept", ctx.dir / "store.db"
    ran = in_namespace(ctx, f'mkdir -p "{full}"; mount -t tmpfs -o size=96k tmpfs "{full}"',
                       ["bench", cal.url, "--model", "calibration", "--warmup", "0", "--tokenizer", "none",
                        "--requests", "60", "--max-tokens", "40", "--out", str(full), "--store", str(store)],
                       keep=kept_dir, mounted=full)
    sent = received(cal.url)
    stored = 0
    with contextlib.suppress(Exception):
        from servelab.store.db import Store
        from servelab.store.runs import list_runs, load_run

        with Store.open(store, readonly=True) as db:
            stored = sum(len(load_run(db, row.run_id)[1]) for row in list_runs(db))
    on_disk = records(kept_dir)
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), ("ENOSPC" in ran.err, "ENOSPC not named"),
                       (not list(kept_dir.rglob("*.tmp")), ".tmp left"))
    return Verdict(ok, why or f"ENOSPC named, exit 2; {len(on_disk)} whole lines fit on the disk, {stored}/{sent} "
                   f"records in the store", ran.rc, lost(sent, stored))


def corrupt_page(db_path: Path, table: str) -> None:
    db = sqlite3.connect(db_path)
    try:
        page = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    finally:
        db.close()
    with open(db_path, "r+b") as fh:
        fh.seek((root - 1) * page)
        fh.write(bytes([0x0D, 0xFF, 0xFF, 0xFF]) + b"\xa5" * (page - 4))


@case("12", "a store with a corrupt page, then bench --out into it")
def corrupt_store(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    first = ctx.cli(*bench_args(cal.url, ctx, "--requests", "2"))
    if first.rc != 0:
        return Verdict(False, f"could not make the store: {one_line(first)[:100]}", first.rc)
    corrupt_page(ctx.dir / "runs" / "servelab.db", "records")
    before = received(cal.url)
    dirs = sorted(p.name for p in (ctx.dir / "runs").iterdir() if p.is_dir())
    ran = ctx.cli(*bench_args(cal.url, ctx, "--requests", "2"))
    sent = received(cal.url) - before
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), ("damaged" in ran.err, "not called damaged"),
                       (sent == 0, f"{sent} requests measured first"),
                       (sorted(p.name for p in (ctx.dir / "runs").iterdir() if p.is_dir()) == dirs,
                        "a run directory was made"))
    return Verdict(ok, why or f"found before measuring: {one_line(ran)[:80]}", ran.rc, lost(sent, 0))


@case("13", "two runs of one experiment at once", 60)
def two_runs(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(**SLOW))
    doc = {"name": "locked", "verify": {"enabled": False},
           "bench": {"single_requests": 2, "warmup": 0, "sweep": False, "max_tokens": 50},
           "cells": [{"name": "a", "url": cal.url}, {"name": "b", "url": cal.url}]}
    exp = experiment(ctx, doc)
    first = ctx.spawn("run", str(exp), "--out", str(ctx.dir / "runs"))
    wait_streaming(cal.url, first, 1, 1, 30)
    second = ctx.cli("run", str(exp), "--out", str(ctx.dir / "runs"), timeout_s=30)
    sent_before = received(cal.url)
    first.signal(signal.SIGINT)
    ran = first.finish(30)
    sent, kept = received(cal.url), records(ctx.dir)
    ok, why = crash_or(second, (second.rc == 2, f"second run exit {second.rc}"),
                       ("already running" in second.err, "the second did not say it is already running"),
                       (ran.rc == 130, f"first run exit {ran.rc} after Ctrl-C"),
                       (sent == sent_before, "the second run sent requests"))
    if ok and ran.crashed():
        ok, why = False, f"first run crashed ({ran.crashed()})"
    return Verdict(ok, why or f"second refused ({one_line(second)[:70]}); first {len(kept)}/{sent} recorded",
                   second.rc, lost(sent, kept))


@case("20", "a read-only store: runs, show, compare, report, export", 60)
def read_only_store(ctx: Ctx) -> Verdict:
    if (skip := no_mounts()) is not None:
        return skip
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    out = ctx.dir / "runs"
    for _ in range(2):
        made = ctx.cli(*bench_args(cal.url, ctx, "--requests", "2"))
        if made.rc != 0:
            return Verdict(False, f"could not make the store: {one_line(made)[:100]}", made.rc)
    from servelab.store.db import Store
    from servelab.store.runs import list_runs

    with Store.open(out / "servelab.db", readonly=True) as db:
        a, b = [r.run_id for r in list_runs(db)][:2]
    elsewhere = ctx.dir / "elsewhere"
    elsewhere.mkdir()
    digest = (out / "servelab.db").read_bytes()
    commands = {"runs": ["runs", "--out", str(out)], "show": ["show", a, "--out", str(out)],
                "compare": ["compare", a, b, "--out", str(out)],
                "report": ["report", a, b, "--out", str(out), "-o", str(elsewhere / "r.html")],
                "export": ["export", a, "--format", "json", "--to", str(elsewhere / "x"), "--out", str(out)]}
    failed = []
    last = None
    for name, args in commands.items():
        last = in_namespace(ctx, read_only(out), args)
        if last.rc != 0 or last.crashed():
            failed.append(f"{name} exit {last.rc}")
    changed = (out / "servelab.db").read_bytes() != digest
    ok = not failed and not changed
    return Verdict(ok, "all five read it, the store unchanged" if ok else "; ".join(failed + (["store changed"]
                                                                                            if changed else [])),
                   last.rc if last else None, 0)


# ---- item 14: deadlines ------------------------------------------------------------------------------------------

@case("14", ": ping comments forever after 2 tokens (--timeout-idle 1)")
def ping_forever(ctx: Ctx) -> Verdict:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("Hel", "lo"):
            await resp.write(Fake.chunk(word))
        for _ in range(600):
            await asyncio.sleep(0.1)
            await resp.write(b": ping\n\n")
        return resp
    fake = ctx.server(Fake(chat))
    ran = ctx.cli(*bench_args(fake.url, ctx, "--requests", "1", "--timeout-idle", "1", "--timeout-total", "30",
                              model="fake"))
    kept = records(ctx.dir)
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}"), kinds_are("timeout_idle")(kept, ran),
                       (ran.wall_s < 15, f"took {ran.wall_s:.0f} s"))
    return Verdict(ok, why or f"ended by the idle deadline in {ran.wall_s:.1f} s", ran.rc, lost(fake.received, kept))


# ---- item 15: the key goes everywhere ----------------------------------------------------------------------------

@case("15", "--api-key without --model against a server that wants it on every path")
def api_key_everywhere(ctx: Ctx) -> Verdict:
    from aiohttp import web

    def guard(request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") == f"Bearer {MARK}":
            return None
        return web.json_response({"error": {"code": 401, "message": "Invalid API Key"}}, status=401)
    fake = ctx.server(Fake(guard=guard, model="guarded"))
    ran = ctx.cli(*bench_args(fake.url, ctx, "--requests", "2", "--max-tokens", "4", "--api-key", MARK, model=None))
    kept = records(ctx.dir)
    refused = sorted({p for p, ok in fake.paths if not ok})
    ok, why = crash_or(ran, (ran.rc == 0, f"exit {ran.rc}: {one_line(ran)[:100]}"),
                       (not refused, f"sent without the key to {refused}"))
    return Verdict(ok, why or f"model found, {len(kept)} ok, the key on all {len(fake.paths)} requests", ran.rc,
                   lost(fake.received, kept))


# ---- item 16: who can reach the engine ---------------------------------------------------------------------------

@case("16", "up --host 0.0.0.0 (an engine without an API key)", 40)
def host_all(ctx: Ctx) -> Verdict:
    port = free_port()
    up, serving = up_until_serving(ctx, "command", "--host", "0.0.0.0", "--port", str(port), "--log-dir",
                                   str(ctx.dir / "logs"), "--", PY, "-m", "servelab.calibration.server", "--host",
                                   "{host}", "--port", "{port}")
    if not serving:
        ran = up.finish(1)
        return Verdict(False, f"up never served: {one_line(ran)[:100]}", ran.rc)
    time.sleep(0.3)
    said = " ".join(up.output().split())
    up.signal(signal.SIGTERM)
    ran = up.finish(20)
    warned = "reachable from the network" in said
    # The printed addresses against this host's interfaces (psutil), without connecting to any of them: a request
    # to an interface address is traffic outside loopback (tests/test_faults_process.py shows one answering, in a
    # network namespace of its own).
    printed = {a for a in re.findall(rf"http://([0-9.]+):{port}\b", said) if a != "127.0.0.1"}
    expected = addresses()
    right = printed == expected if expected else "every address of this host" in said
    ok, why = crash_or(ran, (warned, "no warning that the engine is reachable from the network"),
                       (right, f"printed {sorted(printed) or 'only 127.0.0.1'}, this host has {sorted(expected)}"),
                       (ran.rc == 0, f"exit {ran.rc}"))
    return Verdict(ok, why or f"warned, with the host's addresses ({', '.join(sorted(printed))}); stopped cleanly",
                   ran.rc, 0)


def addresses() -> set[str]:
    """This host's non-loopback IPv4 addresses (what `up --host 0.0.0.0` should print)."""
    import ipaddress

    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback}


# ---- item 17: hostile experiment files ---------------------------------------------------------------------------

def billion_laughs() -> str:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines + ["name: laughs", "cells: *i", ""])


def hostile_run(ctx: Ctx, content: bytes | Path) -> Verdict:
    if isinstance(content, Path):
        path = content
    else:
        path = ctx.inp / "exp.yaml"
        path.write_bytes(content)
    ran = ctx.cli("run", str(path), "--out", str(ctx.dir / "runs"), timeout_s=30)
    line = ran.err.strip()
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), ("\n" not in line and str(path) in line,
                                                              f"not one line naming the file: {line[:100]}"),
                       ((ran.peak_mb or 0) < PEAK_BOUND_MB, f"peak RSS {ran.peak_mb:.0f} MB"))
    return Verdict(ok, why or f"{ran.wall_s:.1f} s, peak {ran.peak_mb:.0f} MB: {line[:90]}", ran.rc, 0)


@case("17", "experiment YAML: billion laughs (9^9 aliases)")
def yaml_bomb(ctx: Ctx) -> Verdict:
    return hostile_run(ctx, billion_laughs().encode())


@case("17", "experiment YAML: name: &a [*a]")
def yaml_recursive(ctx: Ctx) -> Verdict:
    return hostile_run(ctx, b"name: &a [*a]\ncells: []\n")


@case("17", "experiment file: binary bytes")
def yaml_binary(ctx: Ctx) -> Verdict:
    return hostile_run(ctx, bytes(range(256)) * 8)


@case("17", "experiment file: /dev/zero")
def yaml_dev_zero(ctx: Ctx) -> Verdict:
    return hostile_run(ctx, Path("/dev/zero"))


# ---- item 18: hostile datasets -----------------------------------------------------------------------------------

def hostile_dataset(ctx: Ctx, path: Path, *more: str) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    ran = ctx.cli(*bench_args(cal.url, ctx, "--dataset", str(path), "--requests", "2", *more), timeout_s=30)
    sent = received(cal.url)
    line = ran.err.strip()
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), ("\n" not in line and str(path) in line,
                                                              f"not one line naming the file: {line[:100]}"),
                       ((ran.peak_mb or 0) < PEAK_BOUND_MB, f"peak RSS {ran.peak_mb:.0f} MB"),
                       (sent == 0, f"{sent} sent"))
    return Verdict(ok, why or f"{ran.wall_s:.1f} s, peak {ran.peak_mb:.0f} MB: {line[:90]}", ran.rc, lost(sent, 0))


def jsonl(ctx: Ctx, line: bytes) -> Path:
    path = ctx.inp / "d.jsonl"
    path.write_bytes(b'{"prompt": "hello"}\n{"prompt": "again"}\n' + line + b"\n")
    return path


@case("18", "--dataset /dev/zero")
def dataset_dev_zero(ctx: Ctx) -> Verdict:
    return hostile_dataset(ctx, Path("/dev/zero"), "--dataset-format", "jsonl")


@case("18", "dataset line nested 100,000 deep")
def dataset_deep(ctx: Ctx) -> Verdict:
    return hostile_dataset(ctx, jsonl(ctx, b'{"prompt": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"))


@case("18", "dataset line with a lone surrogate")
def dataset_surrogate(ctx: Ctx) -> Verdict:
    return hostile_dataset(ctx, jsonl(ctx, b'{"prompt": "bad \\ud800 text"}'))


@case("18", "dataset line with max_tokens 10^23")
def dataset_max_tokens(ctx: Ctx) -> Verdict:
    return hostile_dataset(ctx, jsonl(ctx, b'{"prompt": "x", "max_tokens": 100000000000000000000000}'))


# ---- item 19: absurd numbers -------------------------------------------------------------------------------------

def absurd(ctx: Ctx, *args: str) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    ran = ctx.cli(*bench_args(cal.url, ctx, *args), timeout_s=20)
    sent = received(cal.url)
    lines = ran.err.strip().splitlines()
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), (len(lines) <= 3, f"{len(lines)} lines"),
                       (sent == 0, f"{sent} sent"))
    return Verdict(ok, why or f"usage error in {ran.wall_s:.1f} s: {' '.join(ran.err.split())[:90]}", ran.rc,
                   lost(sent, 0))


@case("19", "--duration inf")
def absurd_duration(ctx: Ctx) -> Verdict:
    return absurd(ctx, "--mode", "concurrency", "--concurrency", "2", "--duration", "inf")


@case("19", "--max-tokens 2^64")
def absurd_max_tokens(ctx: Ctx) -> Verdict:
    return absurd(ctx, "--max-tokens", str(2**64))


@case("19", "--mode rate --rate 1 --burstiness inf")
def absurd_burstiness(ctx: Ctx) -> Verdict:
    return absurd(ctx, "--mode", "rate", "--rate", "1", "--burstiness", "inf")


@case("19", "--mode rate --rate 1e-9 --requests 2 (31 years)")
def absurd_rate(ctx: Ctx) -> Verdict:
    return absurd(ctx, "--mode", "rate", "--rate", "1e-9", "--requests", "2")


# ---- items 21, 22 and the API key: secrets that come with a URL or go out with a request ------------------------

def credentials_case(ctx: Ctx, *key: str) -> Verdict:
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=2, output_tokens=4))
    url = cal.url.replace("http://", f"http://alice:{PLAIN}@")
    env = {"HF_TOKEN": PLAIN}
    ran = ctx.cli(*bench_args(url, ctx, "--requests", "2", "--max-tokens", "4", "--csv", *key), env=env)
    sent, kept = received(cal.url), records(ctx.dir)
    verify = ctx.cli("verify", url, *key, *only("models", "chat", "chat_stream"), "--json", env=env)
    crashed = [f"{name} ({r.crashed()})" for name, r in (("bench", ran), ("verify", verify)) if r.crashed()]
    if crashed:
        return Verdict(False, f"{' and '.join(crashed)} crashed: {one_line(ran if ran.crashed() else verify)[:110]}",
                       ran.rc, lost(sent, kept))
    ok, why = crash_or(ran, (ran.rc in (0, 2), f"bench exit {ran.rc}: {one_line(ran)[:90]}"),
                       (verify.rc in (0, 1, 2), f"verify exit {verify.rc}: {one_line(verify)[:90]}"))
    said = "measured" if ran.rc == 0 else f"refused: {one_line(ran)[:60]}"
    return Verdict(ok, why or f"bench {said} ({len(kept)}/{sent}), verify exit {verify.rc}; the password written "
                   "nowhere", ran.rc, lost(sent, kept))


@case("21", "bench and verify http://alice:SECRET@host (HF_TOKEN in env)")
def url_credentials(ctx: Ctx) -> Verdict:
    return credentials_case(ctx)


@case("21", "bench and verify http://alice:SECRET@host --api-key KEY")
def url_credentials_and_key(ctx: Ctx) -> Verdict:
    return credentials_case(ctx, "--api-key", MARK)


@case("22", "a server that echoes the key in its 401 body (bench, verify)")
def echoed_key(ctx: Ctx) -> Verdict:
    from aiohttp import web

    async def deny(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        body = {"error": {"message": f"invalid api key {header.removeprefix('Bearer ')!r} (header was {header!r})",
                          "type": "authentication_error", "code": 401}}
        return web.json_response(body, status=401)
    fake = ctx.server(Fake(deny))
    ran = ctx.cli(*bench_args(fake.url, ctx, "--requests", "3", "--max-tokens", "4", "--api-key", MARK,
                              model="fake"))
    sent = fake.received
    kept = records(ctx.dir)
    runs = [ctx.cli("verify", fake.url, "--model", "fake", "--api-key", MARK, *only("models", "chat", "chat_stream"),
                    *flag) for flag in (["--json"], [])]
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}"), kinds_are("http")(kept, ran),
                       *[(r.crashed() is None, f"verify crashed ({r.crashed()})") for r in runs],
                       *[(r.rc == 1, f"verify exit {r.rc}: {one_line(r)[:80]}") for r in runs])
    return Verdict(ok, why or f"{len(kept)}/{sent} recorded as HTTP 401, excerpts kept, the key hidden", ran.rc,
                   lost(sent, kept))


# ---- items 23, 24, 25 -----------------------------------------------------------------------------------------------

@case("23", "an invalid-UTF-8 event in the same read as token event 2")
def invalid_utf8(ctx: Ctx) -> Verdict:
    def three_tokens(kept: list[dict[str, Any]], ran: Ran) -> tuple[bool, str]:
        tokens = {sum(e.get("tokens", 0) for e in r.get("events") or []) for r in kept}
        good = kept and tokens == {3} and all(r.get("error_kind") == "parse" for r in kept)
        return bool(good), f"tokens kept {sorted(tokens)}, expected 3"
    return bench_fault(ctx, {"invalid_utf8_after_events": 2}, check=three_tokens,
                       describe=lambda kept, ran: "parse failures, the 3 tokens before the bad event kept")


@case("24", "302 Found to another host")
def redirect(ctx: Ctx) -> Verdict:
    def names_it(kept: list[dict[str, Any]], ran: Ran) -> tuple[bool, str]:
        return bool(kept) and all("redirect to" in (r.get("error_detail") or "") for r in kept), \
            f"detail {(kept[0].get('error_detail') if kept else '')!r:.80}"
    return bench_fault(ctx, {"redirect_to": "https://gateway.example/v1/chat/completions"}, check=names_it,
                       describe=lambda kept, ran: f"http 302 naming {'its Location' if kept else '-'}")


@case("24", "SSE event: error without an error key")
def event_error(ctx: Ctx) -> Verdict:
    frame = 'event: error\ndata: {"message": "model overloaded", "type": "server_error"}\n\n'
    return bench_fault(ctx, {"raw_frame": frame, "raw_frame_after_events": 2}, check=kinds_are("in_band"))


@case("25", "bench --out against a port nobody listens on")
def set_up_error(ctx: Ctx) -> Verdict:
    port = free_port()
    ran = ctx.cli("bench", f"http://127.0.0.1:{port}", "--out", str(ctx.dir / "runs"))
    dirs = [p for p in (ctx.dir / "runs").iterdir() if p.is_dir()] if (ctx.dir / "runs").exists() else []
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), (not dirs, f"{len(dirs)} empty run directories left"))
    return Verdict(ok, why or f"exit 2, no run directory: {one_line(ran)[:80]}", ran.rc, 0)


# ---- the report: model text and names never run -----------------------------------------------------------------

class LiveElements(html.parser.HTMLParser):
    """Counts injected elements that are live in a DOM: payload tags (img src=x, svg with onload), any element
    with an event attribute that carries the payload, script elements whose code is the payload, and the
    elements the payload creates when it ran (<xss-fired>)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.live: list[str] = []
        self._script: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "xss-fired":
            self.live.append("a payload ran (<xss-fired>)")
        elif tag == "img" and a.get("src") == "x":
            self.live.append("<img src=x>")
        elif any(k.startswith("on") and v and "xss-fired" in v for k, v in attrs):
            self.live.append(f"<{tag} on…=payload>")
        if tag == "script":
            self._script = []

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            if "".join(self._script).strip().startswith("document.body.appendChild"):
                self.live.append("<script>payload</script>")
            self._script = None


def live_elements(page: str) -> list[str]:
    parser = LiveElements()
    parser.feed(page)
    parser.close()
    return parser.live


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(browser: str, page: Path, ctx: Ctx) -> tuple[str | None, str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={ctx.inp / 'profile'}", "--virtual-time-budget=5000"]
    try:
        done = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                              timeout=min(90, ctx.remaining()))
    except subprocess.TimeoutExpired:
        ctx.hung = True
        return None, "chromium did not finish"
    if done.returncode != 0 or "<html" not in done.stdout:
        return None, f"chromium exit {done.returncode}: {done.stderr[-200:]}"
    return done.stdout, ""


@case("—", "report.html: XSS payloads in model id, answers, cell names, errors", 90)
def report_xss(ctx: Ctx) -> Verdict:
    from aiohttp import web

    words = [" " + XSS["img"], " " + XSS["script"], " " + XSS["svg"], " done"]

    async def chat(request: web.Request) -> web.StreamResponse:
        return await fake.stream_words(request, words)

    async def fail(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.json_response({"error": {"message": f"overloaded {XSS['script']} {XSS['img']}",
                                            "type": "server_error", "code": 500}}, status=500)
    fake = ctx.server(Fake(chat, model=XSS["img"]))
    failing = ctx.server(Fake(fail, model=XSS["svg"]))
    doc = {"name": "xss", "description": XSS["script"],
           "bench": {"single_requests": 2, "max_tokens": 4, "warmup": 0, "sweep": False},
           "verify": {"enabled": True, "only": ["models", "chat", "chat_stream"], "check_timeout_s": 10},
           "cells": [{"name": f"answers {XSS['img']}", "url": fake.url},
                     {"name": f"model {XSS['script']}", "url": fake.url, "model": XSS["svg"]},
                     {"name": f"errors {XSS['svg']}", "url": failing.url}]}
    ran = ctx.cli("run", str(experiment(ctx, doc)), "--out", str(ctx.dir / "runs"), timeout_s=60)
    reports = list(ctx.dir.rglob("report.html"))
    if not reports:
        return Verdict(False, f"no report written (exit {ran.rc}): {one_line(ran)[:100]}", ran.rc)
    page = reports[0]
    text = page.read_text(errors="replace")
    carried = sum(text.count(s) for s in ("&lt;img src=x", "&lt;script&gt;", "&lt;svg onload"))
    static = live_elements(text)
    browser = chromium()
    if browser is None:
        live, how = static, "static HTML parsed (chromium is not installed)"
    else:
        dom, err = dump_dom(browser, page, ctx)
        if dom is None:
            return Verdict(False, err, ran.rc, None, len(static))
        live, how = live_elements(dom) + static, "Chromium's DOM after its scripts ran"
    ok, why = crash_or(ran, (ran.rc in (0, 1), f"run exit {ran.rc}"),
                       (carried > 0, "no payload reached the report (nothing was tested)"),
                       (not live, f"live: {', '.join(sorted(set(live)))}"))
    return Verdict(ok, why or f"{carried} payloads shown as text, 0 live ({how})", ran.rc, None, len(live),
                   extra={"payloads_as_text": carried, "checked_in": how})


# ---- issue 27: a server that floods, stalls or misbehaves (the raw servers of tests/faulty_server.py) -----------

RSS_BOUND_27_MB = 300  # issue 27: bench stays under this whatever the server sends


def faulty(ctx: Ctx, fault: Any, model: str = "m") -> Any:
    """A loopback server whose completion POSTs get `fault`'s raw bytes (tests/faulty_server.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from faulty_server import FaultyServer

    return ctx.server(FaultyServer(fault, model=model))


def flood_case(ctx: Ctx, fault: Any) -> Verdict:
    srv = faulty(ctx, fault)
    ran = ctx.cli(*bench_args(srv.url, ctx, "--mode", "concurrency", "--concurrency", "8", "--requests", "8",
                              model="m"))
    kept, peak = records(ctx.dir), ran.peak_mb or 0
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}, expected 1"),
                       (peak < RSS_BOUND_27_MB, f"peak RSS {peak:.0f} MB"),
                       (bool(kept) and all(r.get("error_kind") == "parse" for r in kept), "not parse failures"))
    detail = (kept[0].get("error_detail") or "")[:70] if kept else ""
    return Verdict(ok, why or f"{len(kept)} parse failures ({detail}), peak RSS {peak:.0f} MB, "
                   f"{ran.wall_s:.1f} s", ran.rc, lost(srv.posts, kept), extra={"peak_mb": peak})


@case("27", "one 256 MB response header line, bench --concurrency 8 (was 1,020 MB RSS)", 60)
def huge_header_27(ctx: Ctx) -> Verdict:
    sys.path.insert(0, str(ROOT / "tests"))
    from faulty_server import huge_header_line
    return flood_case(ctx, huge_header_line)


@case("27", "two million response header lines, bench --concurrency 8 (was 1,474 MB RSS)", 60)
def many_headers_27(ctx: Ctx) -> Verdict:
    sys.path.insert(0, str(ROOT / "tests"))
    from faulty_server import many_headers
    return flood_case(ctx, many_headers)


STALL_DEADLINE_S = 5


def stalled_case(ctx: Ctx, *mode: str) -> Verdict:
    sys.path.insert(0, str(ROOT / "tests"))
    from faulty_server import never_answers

    srv = faulty(ctx, never_answers)
    ran = ctx.cli(*bench_args(srv.url, ctx, *mode, "--timeout-first-byte", str(STALL_DEADLINE_S), model="m"))
    kept, peak = records(ctx.dir), ran.peak_mb or 0
    bound = 2 * STALL_DEADLINE_S + 15  # two deadlines and the set-up
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}, expected 1"),
                       ("stopped answering" in ran.text, "does not say the server stopped answering"),
                       (ran.wall_s < bound, f"{ran.wall_s:.0f} s, bound {bound} s"),
                       (peak < RSS_BOUND_27_MB, f"peak RSS {peak:.0f} MB"))
    return Verdict(ok, why or f"ended after {len(kept)} requests in {ran.wall_s:.1f} s (deadline "
                   f"{STALL_DEADLINE_S} s), exit 1, peak RSS {peak:.0f} MB", ran.rc, lost(srv.posts, kept),
                   extra={"peak_mb": peak})


@case("27", "accepts and never sends headers: bench --mode single --requests 4 (was 494 s)", 40)
def stalled_single_27(ctx: Ctx) -> Verdict:
    return stalled_case(ctx, "--mode", "single", "--requests", "4")


@case("27", "accepts and never sends headers: bench --concurrency 8 --requests 32 (was 375 s)", 40)
def stalled_concurrency_27(ctx: Ctx) -> Verdict:
    return stalled_case(ctx, "--mode", "concurrency", "--concurrency", "8", "--requests", "32")


@case("27", "Basic auth in the URL, required on every request (was 4 x HTTP 401)", 40)
def basic_auth_27(ctx: Ctx) -> Verdict:
    sys.path.insert(0, str(ROOT / "tests"))
    from faulty_server import basic_auth_required

    srv = faulty(ctx, basic_auth_required("alice", PLAIN))
    url = srv.url.replace("http://", f"http://alice:{PLAIN}@")
    ran = ctx.cli(*bench_args(url, ctx, "--mode", "single", "--requests", "4", model="m"))
    kept = records(ctx.dir)
    ok, why = crash_or(ran, (ran.rc == 0, f"exit {ran.rc}, expected 0"),
                       (len(kept) == 4 and all(r.get("ok") for r in kept), "not 4 ok"))
    return Verdict(ok, why or f"{sum(bool(r.get('ok')) for r in kept)}/4 ok with the URL's credentials",
                   ran.rc, lost(srv.posts, kept))


@case("27", "escape bytes in answers, error bodies and the model id: terminal, report.html, CSV", 90)
def escapes_27(ctx: Ctx) -> Verdict:
    sys.path.insert(0, str(ROOT / "tests"))
    from faulty_server import HOSTILE, hostile_answers

    model = f"model{HOSTILE}"
    srv = faulty(ctx, hostile_answers(), model=model)
    ran = ctx.cli(*bench_args(srv.url, ctx, "--mode", "single", "--requests", "4", model=model))
    runs = [p for p in (ctx.dir / "runs").iterdir() if p.is_dir()] if (ctx.dir / "runs").exists() else []
    if not runs:
        return Verdict(False, f"no run directory (exit {ran.rc}): {one_line(ran)[:100]}", ran.rc)
    report = ctx.dir / "report.html"
    made = ctx.cli("report", str(runs[0]), "-o", str(report), "--out", str(ctx.dir / "runs"))
    exported = ctx.cli("export", str(runs[0]), "--format", "csv", "--to", str(ctx.dir / "csv"), "--out",
                       str(ctx.dir / "runs"))
    raw = ("\x1b", "\x07", "\x9b", "\u202e")
    places = {"terminal": ran.text + made.text + exported.text}
    for path in [report, *sorted((ctx.dir / "csv").glob("*.csv"))]:
        places[path.name] = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    dirty = [f"{name}: {sum(text.count(c) for c in raw)}" for name, text in places.items()
             if any(c in text for c in raw)]
    ok, why = crash_or(ran, (ran.rc in (0, 1), f"exit {ran.rc}, expected 0 or 1 (half the requests are 500s)"),
                       (made.rc == 0 and exported.rc == 0, f"report exit {made.rc}, export exit {exported.rc}"),
                       (not dirty, f"raw control bytes in {', '.join(dirty)}"))
    return Verdict(ok, why or "no raw control byte in the terminal, report.html or the CSVs (shown as \\x1b)",
                   ran.rc, lost(srv.posts, records(ctx.dir)))


def huge_count_case(ctx: Ctx, count: str) -> Verdict:
    frame = f'data: {{"choices":[],"usage":{{"prompt_tokens":1,"completion_tokens":{count}}}}}\n\n'
    return bench_fault(ctx, {"raw_frame": frame, "raw_frame_after_events": 99}, check=kinds_are("parse"))


@case("27", "usage.completion_tokens = 10^30 (was dropped silently, exit 0)")
def usage_10_30(ctx: Ctx) -> Verdict:
    return huge_count_case(ctx, "1" + "0" * 30)


@case("27", "usage.completion_tokens = 1e308 (was dropped silently, exit 0)")
def usage_1e308(ctx: Ctx) -> Verdict:
    return huge_count_case(ctx, "1e308")


@case("27", "disk fills with the store on it (64 kB tmpfs --out): called a full disk", 60)
def disk_full_store_27(ctx: Ctx) -> Verdict:
    if (skip := no_mounts()) is not None:
        return skip
    cal = ctx.server(calibration(ttft_ms=2, itl_ms=1, output_tokens=40))
    full, kept_dir = ctx.dir / "full", ctx.dir / "kept"
    ran = in_namespace(ctx, f'mkdir -p "{full}"; mount -t tmpfs -o size=64k tmpfs "{full}"',
                       ["bench", cal.url, "--model", "calibration", "--warmup", "0", "--tokenizer", "none",
                        "--mode", "concurrency", "--concurrency", "8", "--requests", "32", "--out", str(full)],
                       keep=kept_dir, mounted=full)
    ok, why = crash_or(ran, (ran.rc == 2, f"exit {ran.rc}"), ("disk is full" in ran.err, "the full disk not named"),
                       ("damaged" not in ran.err, f"called damaged: {one_line(ran)[:100]}"))
    return Verdict(ok, why or f"exit 2: {one_line(ran)[:100]}", ran.rc, lost(received(cal.url), records(kept_dir)))


@case("27", "a second Ctrl-C 0.1 s after the first, bench --json (was: no JSON printed)", 60)
def double_ctrl_c_27(ctx: Ctx) -> Verdict:
    cal = ctx.server(calibration(**SLOW))
    run = ctx.spawn(*bench_args(cal.url, ctx, "--mode", "concurrency", "--concurrency", "3", "--duration", "60",
                                "--json"))
    if not wait_streaming(cal.url, run, 3, 9):
        ran = run.finish(1)
        return Verdict(False, f"never streaming (exit {ran.rc}): {one_line(ran)[:100]}", ran.rc)
    run.signal(signal.SIGINT)
    time.sleep(0.1)
    run.signal(signal.SIGINT)
    ran = run.finish(30)
    try:
        printed = json.loads(ran.out).get("interrupted") is True
    except ValueError:
        printed = False
    sent, kept = received(cal.url), records(ctx.dir)
    ok, why = crash_or(ran, (ran.rc == 130, f"exit {ran.rc}, expected 130"), (printed, "no --json result printed"))
    return Verdict(ok, why or f"exit 130, the --json result printed, {len(kept)}/{sent} recorded", ran.rc,
                   lost(sent, kept))


# ---- issue 27, verify: the same floods and stalls through `servelab verify` (tests/test_verify_bounds.py's faults)

def verify_faults() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_verify_bounds

    return test_verify_bounds


def verify_flood_case(ctx: Ctx, fault_name: str, expected: str) -> Verdict:
    """`servelab verify` against a server whose every completion answer is `fault_name`: exit 1, peak RSS under the
    bound, and a check's reason naming the bound it hit."""
    srv = faulty(ctx, getattr(verify_faults(), fault_name))
    ran = ctx.cli("verify", srv.url, "--model", "m", "--json")
    peak = ran.peak_mb or 0
    try:
        checks = json.loads(ran.out).get("checks", [])
    except ValueError:
        checks = []
    named = [c["id"] for c in checks if expected in (c.get("reason") or "")]
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}, expected 1"),
                       (peak < RSS_BOUND_27_MB, f"peak RSS {peak:.0f} MB"),
                       (bool(named), f"no check's reason says {expected!r}"))
    which = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    return Verdict(ok, why or f"{which}: {expected!r}; peak RSS {peak:.0f} MB, {ran.wall_s:.1f} s",
                   ran.rc, None, extra={"peak_mb": peak})


@case("27", "verify: a gzip answer inflating to 1 GB (was 5.2 GB RSS)", 120)
def verify_gzip_bomb_27(ctx: Ctx) -> Verdict:
    return verify_flood_case(ctx, "gzip_bomb", "answer inflated past 16 MiB")


@case("27", "verify: the same 1 GB gzip bomb with HTTP 500 (was 8.3 GB RSS)", 120)
def verify_gzip_bomb_500_27(ctx: Ctx) -> Verdict:
    return verify_flood_case(ctx, "bomb_with_500", "answer inflated past 16 MiB")


@case("27", "verify: one 32 MB SSE line (was 766 MB RSS)", 120)
def verify_sse_line_27(ctx: Ctx) -> Verdict:
    return verify_flood_case(ctx, "sse_line", "grew past 1 MiB without its end")


@case("27", "verify: a 64 MB line without a newline (was 450 MB RSS)", 120)
def verify_endless_line_27(ctx: Ctx) -> Verdict:
    return verify_flood_case(ctx, "line_without_newline", "grew past 1 MiB without its end")


@case("27", "verify: a stream of many tiny events (was 472 MB RSS)", 120)
def verify_tiny_events_27(ctx: Ctx) -> Verdict:
    return verify_flood_case(ctx, "tiny_events", "more than 100,000 events")


@case("27", "verify: one 256 MB response header line", 120)
def verify_huge_header_27(ctx: Ctx) -> Verdict:
    return verify_flood_case(ctx, "huge_header_line", "the response headers grew past 64 KiB")


@case("27", "verify: two million response header lines", 120)
def verify_many_headers_27(ctx: Ctx) -> Verdict:
    return verify_flood_case(ctx, "many_headers", "more than 128 headers")


@case("27", "verify: accepts and never sends headers, --timeout 3 (was 442 s: 18 checks, each its deadline)", 40)
def verify_stalled_27(ctx: Ctx) -> Verdict:
    srv = faulty(ctx, getattr(verify_faults(), "never_answers"))
    ran = ctx.cli("verify", srv.url, "--model", "m", "--json", "--timeout", "3")
    bound = 4 * 3 + 10  # two deadlines (each check's), the models check and the start
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}, expected 1"),
                       ("stopped answering" in ran.out, "does not say the server stopped answering"),
                       (ran.wall_s < bound, f"{ran.wall_s:.0f} s, bound {bound} s"))
    return Verdict(ok, why or f"stopped after two deadlines, {ran.wall_s:.1f} s, exit 1", ran.rc, None)


@case("27", "verify: a first token, then only keep-alive comments, --timeout 3", 40)
def verify_pings_27(ctx: Ctx) -> Verdict:
    srv = faulty(ctx, getattr(verify_faults(), "token_then_pings"))
    ran = ctx.cli("verify", srv.url, "--model", "m", "--json", "--timeout", "3")
    bound = 6 * 3 + 10  # the plain checks answer nothing either: a few deadlines, never one per check
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}, expected 1"),
                       ("stopped answering" in ran.out, "does not say the server stopped answering"),
                       (ran.wall_s < bound, f"{ran.wall_s:.0f} s, bound {bound} s"))
    return Verdict(ok, why or f"stopped after two deadlines, {ran.wall_s:.1f} s, exit 1", ran.rc, None)


@case("27", "verify: HTTP 302 on the chat POST (was followed as a GET, reported as a 404)", 60)
def verify_redirect_27(ctx: Ctx) -> Verdict:
    fault = verify_faults().raw_answer(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n"
                                       b"Connection: close\r\n\r\n")
    srv = faulty(ctx, fault)
    ran = ctx.cli("verify", srv.url, "--model", "m", "--json", "--only", "chat")
    followed = any(h.startswith(b"GET /elsewhere") for h in srv.heads)
    ok, why = crash_or(ran, (ran.rc == 1, f"exit {ran.rc}, expected 1"), (not followed, "the redirect was followed"),
                       ("does not follow redirects" in ran.out, "the redirect is not named"))
    return Verdict(ok, why or "named, not followed, exit 1", ran.rc, None)


# ---------------------------------------------------------------------------------------------------------------
# Running and reporting
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Row:
    n: int
    item: str
    fault: str
    survived: bool
    outcome: str
    rc: int | None
    lost: int | None
    hung: bool
    secrets: int
    xss: int | None
    wall_s: float
    bound_s: float
    secret_places: list[str]
    commands: list[dict[str, Any]]
    extra: dict[str, Any]


def run_case(n: int, c: Case, root: Path) -> Row:
    ctx = Ctx(root, f"{n:02d}-{c.fn.__name__}", c.bound_s)
    t0 = time.monotonic()
    try:
        v = c.fn(ctx)
    except Exception as e:  # the matrix's own failure: reported as such, the case not survived
        v = Verdict(False, f"matrix error: {type(e).__name__}: {e}"[:160], None, None,
                    extra={"traceback": traceback.format_exc()})
    finally:
        ctx.close()
    wall = time.monotonic() - t0
    if wall > c.bound_s + 5:
        ctx.hung = True
    places = ctx.secrets()
    survived = (v.ok and not ctx.hung and not places and not (v.lost or 0) and not (v.xss or 0))
    outcome = printable(v.outcome)
    if ctx.hung:
        outcome = f"HUNG (bound {c.bound_s:.0f} s): " + outcome
    if places:
        outcome += f"; secret in {', '.join(places[:3])}"
    commands = [{"argv": shown(r.argv), "rc": r.rc, "wall_s": round(r.wall_s, 2),
                 "peak_mb": round(r.peak_mb, 1) if r.peak_mb else None, "hung": r.hung} for r in ctx.commands]
    return Row(n, c.item, c.fault, survived, outcome, v.rc, v.lost, ctx.hung, len(places), v.xss, round(wall, 2),
               c.bound_s, places, commands, v.extra)


FAULT_W = 72


def show_row(r: Row) -> str:
    rc = "-" if r.rc is None else str(r.rc)
    lost_ = "-" if r.lost is None else str(r.lost)
    mark = "yes" if r.survived else "NO"
    return (f"{r.n:>2} {r.item:>3}  {r.fault:<{FAULT_W}} {mark:<4} {rc:>4} {lost_:>4} {'HUNG' if r.hung else 'no':<4} "
            f"{r.secrets:>3}  {r.outcome}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", help="run the cases whose fault or function name contains one of these")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--keep", action="store_true", help="keep every case's directory (printed at the end)")
    args = p.parse_args()
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # a fake's write to a client that left is expected
    cases = [c for c in CASES if not args.only or any(s in c.fault or s in c.fn.__name__ for s in args.only)]
    root = Path(tempfile.mkdtemp(prefix="servelab-faults-"))
    print(f"{len(cases)} faults; each case's files under {root}", flush=True)
    global FAULT_W
    FAULT_W = max([len(c.fault) for c in cases] + [22])
    print(f"{'#':>2} {'it':>3}  {'fault (what was tried)':<{FAULT_W}} {'surv':<4} {'rc':>4} {'lost':>4} {'hung':<4} "
          f"{'sec':>3}  outcome", flush=True)
    started = time.monotonic()
    rows = []
    for n, c in enumerate(cases, 1):
        row = run_case(n, c, root)
        rows.append(row)
        print(show_row(row), flush=True)
    wall = time.monotonic() - started
    xss = sum(r.xss or 0 for r in rows)
    summary = {"faults_tried": len(rows), "survived": sum(r.survived for r in rows),
               "records_lost": sum(r.lost or 0 for r in rows), "hangs": sum(r.hung for r in rows),
               "secrets_found": sum(r.secrets for r in rows), "live_xss_elements": xss}
    line = (f"faults tried {summary['faults_tried']}, survived {summary['survived']}, records lost "
            f"{summary['records_lost']}, hangs {summary['hangs']}, secrets found {summary['secrets_found']}, "
            f"live XSS elements {xss}")
    not_survived = [r for r in rows if not r.survived]
    if not_survived:
        print("not survived:")
        for r in not_survived:
            print(f"  #{r.n} (item {r.item}) {r.fault}: {r.outcome}")
    print(line)
    print(f"wall time {wall:.0f} s")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "servelab"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    doc = {"summary": summary, "summary_line": line, "wall_s": round(wall, 1),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "chromium": chromium() is not None, "mounts": MOUNTS,
                       "load_avg_at_end": os.getloadavg()},
           "commit": commit, "servelab_tree_dirty": dirty,
           "cases": [asdict(r) for r in rows]}
    if not args.only or args.out != RESULTS:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=True) + "\n")
        print(f"written to {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    if args.keep:
        print(f"case directories kept under {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if len(not_survived) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
