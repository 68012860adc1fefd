"""servelab from Python: `servelab.bench(url, ...)` and `servelab.run(experiment, ...)`, for notebooks and CI
scripts (docs/api.md).

Each runs exactly what its command runs: `bench` validates its options with `servelab bench`'s rules
(bench/options.py), measures and keeps the run through bench_session.py as the command does; `run` runs an
experiment through experiment/runner.py as `servelab run` does. They differ from the commands only in what they
print (nothing, unless given a console) and in how they end: they return the typed result instead of an exit
code, and a problem the user can fix is raised as servelab.errors.UserError (EngineFailed for an engine that
died or never became ready), never printed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import TypeAdapter, ValidationError
from rich.console import Console

from servelab import interrupts
from servelab.bench.args import as_command_text
from servelab.bench.options import BenchArgs, build_options
from servelab.bench_session import BenchOutput, BenchSession, BenchRun, render_bench
from servelab.errors import EngineFailed, UserError
from servelab.experiment.model import Experiment
from servelab.experiment.runner import ExperimentOptions, ExperimentResult, run_experiment

__all__ = ["BenchArgs", "BenchRun", "EngineFailed", "Experiment", "ExperimentResult", "UserError", "bench", "run"]

ConsoleArg = Console | bool | None
T = TypeVar("T")


def bench(url: str, config: BenchArgs | Mapping[str, Any] | None = None, /, *, out: str | Path | None = None,
          store: str | Path | None = None, csv: bool = False, keep_events_text: bool = False,
          console: ConsoleArg = None, **options: Any) -> BenchRun:
    """Benchmark the OpenAI-compatible server at `url`, as `servelab bench URL` does.

    The bench's options are `servelab bench`'s, named as BenchArgs names them (`--max-tokens` is `max_tokens`):
    given as keywords, or as `config` (a BenchArgs, or a mapping whose keys may also be spelt with `-`), the
    keywords winning. A few take Python values as well as the command's text: `rate` a number or a list of
    numbers, `slo` a mapping such as {"ttft_p99_ms": 500}, `dataset` a str or a Path.

    `out`: write the run directory under this directory and store the run in its servelab.db (`store` names
    another store), as `--out` does; `csv` and `keep_events_text` as `--csv` and `--keep-events-text`.
    `console`: where progress and the result's tables go (a rich Console, or True for servelab's terminal
    console); None, the default, prints nothing.

    Returns a BenchRun: `.result` (records.BenchResult: levels, headline figures, workload, warnings), `.headline`,
    `.error_gate` (why `max_error_rate` failed the bench, where `servelab bench` exits 1; `.failed` says whether),
    `.run_dir`, `.run_id` and `.stored_in` (with `out`), and `.write_errors` (what a full disk or a failing
    store kept from being written; the result is complete regardless).

    Raises UserError for an option the command refuses (the same message), an unreachable server or a damaged
    store, before anything is measured. Ctrl-C during the measurement ends it: the partial result is kept and
    returned with `.result.interrupted` set; a Ctrl-C while the results are being written is raised as
    KeyboardInterrupt once they are written.
    """
    args = bench_args(config, options)
    return _on_own_loop(lambda: _bench(url, args, BenchOutput(out=_path(out), store=_path(store), csv=csv,
                                                              keep_events_text=keep_events_text),
                                       _console(console)))


def run(experiment: str | Path | Mapping[str, Any] | Experiment | None = None, /, *, out: str | Path = "runs",
        store: str | Path | None = None, resume: Literal["auto", "require", "never"] = "auto",
        report: bool = True, console: ConsoleArg = None) -> ExperimentResult:
    """Run an experiment, as `servelab run` does: every cell's trials (up, verify, bench, down), each cell's run
    directory under `out` and in the store, then the comparison and the HTML report.

    `experiment`: the path of an experiment file (YAML, docs/compare.md), the same as a mapping, or an
    experiment.model.Experiment; None: the embedded default (the bundled engine misconfigured against well
    configured). `resume`: "auto" resumes an unfinished experiment of the same name, "require" resumes the latest
    even if it completed (`--resume`), "never" starts afresh (`--new`). `report`: write report.html.
    `console`: as for `bench` (None: nothing printed).

    Returns the ExperimentResult: `.status` (complete, interrupted, contended), `.cells` (each cell's outcome and
    run id), `.runs` (their RunSummary), `.comparison` (compare.Comparison: every figure side by side with ratios,
    intervals and verdicts; None with `.comparison_error` saying why), `.report`, `.write_errors`, `.any_failed`.

    Raises UserError for an experiment that is not valid (naming the file's line, or the setting), a damaged
    store, or the experiment already running elsewhere. A cell whose engine fails is not raised: it is marked
    failed in `.cells` and the experiment goes on. Ctrl-C stops the engines, keeps what was measured and returns
    with status "interrupted"; running it again resumes.
    """
    spec, source = _experiment(experiment)
    options = ExperimentOptions(out_root=Path(out), store_path=_path(store), resume=resume, source=source,
                                write_report=report)
    return _on_own_loop(lambda: run_experiment(spec, options, _console(console)))


def bench_args(config: BenchArgs | Mapping[str, Any] | None, options: Mapping[str, Any]) -> BenchArgs:
    """The bench's options as BenchArgs: `config` with `options` laid over it, each checked for its name and type
    (what typer checks for the command); the rules between them are build_options', checked by `bench`."""
    if config is None:
        given: dict[str, Any] = {}
    elif isinstance(config, BenchArgs):
        given = {name: getattr(config, name) for name in _option_types()}
    elif isinstance(config, Mapping):
        given = {str(k).replace("-", "_"): v for k, v in config.items()}
    else:
        raise UserError(f"the bench configuration is a BenchArgs or a mapping of options, not "
                        f"{type(config).__name__}")
    given.update(options)
    fields = _option_types()
    for name, value in given.items():
        if name not in fields:
            close = difflib.get_close_matches(name, fields, n=1)
            raise UserError(f"unknown bench option '{name}'",
                            hint=f"did you mean {close[0]}?" if close else "the options are servelab bench's, "
                                                                            "with _ for -")
        if isinstance(value, bool) and fields[name] not in (bool, "bool"):
            raise UserError(f"--{_flag(name)} is not a yes/no option (got {value})")
    given = as_command_text(given)
    try:
        return TypeAdapter(BenchArgs).validate_python(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "options"
        raise UserError(f"--{_flag(name)} {given.get(name)!r}: {first['msg']}") from None


def _bench(url: str, args: BenchArgs, output: BenchOutput, ui: Console) -> BenchRun:
    options = build_options(args)
    session = BenchSession.open(output, args.mode)
    result = session.measure(url, options, ui)
    with interrupts.deferred() as held:  # the results are written whole, whatever Ctrl-C does meanwhile
        kept = session.keep(result, options)
        if not ui.quiet:
            render_bench(ui, kept)
            for line in kept.write_errors:
                ui.print(f"error: {line}", markup=False, highlight=False)
            for reason in kept.error_gate:
                ui.print(f"error gate: {reason}", markup=False, highlight=False)
    if held:
        raise KeyboardInterrupt
    return kept


def _experiment(experiment: str | Path | Mapping[str, Any] | Experiment | None) -> tuple[Experiment, str]:
    from servelab.experiment.default import default_experiment
    from servelab.experiment.load import dotted, load_experiment

    if experiment is None:
        return default_experiment(), "embedded default"
    if isinstance(experiment, Experiment):
        return experiment, "python"
    if isinstance(experiment, (str, Path)):
        return load_experiment(Path(experiment)), str(experiment)
    if isinstance(experiment, Mapping):
        try:
            return Experiment.model_validate(dict(experiment)), "python"
        except ValidationError as exc:
            errors = exc.errors()
            first = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            what = "unknown setting (misspelt?)" if first["type"] == "extra_forbidden" else \
                "required but missing" if first["type"] == "missing" else \
                str(first["msg"]).removeprefix("Value error, ")
            raise UserError(f"experiment: {dotted(tuple(first['loc'])) or 'the mapping'}: {what}{more}") from None
    raise UserError(f"an experiment is a file's path, a mapping or an Experiment, not {type(experiment).__name__}")


def _option_types() -> dict[str, Any]:
    """BenchArgs' fields and their types."""
    return {f.name: f.type for f in dataclasses.fields(BenchArgs)}


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def _console(console: ConsoleArg) -> Console:
    if console is None or console is False:
        return Console(file=io.StringIO(), quiet=True)
    if console is True:
        from servelab.report.tables import make_console

        return make_console()
    return console


def _on_own_loop(call: Callable[[], T]) -> T:
    """Run `call`, which runs its own event loop: where one is running already (a notebook's), in a thread of its
    own, since a thread holds one loop at a time. There, interrupting the kernel does not reach it."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="servelab") as pool:
        return pool.submit(call).result()
