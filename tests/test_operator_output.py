"""What an operator sees (issue 13): `up` into a file keeps talking through a long phase, the live panel's text
reads as words, and nothing is refused after `starting` was printed."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from servelab.lifecycle.launch import LaunchStatus
from servelab.lifecycle.ports import free_port
from servelab.records import Verdict
from servelab.report.live import describe_progress, plain_line, render_status

PY = sys.executable
SERVELAB = [PY, "-m", "servelab.cli"]
STAMP = re.compile(r"^\[\s*([\d.]+)s\] (.*)$")


@pytest.mark.slow  # 16 s of replayed start-up by design (a heartbeat every 10 s needs more than 10 s); CI runs it
def test_up_into_a_file_prints_a_status_line_at_least_every_10_s(tmp_path: Path) -> None:
    """The replayed SGLang start-up at speed 20: 12.6 s of weight loading with one log line, 16 s in all. A file
    gets a line when the phase changes and a heartbeat with the evidence in between, never 10 s of silence."""
    out = tmp_path / "up.txt"
    with open(out, "w") as fh:
        proc = subprocess.Popen([*SERVELAB, "up", "replay-sglang", "--option", "speed=20", "--log-dir",
                                 str(tmp_path)], stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "press Ctrl-C" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    text = out.read_text()
    assert "press Ctrl-C" in text, text
    lines = text.splitlines()
    assert lines[0] == "SGLang (replay): starting"
    stamped = [(float(m.group(1)), m.group(2)) for line in lines if (m := STAMP.match(line))]
    ready_s = float(re.search(r"ready in ([\d.]+) s", text).group(1))
    times = [0.0] + [t for t, _ in stamped]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= 10.5, (gaps, text)  # updates come every 0.5 s: a heartbeat is at most that late
    assert ready_s - times[-1] <= 10.5
    weights = [rest for _, rest in stamped if rest.startswith("loading weights")]
    assert len(weights) >= 2, text  # the phase line and at least one heartbeat during it
    heartbeat = weights[-1]
    assert re.search(r"loading weights \(\d+%, ETA \d+ s\)", heartbeat), heartbeat  # progress and ETA
    assert " · moving: " in heartbeat and "read bytes" in heartbeat and heartbeat.endswith("probe down")
    assert "\x1b" not in text


def _status(**kw) -> LaunchStatus:
    base = dict(elapsed_s=42.0, phase="loading model", phase_elapsed_s=30.0, progress=0.4, detail=None,
                last_line="llama_model_load: loading tensors", probe="down", pid=4242)
    base.update(kw)
    return LaunchStatus(**base)


def test_the_live_panel_separates_its_words_and_names_the_state_once() -> None:
    loading = Verdict(state="loading", reason="loading model 40% (ETA 45 s); moving: read bytes",
                      evidence={"quiet_s": 0.2, "budget_s": 300.0, "moving": ["read bytes", "CPU time"]})
    starting = Verdict(state="starting", reason="process started; no recognised log line yet",
                       evidence={"quiet_s": 0.4, "budget_s": 180.0, "moving": []})
    console = Console(record=True, width=100, force_terminal=True)
    console.print(render_status("llama.cpp server", _status(verdict=loading), 100))
    console.print(render_status("llama.cpp server", _status(verdict=starting, phase="starting", progress=None), 100))
    text = console.export_text()
    assert "startingprocess" not in text and "loading loading" not in text
    assert "loading · moving: read bytes, CPU time" in text
    assert "phase loading model · 30 s in it · 40%, ETA 45 s · probe down" in text
    assert "llama.cpp server · pid 4242 · 42.0 s" in text


def test_the_eta_is_unknown_while_nothing_moves() -> None:
    still = Verdict(state="loading", reason="…", evidence={"quiet_s": 12.4, "budget_s": 300.0, "moving": []})
    status = _status(verdict=still)
    assert describe_progress(status) == "40%, ETA unknown: nothing moved for 12 s"
    assert plain_line(status) == ("[  42.0s] loading model (40%, ETA unknown) · nothing moved for 12 s (stall "
                                  "budget 300 s) · probe down")
    stalled = Verdict(state="stalled", reason="nothing moved for 301 s in phase 'loading model' (budget 300 s)",
                      evidence={"quiet_s": 301.0, "budget_s": 300.0, "moving": []})
    assert describe_progress(_status(verdict=stalled)) == "40%, ETA unknown: stalled for 301 s"
    assert "STALLED: nothing moved for 301 s" in plain_line(_status(verdict=stalled))
    moving = Verdict(state="loading", reason="…", evidence={"quiet_s": 0.5, "budget_s": 300.0, "moving": ["RSS"]})
    assert describe_progress(_status(verdict=moving)) == "40%, ETA 45 s"


def test_up_refuses_a_missing_model_and_a_busy_port_before_starting(tmp_path: Path) -> None:
    import socket

    done = subprocess.run([*SERVELAB, "up", "llamacpp", "--model", "nosuchmodel", "--log-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nosuchmodel" in done.stderr
    assert "starting" not in done.stdout + done.stderr
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run([*SERVELAB, "up", "replay-sglang", "--port", str(port), "--log-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"port {port}" in done.stderr and "already in use" in done.stderr
    assert "starting" not in done.stdout + done.stderr


def test_bench_out_stores_the_run_warns_of_an_unlisted_model_and_show_finds_it(tmp_path: Path) -> None:
    server = subprocess.Popen([PY, "-m", "servelab.calibration.server", "--port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        _, host, port = server.stdout.readline().split()
        done = subprocess.run([*SERVELAB, "bench", f"http://{host}:{port}", "--mode", "single", "--requests", "3",
                               "--max-tokens", "8", "--model", "gpt-4o", "--out", "runs"], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
    finally:
        server.kill()
        server.wait()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning: model 'gpt-4o' is not among the models the server lists (calibration)" in done.stdout
    run_id = re.search(r"stored as run (\S+) in runs/servelab.db", done.stdout).group(1)
    listed = subprocess.run([*SERVELAB, "runs"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run_id in listed.stdout and "gpt-4o" in listed.stdout
    shown = subprocess.run([*SERVELAB, "show", run_id], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "single bench" in shown.stdout and "single-stream decode tok/s" in shown.stdout
    # From another directory there is no store: one sentence that says where it looked and what to do.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lost = subprocess.run([*SERVELAB, "show", run_id], capture_output=True, text=True, timeout=60, cwd=elsewhere)
    assert lost.returncode == 2
    assert (f"'{run_id}' is not a run directory, and there is no run store at {elsewhere / 'runs' / 'servelab.db'}"
            in lost.stderr)
    assert "--out DIR or --store FILE" in lost.stderr
    found = subprocess.run([*SERVELAB, "show", run_id, "--out", str(tmp_path / "runs")], capture_output=True,
                           text=True, timeout=60, cwd=elsewhere)
    assert found.returncode == 0, found.stderr


def test_spec_decoding_acceptance_is_printed_in_the_terminal() -> None:
    import io

    from servelab.records import ServerEvidence, SpecDecode
    from servelab.report.terminal import level_line, render_levels
    from synthetic_runs import synthetic_run

    summary, _ = synthetic_run("spec")
    bench = summary.trials[0].single
    level = bench.levels[0]
    level.server = ServerEvidence(spec_decode=SpecDecode(drafted_tokens=1000, accepted_tokens=720, drafts=250,
                                                         acceptance_rate=0.72, mean_accepted_length=3.88,
                                                         source="llamacpp:spec_decode_* counters (/metrics)"))
    console = Console(file=io.StringIO(), width=200)
    render_levels(console, bench)
    text = console.file.getvalue()
    assert ("single speculative decoding: acceptance 72.0 %, 720 of 1,000 drafted tokens accepted, 3.88 tokens "
            "per verification step") in text
    assert level_line(level).endswith(", spec-decode acceptance 72 %")


def test_the_transformers_example_points_where_the_setup_script_puts_the_model() -> None:
    from servelab.experiment.load import load_experiment

    root = Path(__file__).resolve().parent.parent
    experiment = load_experiment(root / "examples" / "llamacpp-vs-transformers.yaml")
    cell = next(c for c in experiment.cells if c.engine == "transformers-serve")
    script = (root / "scripts" / "setup-slow-engines.sh").read_text()
    assert 'VENV="${SERVELAB_TF_VENV:-.venv-tf}"' in script and 'MODEL_DIR="$VENV/models/smollm2-hf"' in script
    assert cell.model == ".venv-tf/models/smollm2-hf" and cell.executable == ".venv-tf/bin/python"
    assert "scripts/setup-slow-engines.sh" in (root / "docs" / "compare.md").read_text()
