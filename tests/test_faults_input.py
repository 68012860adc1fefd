"""Faults that come in with what servelab is given or answered (issue 11): secrets that must never be written or
printed, untrusted text printed inert, hostile experiment files and datasets. Each test names its item of the
issue; servers are local fakes (the calibration server, tests/openai_fake.py), files are real files."""

from __future__ import annotations

import io
import time
import json
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from servelab.store.rundir import read_records
from rich.console import Console

from openai_fake import FakeOpenAI, error_body, serving
from servelab.calibration import Script, start_calibration_server
from servelab.experiment.load import parse_experiment
from servelab.experiment.runner import ExperimentOptions, run_experiment
from servelab.redaction import REDACTED, redact_command, redact_env, redact_text

SERVELAB = [sys.executable, "-m", "servelab.cli"]
MARK = "S3CRETMARK"  # every secret in these tests contains it: one grep finds any that leaked


def files_with(root: Path, needle: str) -> list[str]:
    """Every file under `root` whose bytes contain `needle` (SQLite pages, WAL and HTML included)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


@pytest.fixture(scope="module")
def calibration():
    with start_calibration_server(Script(output_tokens=6, ttft_ms=5, itl_ms=3)) as cal:
        yield cal


# --------------------------------------------------------------------------------------------------------------
# Secrets (items 9, 21, 22)
# --------------------------------------------------------------------------------------------------------------

def test_every_secret_flag_and_env_name_of_the_issue_is_redacted():
    """Item 9: --admin-api-key, --api-keys, --openai-api-key, -k, --key, --bearer-token, --auth, MY_PAT, GH_PAT and
    a password inside HTTP_PROXY are hidden; switches and look-alike flags (--max-tokens, --tokenizer,
    --disable-auth, -kvu, PATH) are kept."""
    argv = ["serve", "m", "--admin-api-key", "a1", "--api-keys", "a2,a3", "--openai-api-key=a4", "-k", "a5",
            "--key", "a6", "--bearer-token", "a7", "--auth", "a8", "--disable-auth", "--max-tokens", "16",
            "--tokenizer", "tok", "-kvu", "--proxy", "http://u:a9@proxy:3128", "--seed", "-1", "--x",
            "sk-proj-abcdefghijklmnopqrstu"]
    assert redact_command(argv) == [
        "serve", "m", "--admin-api-key", REDACTED, "--api-keys", REDACTED, f"--openai-api-key={REDACTED}", "-k",
        REDACTED, "--key", REDACTED, "--bearer-token", REDACTED, "--auth", REDACTED, "--disable-auth",
        "--max-tokens", "16", "--tokenizer", "tok", "-kvu", "--proxy", f"http://{REDACTED}@proxy:3128", "--seed",
        "-1", "--x", REDACTED]
    env = {"MY_PAT": "b1", "GH_PAT": "b2", "HTTP_PROXY": "http://u:b3@proxy:3128", "PATH": "/bin",
           "PYTHONPATH": "/src", "DB_PASSWD": "b4"}
    assert redact_env(env) == {"MY_PAT": REDACTED, "GH_PAT": REDACTED, "HTTP_PROXY": f"http://{REDACTED}@proxy:3128",
                               "PATH": "/bin", "PYTHONPATH": "/src", "DB_PASSWD": REDACTED}


def test_no_secret_of_a_cell_or_its_url_reaches_any_file_or_the_terminal(tmp_path: Path, calibration):
    """Items 9 and 21: an experiment whose launched cell has every secret flag of the issue in its command line
    and secrets in its environment, and whose URL cell has a password in its URL, writes none of them anywhere
    (summary.json, cell.json, records.jsonl, experiment.json, report.html, the store) nor prints one."""
    port_arg = '"$0"'
    launched = {
        "name": "launched", "engine": "command", "model": "calibration",
        "extra_args": ["sh", "-c", f"exec {sys.executable} -m servelab.calibration.server --port {port_arg}",
                       "{port}", "--admin-api-key", f"{MARK}1", "--api-keys", f"{MARK}2", "--openai-api-key",
                       f"{MARK}3", "-k", f"{MARK}4", "--key", f"{MARK}5", "--bearer-token", f"{MARK}6", "--auth",
                       f"{MARK}7", "--api-key", f"{MARK}8"],
        "env": {"MY_PAT": f"{MARK}9", "GH_PAT": f"{MARK}10", "HF_TOKEN": f"{MARK}11",
                "HTTP_PROXY": f"http://user:{MARK}12@proxy.invalid:3128"},
        "options": {"probe_path": "/health"}}
    url_cell = {"name": "by-url", "url": calibration.url.replace("http://", f"http://alice:{MARK}13@")}
    doc = {"name": "secrets", "bench": {"single_requests": 2, "max_tokens": 4, "warmup": 0, "sweep": False},
           "verify": {"enabled": False}, "contention": {"reruns": 0}, "cells": [launched, url_cell]}
    out = io.StringIO()
    result = run_experiment(parse_experiment(json.dumps(doc), "secrets.yaml"),
                            ExperimentOptions(out_root=tmp_path), Console(file=out, width=200))
    assert [c.status for c in result.cells] == ["complete", "complete"], result.cells
    summary = json.loads((Path(result.cells[0].run_dir) / "summary.json").read_text())
    command = summary["provenance"]["command"]
    assert command[command.index("--admin-api-key") + 1] == REDACTED  # recorded, hidden
    assert summary["provenance"]["env"]["HTTP_PROXY"] == f"http://{REDACTED}@proxy.invalid:3128"
    assert Path(result.report).is_file()
    assert files_with(tmp_path, MARK) == []
    assert MARK not in out.getvalue()


def test_a_password_in_the_bench_url_is_neither_written_nor_printed(tmp_path: Path, calibration):
    """Item 21: `bench http://user:secret@host` measures the server and keeps the URL without its password."""
    url = calibration.url.replace("http://", f"http://alice:{MARK}@")
    done = subprocess.run([*SERVELAB, "bench", url, "--requests", "2", "--max-tokens", "4", "--warmup", "0",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (summary,) = tmp_path.glob("*/summary.json")
    assert json.loads(summary.read_text())["url"] == calibration.url.replace("http://", f"http://{REDACTED}@")
    assert files_with(tmp_path, MARK) == []
    assert MARK not in done.stdout + done.stderr


def echoing_server() -> FakeOpenAI:
    """A server that answers 401 and quotes the credentials it was sent, as some gateways do."""
    async def deny(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        key = header.removeprefix("Bearer ")
        body = error_body(f"invalid api key {key!r} (header was {header!r})", "authentication_error")
        return web.json_response(body, status=401)
    return FakeOpenAI(chat_route=deny, completions=deny)


def test_a_key_the_server_echoes_is_not_recorded_or_printed(tmp_path: Path):
    """Item 22: a server that quotes the API key back in its 401 body: the key is hidden from records.jsonl,
    summary.json (top errors) and the terminal of bench, and from verify's reasons, excerpts and output."""
    key = f"{MARK}-key-22"
    with serving(echoing_server().app()) as url:
        bench = subprocess.run([*SERVELAB, "bench", url, "--model", "fake", "--requests", "3", "--warmup", "0",
                                "--max-tokens", "4", "--api-key", key, "--out", str(tmp_path / "bench")],
                               capture_output=True, text=True, timeout=120)
        verify = subprocess.run([*SERVELAB, "verify", url, "--model", "fake", "--api-key", key, "--json"],
                                capture_output=True, text=True, timeout=120)
        shown = subprocess.run([*SERVELAB, "verify", url, "--model", "fake", "--api-key", key],
                               capture_output=True, text=True, timeout=120)
    assert bench.returncode == 1, bench.stderr  # every request failed: the error gate
    (records,) = (tmp_path / "bench").glob("*/records.jsonl.gz")
    details = [r.error_detail for r in read_records(records)]
    assert details and all("HTTP 401" in d or "401" in d or "invalid api key" in d for d in details), details
    assert any(REDACTED in d for d in details), details  # the excerpt is kept, the key in it hidden
    assert files_with(tmp_path, MARK) == []
    assert MARK not in bench.stdout + bench.stderr
    checks = json.loads(verify.stdout)["checks"]
    assert any(c["outcome"] == "fail" and "401" in c["reason"] for c in checks)
    assert MARK not in verify.stdout + verify.stderr + shown.stdout + shown.stderr


def test_redact_text_hides_the_key_bearer_tokens_and_url_credentials():
    """Item 22: the rule applied to what a server said."""
    said = f"bad key {MARK}x; Authorization: Bearer abc.def-123; from http://u:{MARK}y@host/x"
    assert redact_text(said, [f"{MARK}x"]) == (f"bad key {REDACTED}; Authorization: Bearer {REDACTED}; "
                                                f"from http://{REDACTED}@host/x")


# --------------------------------------------------------------------------------------------------------------
# Untrusted text printed inert (item 8)
# --------------------------------------------------------------------------------------------------------------

# Clear the screen, set the window title, plant an OSC-8 hyperlink, and rich markup.
EVIL = "m\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.invalid\x07link\x1b]8;;\x07[bold]B[/bold]\r\u202e"


def assert_inert(output: str) -> None:
    """No sequence of the hostile text reached the output as a control: no OSC, no clear-screen, no bell, no CR
    overwrite, no bidi override; `[bold]` printed as text."""
    for raw in ("\x1b]", "\x1b[2J", "\x07", "\r", "\u202e"):
        assert raw not in output, (raw, output)
    assert "[bold]B[/bold]" in output or "\\[bold]B" in output or "[bold]B" in output, output


def test_inert_shows_controls_as_escapes_and_keeps_markup_as_text():
    """Item 8: the helper itself."""
    from servelab.textsafe import inert, inert_markup

    assert inert("a\x1b[2Jb\x07\u202e") == "a\\x1b[2Jb\\x07\\u202e"
    assert inert("line\nnext\ttab") == "line\\x0anext\\x09tab"
    assert inert("line\nnext", multiline=True) == "line\nnext"
    assert inert_markup("[bold]x[/bold]") == "\\[bold]x\\[/bold]"


def test_a_hostile_model_id_from_the_server_is_printed_inert():
    """Item 8: a server whose model id carries ANSI/OSC escapes and rich markup: verify and bench print it with
    every control shown as an escape and `[bold]` as text, on a terminal (colours forced) and in a pipe."""
    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": EVIL, "object": "model"}]})

    env = {**__import__("os").environ, "FORCE_COLOR": "1", "COLUMNS": "200"}
    with serving(FakeOpenAI(models=models).app()) as url:
        runs = [subprocess.run([*SERVELAB, "verify", url], capture_output=True, text=True, timeout=120, env=env),
                subprocess.run([*SERVELAB, "verify", url], capture_output=True, text=True, timeout=120),
                subprocess.run([*SERVELAB, "bench", url, "--requests", "2", "--warmup", "0", "--max-tokens", "4"],
                               capture_output=True, text=True, timeout=120, env=env),
                subprocess.run([*SERVELAB, "bench", url, "--model", EVIL, "--requests", "2", "--warmup", "0",
                                "--max-tokens", "4"], capture_output=True, text=True, timeout=120)]
    for done in runs:
        assert done.returncode in (0, 1), done.stderr
        assert "\\x1b" in done.stdout + done.stderr  # the id was printed, its escapes visible
        assert_inert(done.stdout + done.stderr)


def test_hostile_names_in_the_run_list_comparison_and_errors_are_printed_inert():
    """Item 8: cell names, run ids, models and reasons from the store, and a UserError carrying a hostile text,
    rendered on a forced terminal."""
    from servelab.errors import UserError
    from servelab.report.compare_terminal import render_runs
    from servelab.store.runs import RunRow
    from servelab.textsafe import InertConsole

    out = io.StringIO()
    console = InertConsole(file=out, force_terminal=True, width=200)
    render_runs(console, [RunRow(run_id=f"exp/{EVIL}", started_at=None, status="complete", engine=EVIL, model=EVIL,
                                 cell_name=EVIL, experiment_id=None, representative=True, decode_tok_s=1.0,
                                 peak_output_tok_s=2.0, run_dir=None)])
    console.print(f"plain str through the console: {EVIL}", markup=False)  # the backstop
    assert_inert(out.getvalue())
    assert "\x1b[" in out.getvalue()  # rich's own colours still work on a terminal

    import servelab.cli as cli

    err = io.StringIO()
    cli.err_console.file = err
    try:
        with pytest.raises(SystemExit) as exit_info:
            def raise_it() -> None:
                raise UserError(f"no model {EVIL}")
            original = cli.app
            cli.app = raise_it
            try:
                cli.main()
            finally:
                cli.app = original
    finally:
        cli.err_console.file = sys.stderr
    assert exit_info.value.code == 2
    assert_inert(err.getvalue())
    assert "[bold]B[/bold]" in err.getvalue()


# --------------------------------------------------------------------------------------------------------------
# Hostile experiment files (item 17) and datasets (item 18): one line naming the file (and line), exit 2, fast
# --------------------------------------------------------------------------------------------------------------

def bounded_memory() -> None:
    """preexec_fn: a hostile input that a regression lets grow memory fails this process, not the machine."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def billion_laughs() -> str:
    """Nine aliases of nine: 9^9 (~387 million) values from a file of a dozen lines."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines + ["name: laughs", "cells: *i", ""])


HOSTILE_EXPERIMENTS = {
    "billion laughs": (billion_laughs().encode(), "expand to more than"),
    "recursive alias": (b"name: &a [*a]\ncells: []\n", "contains itself"),
    "deep nesting": (b"name: x\ncells: " + b"[" * 20000 + b"]" * 20000 + b"\n", "nested too deeply"),
    "binary": (bytes(range(256)) * 8, "not UTF-8"),
    "NUL in text": (b"name: x\ncells: []\x00\n", "not valid YAML"),
}


@pytest.mark.parametrize("name", HOSTILE_EXPERIMENTS)
def test_a_hostile_experiment_file_is_one_line_and_exit_2(tmp_path: Path, name: str):
    """Item 17: a billion-laughs file, `name: &a [*a]`, 20,000-deep nesting, a binary file and a NUL byte: each is
    one line naming the file (and line), exit 2, within seconds and without growing memory."""
    content, words = HOSTILE_EXPERIMENTS[name]
    path = tmp_path / "exp.yaml"
    path.write_bytes(content)
    started = time.monotonic()
    done = subprocess.run([*SERVELAB, "run", str(path), "--out", str(tmp_path / "runs")], capture_output=True,
                          text=True, timeout=120, preexec_fn=bounded_memory)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(f"error: {path}") and words in line, line
    assert time.monotonic() - started < 60
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_endless_experiment_file_is_refused_by_size(tmp_path: Path):
    """Item 17: /dev/zero as an experiment file: read no further than the size bound."""
    from servelab.errors import UserError
    from servelab.experiment.load import load_experiment

    with pytest.raises(UserError) as info:
        load_experiment(Path("/dev/zero"))
    assert info.value.message.startswith("/dev/zero: larger than")


def jsonl_with(tmp_path: Path, line: bytes, name: str = "d.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b'{"prompt": "hello"}\n{"prompt": "again"}\n' + line + b"\n")
    return path


HOSTILE_DATASETS = {
    "deep nesting": (b'{"prompt": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ":3: JSON nested too"),
    "lone surrogate": (b'{"prompt": "bad \\ud800 text"}', ":3: prompt holds a lone surrogate (\\ud800"),
    "absurd max_tokens": (b'{"prompt": "x", "max_tokens": 100000000000000000000000}', ":3: max_tokens 100"),
    "NUL bytes": (b"\x00" * 64, ":3: binary data (a NUL byte at byte 40)"),
}


@pytest.mark.parametrize("name", HOSTILE_DATASETS)
def test_a_hostile_dataset_is_one_line_naming_file_and_line(tmp_path: Path, calibration, name: str):
    """Item 18: a JSONL line nested 100,000 deep, a lone surrogate, max_tokens 10^23 and binary data: one line
    naming the file and its line, exit 2, nothing sent."""
    line, words = HOSTILE_DATASETS[name]
    path = jsonl_with(tmp_path, line)
    done = subprocess.run([*SERVELAB, "bench", calibration.url, "--dataset", str(path), "--requests", "2"],
                          capture_output=True, text=True, timeout=120, preexec_fn=bounded_memory)
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip()
    assert "\n" not in message and f"{path}{words}" in message, message


def test_dev_zero_as_a_dataset_is_refused_at_once(calibration):
    """Item 18: `--dataset /dev/zero` (it was read until the OOM killer struck at 24 GB) stops at the first
    block: a NUL byte is binary data."""
    started = time.monotonic()
    done = subprocess.run([*SERVELAB, "bench", calibration.url, "--dataset", "/dev/zero", "--dataset-format",
                           "jsonl"], capture_output=True, text=True, timeout=120, preexec_fn=bounded_memory)
    assert done.returncode == 2 and "/dev/zero:1: binary data" in done.stderr, done.stderr
    assert time.monotonic() - started < 60


def test_a_dataset_larger_than_the_bound_is_refused(tmp_path: Path, monkeypatch):
    """Item 18: reading stops once the bound is passed (a small bound here, the real one is 2 GiB), and a
    ShareGPT file nested too deeply or holding a surrogate is named too."""
    from servelab.bench.workloads import dataset
    from servelab.bench.workloads.sharegpt import load_sharegpt
    from servelab.errors import UserError

    big = tmp_path / "big.jsonl"
    big.write_text('{"prompt": "hello"}\n' * 10_000)
    monkeypatch.setattr(dataset, "MAX_DATASET_BYTES", 64 * 1024)
    with pytest.raises(UserError) as info:
        dataset.read_text(big)
    assert info.value.message == f"{big}: more than 65,536 bytes: larger than servelab reads as a dataset"
    monkeypatch.undo()
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nested too deeply"):
        load_sharegpt(deep)
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps([{"conversations": [{"from": "human", "value": "ok"},
                                                  {"from": "gpt", "value": "bad \ud800"}]}]))
    with pytest.raises(UserError) as info:
        load_sharegpt(odd)
    assert f"{odd}: item 0" in info.value.message and "lone surrogate" in info.value.message


def test_url_credentials_and_an_api_key_together_are_one_line_not_a_crash() -> None:
    """Both set the Authorization header: refused with exit 2 naming the clash, the password never printed (the
    fault matrix's case 56: the HTTP layer raised inside every request)."""
    import subprocess
    import sys

    for command in (["bench", "http://alice:SECRET-PW@127.0.0.1:9", "--model", "m"],
                    ["verify", "http://alice:SECRET-PW@127.0.0.1:9"]):
        proc = subprocess.run([sys.executable, "-m", "servelab.cli", *command, "--api-key", "sk-test-key"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "Authorization" in proc.stderr and "internal error" not in proc.stderr
        assert "SECRET-PW" not in proc.stderr + proc.stdout and "sk-test-key" not in proc.stderr + proc.stdout
