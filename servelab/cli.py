"""The command line: parse arguments, call one library function, render its result. Nothing else lives here.

Exit codes: 0 ok, 1 a check or gate failed, 2 a usage or set-up error (one line on stderr, no traceback unless
--debug), 130 interrupted by Ctrl-C, 143 by SIGTERM, 129 by SIGHUP (both behave as Ctrl-C: servelab/interrupts.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from servelab import __version__, aio, interrupts
from servelab.bench.args import BenchArgs
from servelab.cli_options import options_from
from servelab.errors import EngineFailed, UserError
from servelab.report.tables import make_console
from servelab.textsafe import InertConsole, inert, inert_markup

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Bring LLM inference servers up, verify them, benchmark them honestly.")
# InertConsole: no text servelab prints can carry a terminal control sequence (servelab/textsafe.py).
# stdout: the terminal's width on a terminal; through a pipe or into a file, no width limit (report/tables.py).
console = make_console()
# Errors are one line each: never wrapped at the terminal width (tests and scripts read them whole).
err_console = InertConsole(stderr=True, soft_wrap=True)
_state = {"debug": False}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (nothing else).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Model id to request (default: the "
                                                                          "first one the server lists).")]
ApiKeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="SERVELAB_API_KEY", show_default=False,
                                                  help="Bearer token for the server. Never written anywhere.")]

# --on: the same command, run by servelab on another host over SSH, or on a Ray node (servelab/remote/).
OnOpt = Annotated[Optional[str], typer.Option(
    "--on", help="Run it on another host: ssh://[user@]host[:port] (your ~/.ssh/config, agent and known_hosts "
                 "apply), or a Ray node that has the resources named, held while it runs: ray:GPU=8 or "
                 "ray:GPU=8,CPU=4 (the cluster of RAY_ADDRESS, else this host's). servelab must be installed there.",
    metavar="SSH_URL|ray:RES=N")]
RemotePythonOpt = Annotated[Optional[str], typer.Option(
    "--remote-python", help="With --on: an interpreter on that host that has servelab (default: `servelab` on "
                            "its PATH).", metavar="PATH")]
RemoteDirOpt = Annotated[Optional[str], typer.Option(
    "--remote-dir", help="With --on: where job directories go on that host (default ~/.servelab/remote).")]


def _valued_options(command: str) -> frozenset[str]:
    """The options of `command` that take a value, as the command line spells them: how --on tells a value from
    an option when it forwards the command line."""
    group = typer.main.get_command(app)
    return frozenset(name for param in group.commands[command].params
                     if not getattr(param, "is_flag", True) and not getattr(param, "count", False)
                     for name in (*param.opts, *param.secondary_opts))


def _forwarded(command: str, drops: tuple[str, ...] | None = None) -> list[str]:
    from servelab.remote.commands import FORWARD_DROPS, forwarded_argv

    return forwarded_argv(sys.argv[1:], command, drops or FORWARD_DROPS, _valued_options(command))


def _remote_options(remote_python: str | None, remote_dir: str | None, on_disconnect: str = "stop",
                    grace_s: float = 60.0):
    from servelab.remote.controller import RemoteOptions

    return RemoteOptions(remote_python=remote_python, remote_dir=remote_dir, on_disconnect=on_disconnect,
                         grace_s=grace_s, columns=console.width if console.is_terminal else None)


# `up`'s engine argument lists the registered engines, from the adapters' titles (engines.describe_engines). The
# registry imports every adapter, which no other command's start or help should wait for: the list is filled in
# only once the command line names `up` (main_options runs before the subcommand parses its --help).
ENGINE_ARG_HELP = "Engine to launch (the list: servelab up --help)."


def _list_engines_in_up_help(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand != "up" or not isinstance(ctx.command, typer.core.TyperGroup):
        return
    from servelab.engines import describe_engines

    for param in ctx.command.commands["up"].params:
        if param.name == "engine":
            param.help = f"Engine to launch: {describe_engines()}."


def _help_keeps_hyphenated_words() -> None:
    """Help text wraps at spaces only: `rate-sweep` or `--max-error-rate` split at a hyphen across two lines is
    an option nobody can copy. (typer's vendored click wraps with textwrap's default, break_on_hyphens=True.)"""
    try:
        from typer._click import _textwrap
    except ImportError:  # another typer: its help may wrap differently, nothing to adjust
        return
    original = _textwrap.TextWrapper.__init__

    def init(self, *args, **kwargs) -> None:
        kwargs.setdefault("break_on_hyphens", False)
        original(self, *args, **kwargs)

    _textwrap.TextWrapper.__init__ = init


_help_keeps_hyphenated_words()


def _version(value: bool) -> None:
    if value:
        print(f"servelab {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for unexpected errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    _state["debug"] = debug
    _list_engines_in_up_help(ctx)


def _out_console(as_json: bool) -> Console:
    # With --json, stdout carries only the JSON document; everything human goes to stderr.
    return err_console if as_json else console


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def up(
    ctx: typer.Context,
    engine: Annotated[str, typer.Argument(help=ENGINE_ARG_HELP)],
    model: Annotated[str, typer.Option("--model", "-m", help="Known model name (smollm2) or a path.")] = "smollm2",
    port: Annotated[Optional[int], typer.Option(help="Port (default: a free one).")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind; loopback unless you ask.")] = "127.0.0.1",
    parallel: Annotated[Optional[int], typer.Option(help="Concurrent sequences (slots).")] = None,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads.")] = None,
    log_dir: Annotated[Path, typer.Option(help="Where the engine's log is written.")] = Path("runs/logs"),
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for ready.")] = 600.0,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size, where the engine has it.")] = 1,
    executable: Annotated[Optional[str], typer.Option(help="Interpreter (Python engines) or binary to run the "
                                                           "engine with, e.g. .venv-tf/bin/python.")] = None,
    option: Annotated[Optional[list[str]], typer.Option(help="Adapter option KEY=VALUE (replay: speed, variant; "
                                                             "command: url, probe_path, ready_regex).")] = None,
    stall_action: Annotated[str, typer.Option(help="On a stall (no evidence of progress for the phase's "
                                                   "budget): stop the engine, or wait and only report it.")] = "stop",
    stall_budget: Annotated[Optional[float], typer.Option(help="Seconds without progress that make a stall, "
                                                               "whatever the phase (default: per phase).")] = None,
    stacks: Annotated[bool, typer.Option("--stacks/--no-stacks", help="Read the engine's stacks (py-spy) when a "
                                         "phase has been silent for half its budget and at a stall, and name what "
                                         "they show in the verdict.")] = True,
    on: OnOpt = None,
    remote_python: RemotePythonOpt = None,
    remote_dir: RemoteDirOpt = None,
    on_disconnect: Annotated[str, typer.Option(
        help="With --on: when the connection is lost for longer than --disconnect-grace, stop the engine there "
             "(the default: nothing is left holding the GPUs) or keep it serving (`servelab attach` follows it "
             "again).")] = "stop",
    disconnect_grace: Annotated[float, typer.Option(
        help="With --on: seconds the far side waits for a lost controller to come back.")] = 60.0,
    as_json: JsonOpt = False,
) -> None:
    """Start an engine, show its start-up phases live, and keep it serving until Ctrl-C.

    Arguments after `--` go to the engine's own command line, e.g.
    `servelab up llamacpp -- --spec-type draft-simple --draft-model smollm2`."""
    if on is not None:
        from servelab.remote.commands import remote_up

        if on_disconnect not in ("stop", "keep"):
            raise UserError(f"unknown --on-disconnect '{on_disconnect}'", hint="use stop or keep")
        if disconnect_grace < 1:  # the controller says it is alive twice a second: less would stop on a hiccup
            raise UserError("--disconnect-grace must be at least 1 s")
        from servelab.report.live import launch_view

        raise typer.Exit(remote_up(on, _forwarded("up"),
                                   _remote_options(remote_python, remote_dir, on_disconnect, disconnect_grace),
                                   _out_console(as_json), err_console, launch_view(_out_console(as_json))))
    from servelab.engines import EngineSpec
    from servelab.lifecycle.launch import start_engine
    from servelab.report.live import launch_view
    from servelab.report.terminal import render_lint

    out = _out_console(as_json)
    spec = EngineSpec(engine=engine, model=model, port=port, host=host, parallel=parallel, threads=threads,
                      extra_args=list(ctx.args))
    from servelab.store.rundir import ensure_writable

    ensure_writable(log_dir, "log directory")  # a read-only or full --log-dir: one line, exit 2, nothing started
    spec = spec.model_copy(update={"tp": tp, "executable": executable, "stall_budget_s": stall_budget,
                                   "options": dict(item.split("=", 1) for item in option or [] if "=" in item)})
    with start_engine(spec, log_dir, view=launch_view(out), ready_timeout_s=ready_timeout,
                      stall_action=stall_action, stacks=stacks) as running:
        result = running.result()
        render_lint(out, result.lint)
        if as_json:
            print(result.model_dump_json(indent=2), flush=True)
        from servelab.lifecycle.exposure import engine_exposure

        exposed = engine_exposure(running)  # --host 0.0.0.0: who else can reach it (issue 11 item 16)
        if exposed is not None:
            out.print(f"[bold yellow]warning:[/bold yellow] {inert_markup(exposed.warning())}", highlight=False)
        also = f" (from the network: {', '.join(exposed.urls)})" if exposed is not None and exposed.urls else ""
        out.print(f"serving model [bold]{inert_markup(running.served_model)}[/bold] at {inert_markup(running.url)}"
                  f"{inert_markup(also)}  (log: {inert_markup(running.log_path)})\npress Ctrl-C to stop",
                  highlight=False)
        try:
            while running.alive:
                time.sleep(0.5)
        except KeyboardInterrupt:
            out.print("stopping…")
            return
        out.print(f"[red]the engine exited: {running.process.describe_exit()}[/red]")
        for line in running.process.log_tail(10):
            out.print(f"  {inert(line)}", markup=False, highlight=False)
        raise typer.Exit(1)


JunitOpt = Annotated[Optional[Path], typer.Option(
    "--junit", help="Also write the checks as JUnit XML (one test case per check) for CI test reports.",
    metavar="FILE")]


@app.command("verify")
def verify_cmd(
    url: Annotated[str, typer.Argument(help="Base URL of an OpenAI-compatible server.")],
    model: ModelOpt = None,
    only: Annotated[Optional[list[str]], typer.Option(help="Run only these check ids.")] = None,
    skip: Annotated[Optional[list[str]], typer.Option(help="Skip these check ids.")] = None,
    timeout: Annotated[float, typer.Option(help="Deadline per check, seconds.")] = 30.0,
    concurrency: Annotated[int, typer.Option(help="Simultaneous requests in the concurrency checks.")] = 4,
    api_key: ApiKeyOpt = None,
    junit: JunitOpt = None,
    on: OnOpt = None,
    remote_python: RemotePythonOpt = None,
    remote_dir: RemoteDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Functional and OpenAI-compatibility checks against a running server (with --on: from that host)."""
    from servelab.records import VerifyResult
    from servelab.report.terminal import render_checks
    from servelab.verify.runner import verify

    if on is not None:
        from servelab.remote.commands import remote_json

        argv = _forwarded("verify", ("--on", "--remote-python", "--remote-dir", "--junit", "--api-key"))
        code, doc = remote_json(on, argv, _remote_options(remote_python, remote_dir), console, err_console,
                                env_secrets={"SERVELAB_API_KEY": api_key} if api_key else None)
        if doc is None:
            raise typer.Exit(code or 1)
        result = VerifyResult.model_validate(doc)
    else:
        result = verify(url, model=model, only=only, skip=skip, check_timeout_s=timeout, api_key=api_key,
                        concurrency=concurrency)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        render_checks(console, result)
    if junit is not None:
        from servelab.verify.junit import write_junit

        err_console.print(f"junit: {write_junit(junit, [(result.url, result)])}", highlight=False)
    if result.failed:
        raise typer.Exit(1)


StoreOpt = Annotated[Optional[Path], typer.Option("--store", help="The run store (default: OUT/servelab.db, or "
                                                                 "$SERVELAB_STORE).")]
OutOpt = Annotated[Path, typer.Option(help="Root directory for run directories.")]


@app.command("bench")
@options_from(BenchArgs, after="url")  # every option of the bench itself: one field of BenchArgs each
def bench_cmd(
    url: Annotated[str, typer.Argument(help="Base URL of an OpenAI-compatible server.")],
    out: Annotated[Optional[Path], typer.Option(help="Write summary.json and records.jsonl.gz in a run directory "
                                                     "under this one, and store the run in its servelab.db "
                                                     "(`servelab runs`).")] = None,
    store: StoreOpt = None,
    csv: Annotated[bool, typer.Option("--csv", help="With --out: also write records.csv and levels.csv "
                                                    "(docs/output.md).")] = False,
    keep_events_text: Annotated[bool, typer.Option(
        "--keep-events-text", help="With --out: keep each token event's text in records.jsonl.gz, not only "
                                   "each answer's whole text (about 2x the bytes).")] = False,
    on: Annotated[Optional[str], typer.Option(
        "--on", help="Run the client on another host, next to the server (the network between you and it stays "
                     "out of the figures): ssh://[user@]host[:port], or a Ray node by resources, ray:GPU=8 or "
                     "ray:GPU=8,CPU=4. "
                     "URL is as that host sees it; the results come back into --out (default runs) and the "
                     "store here.", metavar="SSH_URL|ray:RES=N")] = None,
    remote_python: RemotePythonOpt = None,
    remote_dir: RemoteDirOpt = None,
    as_json: JsonOpt = False,
    **bench_options,
) -> None:
    """Benchmark a running server: single stream, closed or open loop, sweeps, SLO search; counted in tokens.

    Exit 1 when a level broke the error gate (--max-error-rate)."""
    from servelab.bench.options import build_options
    from servelab.bench_session import BenchOutput, BenchSession, render_bench

    output = BenchOutput(out=out, store=store, csv=csv, keep_events_text=keep_events_text)
    args = BenchArgs(**bench_options)
    if on is not None:  # checked there: its files (a dataset, a trace) are that host's
        from servelab.remote.commands import FORWARD_DROPS, remote_bench
        from servelab.store.db import default_store_path

        local_out = out or Path("runs")
        code, _runs = remote_bench(on, _forwarded("bench", (*FORWARD_DROPS, "--api-key")),
                                   _remote_options(remote_python, remote_dir), console, err_console, local_out,
                                   store or default_store_path(local_out),
                                   env_secrets={"SERVELAB_API_KEY": args.api_key} if args.api_key else None)
        raise typer.Exit(code)
    options = build_options(args)
    session = BenchSession.open(output, args.mode)  # a damaged store stops the run before it measures anything
    result = session.measure(url, options, _out_console(as_json))
    # The measurement is over: a further Ctrl-C waits until the results are written and printed (issue 27).
    with interrupts.deferred() as held:
        kept = session.keep(result, options)
        if as_json:
            print(result.model_dump_json(indent=2))
        else:
            render_bench(console, kept)
        for line in kept.write_errors:  # a full or read-only disk, a failing store: said after the results, exit 2
            err_console.print(f"error: {line}", markup=False, highlight=False)
        if result.interrupted or held:
            raise typer.Exit(interrupts.exit_code())
        if kept.write_errors:
            raise typer.Exit(2)
        if kept.error_gate:
            for reason in kept.error_gate:
                err_console.print(f"error gate: {reason}", highlight=False, markup=False)
            raise typer.Exit(1)


@app.command("run")
def run_cmd(
    experiment: Annotated[Optional[Path], typer.Argument(help="Experiment file (YAML). Without one: the embedded "
                                                             "default, a head-to-head of the bundled engine.")] = None,
    out: OutOpt = Path("runs"),
    store: StoreOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Resume the latest experiment of this name even if it "
                                                          "completed (failed cells run again). An unfinished one "
                                                          "resumes without it.")] = False,
    new: Annotated[bool, typer.Option("--new", help="Start afresh, even if an unfinished experiment of this name "
                                                    "exists.")] = False,
    duration: Annotated[Optional[float], typer.Option(help="Seconds per concurrency level of the sweep.")] = None,
    requests: Annotated[Optional[int], typer.Option(help="Measured single-stream requests.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per request.")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option(help="Highest concurrency the sweep tries.")] = None,
    trials: Annotated[Optional[int], typer.Option(help="Trials per cell, interleaved between cells (the default "
                                                       "experiment: 3); verdicts need them to agree.")] = None,
    warmup: Annotated[Optional[str], typer.Option(
        help="Warm-up before each bench of a trial: N requests one at a time (0: none), or auto (the default): "
             "as many at once as the bench's highest concurrency (capped by the server's slots), then one.")] = None,
    reruns: Annotated[Optional[int], typer.Option(
        help="Times a trial contended by other work on the machine may run again once it is quiet (default 2); "
             "0: contended trials are only left out, and a busy machine never stops the run "
             "(docs/metrics.md#contended-trials).")] = None,
    cache_reset: Annotated[Optional[bool], typer.Option(
        "--cache-reset/--no-cache-reset",
        help="Empty the server's prefix cache before each trial where the engine has an endpoint for it (the "
             "default; experiment setting cache_reset); each trial records whether it was reset.")] = None,
    junit: JunitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run an experiment: every cell in turn (up, verify, bench single-stream and sweep, down), then compare them.

    Settings given here apply to every cell. Without a file: the bundled engine misconfigured (one slot) against
    well configured (eight slots). An interrupted experiment resumes when run again."""
    from servelab.experiment.default import default_experiment
    from servelab.experiment.load import load_experiment
    from servelab.experiment.model import with_bench_overrides
    from servelab.bench.options import parse_warmup
    from servelab.experiment.runner import ExperimentOptions, run_experiment

    warmup_n = parse_warmup(warmup)
    if any(v is not None and v <= 0 for v in (duration, requests, max_tokens, max_concurrency, trials)):
        raise UserError("--requests, --max-tokens, --duration, --max-concurrency and --trials must be positive")
    if resume and new:
        raise UserError("--resume and --new contradict each other")
    spec = load_experiment(experiment) if experiment is not None else default_experiment()
    spec = with_bench_overrides(spec, {"level_duration_s": duration, "single_requests": requests,
                                       "max_tokens": max_tokens, "max_concurrency": max_concurrency,
                                       "warmup": None if warmup is None else "auto" if warmup_n is None else warmup_n})
    if trials is not None:
        spec = spec.model_copy(update={"trials": trials})
    if cache_reset is not None:
        spec = spec.model_copy(update={"cache_reset": cache_reset})
    if reruns is not None:
        if not 0 <= reruns <= 20:
            raise UserError("--reruns must be between 0 and 20")
        spec = spec.model_copy(update={"contention": spec.contention.model_copy(update={"reruns": reruns})})
    options = ExperimentOptions(out_root=out, store_path=store, resume="require" if resume else "never" if new
                                else "auto", source=str(experiment) if experiment else "embedded default")
    result = run_experiment(spec, options, _out_console(as_json))
    if as_json:
        print(result.model_dump_json(indent=2))
    if junit is not None:  # each cell's verify step, one test suite per cell
        from servelab.verify.junit import gpu_properties, write_junit

        names = {c.run_id: c.name for c in result.cells}
        suites = [(names.get(s.run_id, s.run_id), s.verify, gpu_properties(s)) for s in result.runs
                  if s.verify is not None]
        err_console.print(f"junit: {write_junit(junit, suites, f'servelab run {result.name}')}", highlight=False)
    for line in result.write_errors:  # a full or read-only disk, a store that failed: what was not kept
        err_console.print(f"error: {line}", markup=False, highlight=False)
    if result.status == "interrupted":
        raise typer.Exit(interrupts.exit_code())
    if result.write_errors:
        raise typer.Exit(2)
    if result.status == "contended":  # stopped early on a busy machine: what was measured is kept
        err_console.print(f"error: {result.stop_reason}", markup=False, highlight=False)
        raise typer.Exit(1)
    if result.any_failed:
        raise typer.Exit(1)


@app.command()
def selftest(
    tolerance: Annotated[float, typer.Option(help="Timing error allowed at p99, ms.")] = 1.0,
    max_streams: Annotated[int, typer.Option(help="Stop at this many concurrent streams.")] = 256,
    duration: Annotated[float, typer.Option(help="Seconds per level.")] = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Measure how much streaming load this machine's client times accurately (against the calibration server)."""
    from rich.text import Text

    from servelab.bench.selftest import run_selftest, save
    from servelab.report.tables import Col, print_table

    ui = _out_console(as_json)
    with ui.status("selftest: starting the calibration server") as status:
        def on_level(level) -> None:
            status.update(f"selftest: {level.streams} streams, {level.events_s:,.0f} events/s, "
                          f"p99 error {level.error_ms_p99:.2f} ms")

        result = aio.run(run_selftest(tolerance_ms=tolerance, max_streams=max_streams,
                                      level_duration_s=duration, on_level=on_level))
    path = save(result)
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    rows = [[str(lv.streams), f"{lv.events_s:,.0f}", f"{lv.tokens_s:,.0f}", f"{lv.requests_s:,.1f}",
             f"{lv.error_ms_p50:.3f}", f"{lv.error_ms_p99:.3f}", f"{lv.error_ms_max:.2f}",
             "–" if lv.server_late_ms_p99 is None else f"{lv.server_late_ms_p99:.2f}",
             "–" if lv.server_cpu_cores is None else f"{lv.server_cpu_cores:.2f}",
             Text("yes") if lv.within_tolerance else Text("no", style="red")] for lv in result.levels]
    print_table(console, f"client timing accuracy (tolerance {tolerance:g} ms at p99)",
                [Col("streams"), Col("events/s"), Col("tokens/s"), Col("req/s"), Col("error\np50 ms"),
                 Col("error\np99 ms"), Col("max ms"), Col("server late\np99 ms"), Col("server\ncores"),
                 Col("ok")], rows)
    if result.ceiling_streams:
        console.print(f"ceiling: {result.ceiling_streams} streams, {result.ceiling_events_s:,.0f} events/s, "
                      f"{result.ceiling_tokens_s:,.0f} tok/s within {tolerance:g} ms (saved to {path}; bench warns "
                      f"when a level goes past half of it)")
    else:
        console.print("[yellow]even one stream exceeded the tolerance: this machine is too busy to time "
                      "accurately[/yellow]")
    if result.limit:
        console.print(f"limit: the {result.limit} ({result.limit_reason})", markup=False, highlight=False)


@app.command("doctor")
def doctor_cmd(
    pid: Annotated[Optional[int], typer.Option(help="Process id of the engine (its tree is sampled).")] = None,
    log: Annotated[Optional[Path], typer.Option(help="The engine's log file.")] = None,
    url: Annotated[Optional[str], typer.Option(help="The engine's base URL (readiness probe, config).")] = None,
    engine: Annotated[Optional[str], typer.Option(help="Engine name, when it cannot be recognised.")] = None,
    seconds: Annotated[float, typer.Option(help="How long to watch.")] = 3.0,
    stacks: Annotated[Optional[bool], typer.Option(
        "--stacks/--no-stacks", help="Stacks are read and named whenever there is a process (py-spy): --stacks "
                                     "adds the raw dumps, --no-stacks skips them.")] = None,
    on: OnOpt = None,
    remote_python: RemotePythonOpt = None,
    remote_dir: RemoteDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Diagnose a server servelab did not start: starting, loading, ready, stalled or crashed, with the evidence.

    Any one of --pid, --url, --log will do: the URL is found from the process's listening sockets, the process
    from a local URL's port, the log from the process's output file. Exit 1 when it is stalled, crashed, not
    running (nothing listens at the URL, nothing else to look at), there is no such process, or it answers its
    readiness probe while its stacks look deadlocked."""
    from servelab.lifecycle.doctor import diagnose, looks_hung
    from servelab.records import Diagnosis
    from servelab.report.doctor import render_diagnosis

    if on is not None:  # the process, log and URL are that host's: doctor runs there, its verdict is drawn here
        from servelab.remote.commands import remote_json

        code, doc = remote_json(on, _forwarded("doctor"), _remote_options(remote_python, remote_dir),
                                console, err_console)
        if doc is None:
            raise typer.Exit(code or 1)
        result = Diagnosis.model_validate(doc)
    else:
        result = diagnose(pid=pid, log=log, url=url, engine=engine, seconds=seconds, stacks=stacks is not False,
                          raw_stacks=stacks is True)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        render_diagnosis(console, result)
    if looks_hung(result):
        raise typer.Exit(1)


@app.command("export")
def export_cmd(
    run_dir: Annotated[str, typer.Argument(help="A run directory (summary.json + records.jsonl), or a run id "
                                                "from the store.")],
    fmt: Annotated[str, typer.Option("--format", help="csv, json, vllm (each level as a vllm bench serve "
                                                      "--save-result JSON), or parquet (needs pyarrow).")] = "csv",
    to: Annotated[Optional[Path], typer.Option(help="Directory to write into (default: the run "
                                                    "directory).")] = None,
    out: OutOpt = Path("runs"),
    store: StoreOpt = None,
) -> None:
    """Export a run's per-request records and level summaries as CSV or JSON, or each level in vLLM's bench
    result shape (docs/output.md)."""
    from servelab.store.db import default_store_path
    from servelab.store.export import export_run

    paths, notes = export_run(run_dir, fmt, to, store or default_store_path(out))
    for note in notes:
        err_console.print(f"note: {note}", highlight=False)
    for path in paths:
        console.print(str(path), highlight=False)


@app.command("runs")
def runs_cmd(
    out: OutOpt = Path("runs"),
    store: StoreOpt = None,
    limit: Annotated[int, typer.Option(help="Show at most this many.")] = 30,
    as_json: JsonOpt = False,
) -> None:
    """List the runs in the store, newest first."""
    import dataclasses
    import json

    from servelab.compare.gather import open_store_if_present
    from servelab.report.compare_terminal import render_runs
    from servelab.store.db import default_store_path
    from servelab.store.runs import list_runs

    with open_store_if_present(store or default_store_path(out)) as db:
        rows = list_runs(db, limit=limit) if db is not None else []
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        render_runs(console, rows)


@app.command("show")
def show_cmd(
    run: Annotated[str, typer.Argument(help="A run id (or a unique prefix) from the store, or a run directory.")],
    out: OutOpt = Path("runs"),
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print one run: launch, lint, verify, every bench level, headline figures, provenance."""
    from servelab.compare.gather import gather_runs, open_store_if_present
    from servelab.report.compare_terminal import render_show
    from servelab.store.db import default_store_path

    with open_store_if_present(store or default_store_path(out)) as db:
        data = gather_runs([run], [], db, store or default_store_path(out))[0]
    if as_json:
        doc = {"name": data.name, "ref": data.ref, "status": data.status, "error": data.error,
               "headline": {k: f.model_dump() for k, f in data.headline.items()},
               "launch": data.launch.model_dump() if data.launch else None,
               "verify": data.verify.model_dump() if data.verify else None,
               "single": data.single.model_dump() if data.single else None,
               "sweep": data.sweep.model_dump() if data.sweep else None,
               "steps": [{"name": s.name, "result": s.result.model_dump()} for s in data.steps],
               "provenance": data.provenance.model_dump() if data.provenance else None}
        import json

        print(json.dumps(doc, indent=2))
    else:
        render_show(console, data)


@app.command("compare")
def compare_cmd(
    runs: Annotated[Optional[list[str]], typer.Argument(help="Run ids or run directories; the first is the "
                                                             "baseline unless --baseline is given.")] = None,
    baseline: Annotated[Optional[list[str]], typer.Option(
        "--baseline", help="The baseline: a run, or figures as KEY=VALUE (repeatable), e.g. "
                           "single.decode_tok_s=82.5 peak.output_tok_s=1536.")] = None,
    fail_on_regression: Annotated[Optional[float], typer.Option(
        help="Exit 1 when a key figure is worse than the baseline by more than PCT percent beyond noise.",
        metavar="PCT")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", "-o", help="Also write the HTML report here.")] = None,
    out: OutOpt = Path("runs"),
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Key figures side by side with ratios to the baseline, 95 % bootstrap intervals and a verdict per figure."""
    from servelab.compare.compare import compare_runs, regressions
    from servelab.compare.gather import gather_runs, open_store_if_present
    from servelab.report.compare_terminal import render_comparison
    from servelab.store.db import default_store_path

    if fail_on_regression is not None and fail_on_regression < 0:
        raise UserError("--fail-on-regression takes a percentage of 0 or more")
    with open_store_if_present(store or default_store_path(out)) as db:
        data = gather_runs(list(runs or []), list(baseline or []), db, store or default_store_path(out))
    comparison = compare_runs(data)
    if as_json:
        print(comparison.model_dump_json(indent=2))
    else:
        render_comparison(console, comparison)
    if report is not None:
        from servelab.report.html import write_report

        path = write_report([r for r in data if not r.literal], comparison, report, title="servelab comparison")
        err_console.print(f"report: {path}", highlight=False)
    if fail_on_regression is not None:
        found = regressions(comparison, fail_on_regression)
        for line in found:
            err_console.print(f"regression: {line}", highlight=False)
        if found:
            raise typer.Exit(1)


@app.command("report")
def report_cmd(
    runs: Annotated[list[str], typer.Argument(help="Run ids or run directories; with two or more, the first is "
                                                   "the baseline of the comparison.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("report.html"),
    out: OutOpt = Path("runs"),
    store: StoreOpt = None,
) -> None:
    """A self-contained HTML report (opens without network): curves, distributions, start-up, verify, lint."""
    from servelab.compare.compare import NoCommonMetrics, compare_runs
    from servelab.compare.gather import gather_runs, open_store_if_present
    from servelab.report.compare_terminal import render_comparison
    from servelab.report.html import write_report
    from servelab.store.db import default_store_path

    with open_store_if_present(store or default_store_path(out)) as db:
        data = gather_runs(runs, [], db, store or default_store_path(out))
    comparison = None
    if len(data) >= 2:
        try:
            comparison = compare_runs(data)
            render_comparison(console, comparison)
        except NoCommonMetrics as exc:
            err_console.print(f"note: {exc.message}", highlight=False)
    console.print(f"report: {write_report(data, comparison, output)}", highlight=False)


@app.command("attach")
def attach_cmd(
    on: Annotated[str, typer.Argument(help="The host: ssh://[user@]host[:port].", metavar="SSH_URL")],
    job: Annotated[str, typer.Argument(help="The job directory there, as `--on` printed it.")],
    remote_python: RemotePythonOpt = None,
) -> None:
    """Follow a command still running on another host (after a lost connection, or `up --on-disconnect keep`):
    its output from the start, live; Ctrl-C stops it there."""
    from servelab.remote.commands import attach
    from servelab.report.live import launch_view

    raise typer.Exit(attach(on, job, _remote_options(remote_python, None), console, err_console,
                            launch_view(console)))


def _add_remote_agent() -> None:
    from servelab.remote.agent import app as agent_app

    app.add_typer(agent_app, name="remote", hidden=True)


_add_remote_agent()


def main() -> None:
    # SIGPIPE stays ignored (Python's default): set to SIG_DFL it would also kill servelab, silently and with every
    # result in memory lost, the moment an engine closes a connection servelab is still writing a request to.
    # A closed standard output (servelab … | head) is handled by click: a quiet exit 1, no traceback.
    interrupts.install()  # SIGTERM and SIGHUP stop servelab as Ctrl-C does
    try:
        app()
    except EngineFailed as exc:
        err_console.print(f"[bold red]error:[/bold red] {inert_markup(exc.message, multiline=True)}", highlight=False)
        if exc.hint:
            err_console.print(f"hint: {inert(exc.hint, multiline=True)}", markup=False, highlight=False)
        for line in exc.log_tail:
            err_console.print(f"  | {inert(line)}", markup=False, highlight=False)
        sys.exit(exc.exit_code)
    except UserError as exc:
        err_console.print("[bold red]error:[/bold red] "
                          + inert_markup(exc.message + (f" ({exc.hint})" if exc.hint else ""), multiline=True),
                          highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        how = interrupts.received()
        err_console.print("interrupted" + (f" by {signal.Signals(how).name}" if how else ""))
        sys.exit(interrupts.exit_code())
    except SystemExit as exc:
        # typer turns a KeyboardInterrupt in a command into exit 130; SIGTERM and SIGHUP say which they were.
        how = interrupts.received()
        if exc.code == 130 and how is not None:
            err_console.print(f"interrupted by {signal.Signals(how).name}")
            sys.exit(interrupts.exit_code())
        raise
    except Exception:
        if _state["debug"] or os.environ.get("SERVELAB_DEBUG"):
            raise
        exc_type, exc, _ = sys.exc_info()
        err_console.print(f"[bold red]internal error:[/bold red] {exc_type.__name__}: {inert_markup(exc)} "
                          f"(this is a servelab bug; rerun with --debug for the traceback)", highlight=False)
        sys.exit(3)


if __name__ == "__main__":
    main()
