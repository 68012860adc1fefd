"""`servelab bench`'s options are BenchArgs' fields: the command's parameters are built from them, with their help
text and defaults, and docs/cli.md is generated from the same declaration."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from servelab.bench.args import BenchArgs
from servelab.cli import app
from servelab.cli_options import FLAG, option, options_from

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_OPTIONS = ("out", "store", "csv", "keep_events_text", "as_json")  # where the run is kept, not how it runs
REMOTE_OPTIONS = ("on", "remote_python", "remote_dir")  # where it runs (servelab/remote/), not how


def bench_params():
    command = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_every_field_is_an_option_with_its_help_and_default():
    params = bench_params()
    fields = dataclasses.fields(BenchArgs)
    assert [n for n in params if n not in ("url", *OUTPUT_OPTIONS, *REMOTE_OPTIONS)] == [f.name for f in fields]
    for f in fields:
        param, flag = params[f.name], f.metadata[FLAG]
        assert param.help == flag.help and param.help, f.name
        assert f"--{f.name.replace('_', '-')}" in param.opts, f.name
        expected = None if f.name == "endpoint" else f.default  # the command's "not given" is None (replay)
        assert param.default == expected, f.name
    assert params["model"].opts == ["--model", "-m"] and params["api_key"].envvar == "SERVELAB_API_KEY"
    assert params["ignore_eos"].secondary_opts == ["--no-ignore-eos"]


def test_the_command_hands_its_options_to_bench_args(monkeypatch):
    from typer.testing import CliRunner

    import servelab.bench.options as options

    seen = {}

    def stop(args):
        seen["args"] = args
        raise typer.Exit(0)

    monkeypatch.setattr(options, "build_options", stop)
    done = CliRunner().invoke(app, ["bench", "http://127.0.0.1:9", "--mode", "rate", "--rate", "4", "--warmup", "3",
                                    "-m", "m1", "--no-ignore-eos", "--dataset", "d.jsonl", "--timeout-idle", "5"])
    assert done.exit_code == 0, done.output
    assert seen["args"] == BenchArgs(mode="rate", rate="4", warmup="3", model="m1", ignore_eos=False,
                                     dataset=Path("d.jsonl"), timeout_idle=5.0, endpoint=None)


def test_a_field_without_a_flag_is_refused():
    @dataclasses.dataclass
    class Args:
        given: int = option(1, "Declared.")
        bare: int = 2

    with pytest.raises(TypeError, match="bare"):
        options_from(Args, after="url")(lambda url, **kw: None)


def test_docs_cli_md_is_up_to_date():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_docs.py"), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_mode_help_names_every_registered_mode_with_its_description():
    """The help is written out (args.py must not import the whole bench to build it); a mode added to the
    registry without its line there fails here."""
    from servelab.bench.modes import MODES

    help_text = " ".join(bench_params()["mode"].help.split())
    for name, mode in MODES.items():
        assert f"{name} ({mode.description})" in help_text, name
