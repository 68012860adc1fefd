"""Other tools' results as runs (compare/peers): vllm bench serve, AIPerf, GuideLLM, read from files the real tools
wrote (tests/fixtures/peers, trimmed; versions in tests/fixtures/README.md), and export --format vllm."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.bench import metrics as m
from servelab.compare.compare import compare_runs, regressions
from servelab.compare.metrics import KEY_METRICS
from servelab.compare.peers import load_peer
from servelab.compare.sources import load_run_dir, resolve
from servelab.errors import UserError
from servelab.store.export import export_run_dir
from servelab.store.rundir import RunDir
from synthetic_runs import synthetic_run

FIX = Path(__file__).parent / "fixtures" / "peers"
VLLM = {c: FIX / f"vllm-c{c}.json" for c in (1, 4)}
AIPERF = {c: FIX / f"aiperf-c{c}" / "profile_export_aiperf.json" for c in (1, 4)}
GUIDELLM = {c: FIX / f"guidellm-c{c}.json" for c in (1, 4)}
SERVELAB = [sys.executable, "-m", "servelab.cli"]


def value(run, key):
    return KEY_METRICS[key].value(run)


def write_run_dir(root: Path, name: str, **kw) -> Path:
    summary, records = synthetic_run(name, **kw)
    rundir = RunDir(root / name)
    for r in records:
        rundir.append_record(r)
    rundir.close()
    rundir.write_json("summary.json", summary)
    return rundir.path


# ---------------------------------------------------------------------------------------------------------------
# Each format: detected, its own figures mapped, definitions stated, per-request data rebuilt
# ---------------------------------------------------------------------------------------------------------------

def test_vllm_result_maps_its_figures():
    doc = json.loads(VLLM[1].read_text())
    run = load_peer(VLLM[1])
    assert run.peer.tool == "vllm bench serve" and run.peer.per_request and run.peer.timeline
    assert value(run, "single.ttft_ms") == pytest.approx(doc["median_ttft_ms"])
    assert value(run, "single.itl_ms") == pytest.approx(doc["median_itl_ms"])
    assert value(run, "single.decode_tok_s") == pytest.approx(1000 / doc["median_tpot_ms"])
    # vLLM times the role chunk: its TTFT is not servelab's, and the importer says so
    assert not run.peer.definition("single.ttft_ms").matches
    assert "role" in run.peer.definition("single.ttft_ms").why
    # per-request lists become records: one per request kept in the file, each with vLLM's own chunk timings
    ok = [r for r in run.records if r.ok]
    assert len(run.records) == len(doc["ttfts"])
    for r, ttft, itl, n in zip(ok, doc["ttfts"], doc["itls"], doc["output_lens"]):
        assert r.output_tokens == n
        assert len(r.events) == len(itl) + 1  # the role chunk, then a chunk per gap
        assert (r.events[-1].t_ns - r.t_send_ns) / 1e9 == pytest.approx(ttft + sum(itl), abs=1e-5)


def test_vllm_concurrency_level_is_load_ttft():
    doc = json.loads(VLLM[4].read_text())
    run = load_peer(VLLM[4])
    fig = KEY_METRICS["load.ttft_ms"]
    assert fig.value(run) == pytest.approx(doc["median_ttft_ms"]) and fig.where(run) == "c4"
    assert value(run, "peak.output_tok_s") == pytest.approx(doc["output_throughput"])
    assert value(run, "single.ttft_ms") is None  # no single-stream level in a c4 file


def test_aiperf_export_with_records():
    doc = json.loads(AIPERF[1].read_text())
    run = load_peer(AIPERF[1])
    assert run.peer.tool == "aiperf" and run.peer.version == doc["aiperf_version"]
    assert value(run, "single.ttft_ms") == pytest.approx(doc["time_to_first_token"]["p50"])
    assert value(run, "single.decode_tok_s") == pytest.approx(doc["output_token_throughput_per_user"]["p50"])
    # same definitions as servelab's: TTFT to the first content, decode = 1/ITL with server-counted tokens
    assert run.peer.definition("single.ttft_ms").matches and run.peer.definition("single.decode_tok_s").matches
    assert not run.peer.definition("single.itl_ms").matches  # inter-chunk, not per token
    lines = [json.loads(x) for x in (AIPERF[1].parent / "profile_export.jsonl").read_text().splitlines() if x]
    assert run.peer.per_request and len(run.records) == len(lines)
    for r, rec in zip(run.records, lines):
        # servelab's own per-request definitions, computed on the rebuilt record, give AIPerf's per-request values
        assert m.ttft_ns(r) / 1e6 == pytest.approx(rec["metrics"]["time_to_first_token"]["value"], abs=1e-3)
        assert m.decode_tok_s(r) == pytest.approx(rec["metrics"]["output_token_throughput_per_user"]["value"],
                                                  rel=1e-4)


def test_aiperf_without_records_is_summary_only(tmp_path):
    shutil.copy(AIPERF[1], tmp_path / "profile_export_aiperf.json")
    run = load_peer(tmp_path / "profile_export_aiperf.json")
    assert not run.peer.per_request and not run.records
    assert value(run, "single.ttft_ms") is not None
    assert any("summary figures only" in n for n in run.peer.notes)


def test_guidellm_benchmarks():
    doc = json.loads(GUIDELLM[1].read_text())
    run = load_peer(GUIDELLM[1])
    b = doc["benchmarks"][0]["metrics"]
    assert run.peer.tool == "guidellm" and run.peer.version == doc["metadata"]["guidellm_version"]
    assert value(run, "single.ttft_ms") == pytest.approx(b["time_to_first_token_ms"]["successful"]["median"])
    assert value(run, "single.decode_tok_s") == pytest.approx(
        1000 / b["inter_token_latency_ms"]["successful"]["median"])
    kept = doc["benchmarks"][0]["requests"]["successful"]
    assert len([r for r in run.records if r.ok]) == len(kept)
    for r, req in zip(run.records, kept):
        t = req["info"]["timings"]
        assert m.ttft_ns(r) / 1e9 == pytest.approx(t["first_token_iteration"] - t["request_start"], abs=1e-5)
    c4 = load_peer(GUIDELLM[4])
    assert KEY_METRICS["load.ttft_ms"].where(c4) == "c4"


# ---------------------------------------------------------------------------------------------------------------
# compare: matching figures judged, differing definitions marked
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("peer", [VLLM[1], AIPERF[1], GUIDELLM[1]], ids=["vllm", "aiperf", "guidellm"])
def test_compare_peer_file_with_servelab_run(tmp_path, peer):
    run_dir = write_run_dir(tmp_path, "servelab-run", itl_ms=15.0, ttft_ms=80.0)
    proc = subprocess.run([*SERVELAB, "compare", str(peer), str(run_dir), "--json"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    comparison = json.loads(proc.stdout)
    peer_run = load_peer(peer)
    assert comparison["runs"][0]["peer"]["tool"] == peer_run.peer.tool
    rows = {r["key"]: r for r in comparison["rows"]}
    assert {"single.decode_tok_s", "single.ttft_ms", "single.itl_ms"} <= set(rows)
    for key, row in rows.items():
        d = peer_run.peer.definition(key)
        verdict = row["ratios"][1]["verdict"]
        if d is None or not d.matches:
            assert verdict == "definition differs", key
            assert row["figures"][0]["definition_differs"]
        else:
            assert verdict in ("better", "worse", "within noise", "inconsistent", "contended", "too few trials"), (key, verdict)
            assert row["figures"][0]["definition_differs"] is None
    # the table says it too
    text = subprocess.run([*SERVELAB, "compare", str(peer), str(run_dir)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path).stdout
    assert "definition differs" in text and peer_run.peer.tool in text


def test_definition_differs_is_never_a_regression(tmp_path):
    aiperf = load_peer(AIPERF[1])
    # a run far slower than every request of the fixtures: TTFT 10x AIPerf's slowest, decode a tenth of its slowest
    ttft = max(m.ttft_ns(r) for r in aiperf.records if r.ok) / 1e6
    decode = min(m.decode_tok_s(r) for r in aiperf.records if r.ok)
    slow = load_run_dir(write_run_dir(tmp_path, "slow", ttft_ms=10 * ttft, itl_ms=10_000 / decode))
    comparison = compare_runs([load_peer(VLLM[1]), slow])
    assert all(row.ratios[1].verdict == "definition differs" for row in comparison.rows)
    assert regressions(comparison, 5) == []
    # the same figures from AIPerf, whose TTFT and decode are defined as servelab's, do fail the gate
    found = regressions(compare_runs([aiperf, slow]), 5)
    assert any("TTFT" in line for line in found) and any("decode" in line for line in found)


def test_show_and_report_take_a_peer_file(tmp_path):
    proc = subprocess.run([*SERVELAB, "show", str(AIPERF[4])], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "c4" in proc.stdout
    out = tmp_path / "r.html"
    proc = subprocess.run([*SERVELAB, "report", str(GUIDELLM[1]), str(write_run_dir(tmp_path, "sl")), "-o",
                           str(out)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert "≠ definition" in html and "guidellm" in html


# ---------------------------------------------------------------------------------------------------------------
# Malformed files: one line naming the file and what is wrong
# ---------------------------------------------------------------------------------------------------------------

def _broken(tmp_path: Path, src: Path, edit) -> Path:
    doc = json.loads(src.read_text())
    edit(doc)
    path = tmp_path / src.name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("case, edit, words", [
    ("vllm ttfts", lambda d: d.__setitem__("ttfts", "fast"), ["'ttfts'", "list"]),
    ("vllm lengths", lambda d: d["itls"].pop(), ["per-request lists differ in length"]),
    ("vllm duration", lambda d: d.pop("duration"), ["has no 'duration'"]),
    ("vllm negative", lambda d: d.__setitem__("median_ttft_ms", -3), ["'median_ttft_ms' is negative"]),
])
def test_malformed_vllm(tmp_path, case, edit, words):
    path = _broken(tmp_path, VLLM[1], edit)
    with pytest.raises(UserError) as err:
        load_peer(path)
    assert str(path) in err.value.message and all(w in err.value.message for w in words), err.value.message


def test_malformed_aiperf_and_guidellm(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    path = _broken(a, AIPERF[1], lambda d: d["time_to_first_token"].__setitem__("p50", "soon"))
    with pytest.raises(UserError, match="time_to_first_token.*should be a number"):
        load_peer(path)
    g = _broken(tmp_path, GUIDELLM[1], lambda d: d.__setitem__("benchmarks", []))
    with pytest.raises(UserError, match="'benchmarks' is empty"):
        load_peer(g)


def test_not_json_and_unknown_json_via_cli(tmp_path):
    bad = tmp_path / "result.json"
    bad.write_text('{"median_ttft_ms": 12,')
    proc = subprocess.run([*SERVELAB, "compare", str(bad), str(VLLM[1])], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and str(bad) in proc.stderr and "not valid JSON" in proc.stderr
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    proc = subprocess.run([*SERVELAB, "compare", str(other), str(VLLM[1])], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "not a result file servelab reads" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# export --format vllm
# ---------------------------------------------------------------------------------------------------------------

def test_export_vllm_round_trip(tmp_path):
    run_dir = write_run_dir(tmp_path, "r", itl_ms=20.0, ttft_ms=50.0)
    paths, _ = export_run_dir(run_dir, "vllm", tmp_path / "out")
    names = sorted(p.name for p in paths)
    assert "vllm-single.json" in names and "vllm-c4.json" in names
    ours = load_run_dir(run_dir)
    doc = json.loads((tmp_path / "out" / "vllm-single.json").read_text())
    single = [r for r in ours.records if r.tag == "single" and not r.warmup and r.ok]
    assert doc["completed"] == len(single) and doc["max_concurrency"] == 1
    assert doc["median_ttft_ms"] == pytest.approx(statistics.median(m.ttft_ns(r) / 1e6 for r in single))
    assert doc["itls"][0] == pytest.approx([g / 1e3 for g in m.chunk_gaps_ms(single[0])])
    # read back by the importer: the same TTFT p50 as servelab's own figure
    back = resolve(str(tmp_path / "out" / "vllm-single.json"), None)
    assert value(back, "single.ttft_ms") == pytest.approx(value(ours, "single.ttft_ms"), rel=1e-6)
    c4 = json.loads((tmp_path / "out" / "vllm-c4.json").read_text())
    assert c4["output_throughput"] == pytest.approx(
        next(s for s in ours.levels if s.tag == "c4").figures["output_tok_s"].value)
