"""`servelab run` with bench steps of any mode, on the real embedded engine (llama.cpp via xllamacpp + SmolLM2):
two configurations (one slot, four) compared on goodput at an SLO (an SLO search) and on a replayed trace, two
interleaved trials each; `compare` and `report` show those figures with intervals and verdicts, or say why there
is no verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SERVELAB = [sys.executable, "-m", "servelab.cli"]
TRACE = Path(__file__).resolve().parent.parent / "examples" / "data" / "mooncake-sample.jsonl"
# What a figure's verdict may be on a shared two-core machine: a direction, noise, or a stated reason for none.
VERDICTS = {"better", "worse", "within noise", "inconsistent", "contended", "too few trials", "no interval"}

EXPERIMENT = f"""name: slo-and-replay
trials: 2
servers: all-up
contention: {{reruns: 0}}
baseline: one-slot
bench:
  max_tokens: 8
  warmup: 1
  min_requests: 3
  steps:
    - {{mode: slo-search, slo: "e2e_p99_ms=3000", rate: 2, max_rate: 4, max_probes: 2, duration: 3,
       max_level_duration: 6}}
    - {{mode: replay, trace: {TRACE}, block_tokens: 16, time_scale: 0.1, requests: 12}}
verify:
  only: [models]
cells:
  - {{name: one-slot, engine: llamacpp, model: smollm2, parallel: 1, threads: 2}}
  - {{name: four-slots, engine: llamacpp, model: smollm2, parallel: 4, threads: 2}}
"""


@pytest.mark.engine
@pytest.mark.slow  # two engines, two trials, two modes: about a minute quiet; the slow tier keeps the default suite short
@pytest.mark.timeout(300)  # about a minute on a quiet 2-core machine
def test_run_compares_two_configurations_on_slo_goodput_and_a_replayed_trace(tmp_path: Path) -> None:
    spec = tmp_path / "exp.yaml"
    spec.write_text(EXPERIMENT)
    out = tmp_path / "runs"
    proc = subprocess.run([*SERVELAB, "run", str(spec), "--out", str(out), "--json"], capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["status"] == "complete"
    for summary in result["runs"]:
        trials = summary["trials"]
        assert [t["index"] for t in trials] == [0, 1] and {t["status"] for t in trials} == {"complete"}
        for trial in trials:  # every trial ran the steps, in order
            assert [s["name"] for s in trial["steps"]] == ["slo-search", "replay"]
            search, replay = (s["result"] for s in trial["steps"])
            assert search["mode"] == "slo-search" and search["search"]["probes"]
            assert replay["mode"] == "replay" and [lv["tag"] for lv in replay["levels"]] == ["trace"]
            assert replay["levels"][0]["ok"] == 12
    rows = {row["key"]: row for row in result["comparison"]["rows"]}
    contended = any(r["contended"] for r in result["comparison"]["runs"])
    wanted = ["slo.max_rate", "slo.goodput_req_s", "replay.lag_ms", "replay.ttft_ms"]
    if contended and not all(k in rows for k in wanted):
        pytest.skip("another tenant kept the machine busy: a search found no rate meeting the target")
    for key in wanted:
        assert key in rows, sorted(rows)
        row = rows[key]
        assert row["figures"][0]["value"] is not None and row["figures"][1]["value"] is not None
        # every trial that counts is counted, paired by round: one that other work on the machine contended is
        # left out (bench/trials.py), and a search's figure is only in a trial whose search found an answer (on a
        # busy machine one may find none)
        counted = [t for t in result["runs"][1]["trials"] if not _contended(t)]
        having = (sum(1 for t in counted if t["steps"][0]["result"]["search"].get("best") is not None)
                  if key.startswith("slo.") else len(counted))
        assert row["figures"][1]["trials"] == having or (contended and row["figures"][1]["trials"] == 1), \
            (key, row["figures"][1], having)
        ratio = row["ratios"][1]
        assert ratio["verdict"] in VERDICTS, ratio
        if ratio["verdict"] == "too few trials":
            assert ratio["reason"].startswith("no verdict")

    # `compare` and `report` read the same runs back from the store
    ids = [c["run_id"] for c in result["cells"]]
    shown = subprocess.run([*SERVELAB, "compare", *ids, "--out", str(out), "--json"], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr[-2000:]
    again = {row["key"]: row for row in json.loads(shown.stdout)["rows"]}
    assert [again[k]["ratios"][1]["verdict"] for k in wanted] == [rows[k]["ratios"][1]["verdict"] for k in wanted]
    html = tmp_path / "report.html"
    made = subprocess.run([*SERVELAB, "report", *ids, "--out", str(out), "-o", str(html)], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr[-2000:]
    page = html.read_text()
    for label in ("highest rate meeting the SLO", "goodput req/s at the SLO search", "replay lag ms",
                  "replay TTFT ms"):
        assert label in page


def _contended(trial: dict) -> bool:
    """As bench/trials.py leaves a trial out: stopped early on a busy machine, or a level of it contended."""
    levels = [lv for step in trial["steps"] for lv in step["result"]["levels"]]
    return trial["status"] == "contended" or any(
        (lv.get("environment") or {}).get("contended") or (lv.get("gpu") or {}).get("contended") for lv in levels)
