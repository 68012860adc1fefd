"""Steady state or no figure (docs/metrics.md#steady-state): a level runs until its window holds enough completed
requests and lasts a few of their latencies, within a cap; a level the cap (or a request budget) ends first says
"not measured" with the counts instead of printing 0; the cap cancels what is still in flight after a grace; an
open-loop level says when the server did not keep up; slo-search never calls an unmeasured level met."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.bench.steady import SteadyRule, earliest_end, judge
from servelab.calibration import Script, start_calibration_server
from servelab.records import RequestRecord, TokenEvent
from servelab.store.rundir import read_records

SERVELAB = [sys.executable, "-m", "servelab.cli"]
S = 1_000_000_000


@pytest.fixture(scope="module")
def slow():
    """Every answer takes ~0.5 s: 5 tokens, 100 ms apart."""
    with start_calibration_server(Script(ttft_ms=100, itl_ms=100, output_tokens=5)) as handle:
        yield handle


@pytest.fixture(scope="module")
def endless():
    """Answers of 30 s (30 tokens, a second apart): always in flight when a short level's cap comes."""
    with start_calibration_server(Script(ttft_ms=100, itl_ms=1000, output_tokens=30)) as handle:
        yield handle


def options(**kw):
    return build_options(BenchArgs(warmup=0, max_tokens=5, **kw))


# ---------------------------------------------------------------------------------------------------------------
# The rule as pure functions
# ---------------------------------------------------------------------------------------------------------------

def record(i: int, send_s: float, end_s: float, ok: bool = True) -> RequestRecord:
    return RequestRecord(index=i, endpoint="/v1/chat/completions", t_send_ns=int(send_s * S),
                         t_end_ns=int(end_s * S), ok=ok, error_kind=None if ok else "http",
                         events=[TokenEvent(t_ns=int(end_s * S), kind="answer", tokens=4)] if ok else [])


def test_earliest_end_is_where_the_rule_first_held() -> None:
    rule = SteadyRule(min_completed=3, latency_multiple=3.0)
    done = [(int(t * S), 1.0) for t in (1.0, 2.0, 3.0, 4.0)]  # a request ends every second, each took 1 s
    # From a deadline at 1.5 s: the third completion (3 s) makes N, and 3 x p50 = 3 s is reached then too.
    assert earliest_end(0, int(1.5 * S), 10 * S, done, rule) == 3 * S
    # Slower requests (p50 2 s) need a 6 s window: after the third completion, at start + 6 s.
    slow = [(int(t * S), 2.0) for t in (2.0, 3.0, 4.0)]
    assert earliest_end(0, int(1.5 * S), 10 * S, slow, rule) == 6 * S
    # Not yet: before 6 s nothing qualifies.
    assert earliest_end(0, int(1.5 * S), 5 * S, slow, rule) is None
    # Never before the lower bound (the deadline, or the last send).
    assert earliest_end(0, 7 * S, 10 * S, slow, rule) == 7 * S


def test_a_window_without_enough_completions_is_not_measured_and_names_its_counts() -> None:
    rule = SteadyRule()
    records = [record(i, 0.0, 25.0) for i in range(4)]  # four 25 s requests, all ending after a 10 s window
    steady = judge(records, (0, 10 * S), rule, ended_by="cap", cap_s=10.0)
    assert not steady.measured and steady.capped and steady.completed_in_window == 0
    assert steady.reason.startswith("too short for steady state (0 requests in the window, E2E p50 25.0 s)")
    assert "cap" in steady.reason
    # Enough completions over a window several latencies long: measured.
    fast = [record(i, i * 0.5, i * 0.5 + 0.4) for i in range(40)]
    ok = judge(fast, (0, 20 * S), rule, ended_by="steady")
    assert ok.measured and ok.reason is None and ok.completed_in_window == 40
    # The same requests, but the cap ended the level: never measured, whatever the counts.
    assert not judge(fast, (0, 20 * S), rule, ended_by="cap", cap_s=20.0).measured


# ---------------------------------------------------------------------------------------------------------------
# Levels against the calibration server
# ---------------------------------------------------------------------------------------------------------------

def test_a_level_too_short_for_steady_state_is_not_measured_never_zero(slow) -> None:
    # Answers of ~0.5 s, a 1 s level capped at 2 s: at most ~4 requests end inside the window, fewer than 10.
    result = bench(slow.url, options(mode="concurrency", concurrency=1, duration=1, max_level_duration=2))
    (lv,) = result.levels
    assert lv.ok >= 1 and not lv.steady.measured and lv.steady.capped
    assert lv.steady.completed_in_window < 10
    for key in ("output_tok_s", "request_s"):
        assert lv.figures[key].value is None  # not 0.0
        assert lv.figures[key].note.startswith("not measured: too short for steady state")
    assert f"({lv.steady.completed_in_window} requests in the window, E2E p50 " in lv.steady.reason
    assert any(w.startswith("not measured:") and "latency figures describe" in w for w in lv.warnings)
    # Per-request latencies stay: they are real measurements of the requests that finished.
    assert lv.figures["e2e_ms"].value > 0 and lv.figures["ttft_ms"].dist.n == lv.ok
    assert "peak.output_tok_s" not in result.headline  # peak figures skip unmeasured levels


def test_a_level_runs_past_its_duration_until_it_has_enough_completions(slow) -> None:
    t0 = time.monotonic()
    result = bench(slow.url, options(mode="concurrency", concurrency=1, duration=1, min_requests=6))
    took = time.monotonic() - t0
    (lv,) = result.levels
    assert lv.steady.measured and lv.steady.ended_by == "steady" and not lv.steady.capped
    assert lv.steady.completed_in_window >= 6 and lv.steady.min_completed == 6
    # Six answers of ~0.5 s one after another: the level lasted about 3 s, well past its 1 s duration.
    assert lv.window_s >= 6 * 0.45 and took >= 6 * 0.45
    assert lv.window_s >= 3 * lv.steady.e2e_p50_s
    assert lv.figures["output_tok_s"].value > 0 and lv.figures["request_s"].value > 0


def test_the_cap_cancels_requests_in_flight_after_a_grace(endless, tmp_path: Path) -> None:
    # 30 s answers, a 1 s level capped at 2 s, 2 s of grace: the level is over in about 4 s, not 30.
    t0 = time.monotonic()
    proc = subprocess.run([*SERVELAB, "bench", endless.url, "--mode", "concurrency", "--concurrency", "3",
                           "--duration", "1", "--max-level-duration", "2", "--warmup", "0", "--max-tokens", "30",
                           "--out", str(tmp_path), "--json"], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert took < 2 + 2 + 8  # cap + grace + start-up and noise; the answers would take 30 s
    (lv,) = json.loads(proc.stdout)["levels"]
    assert lv["cancelled"] == 3 and lv["ok"] == 0 and lv["failed"] == 0
    assert lv["steady"]["measured"] is False and lv["steady"]["capped"] is True
    assert lv["figures"]["output_tok_s"]["value"] is None
    (records,) = tmp_path.glob("*/records.jsonl.gz")
    kept = read_records(records)
    assert len(kept) == 3
    for r in kept:
        assert r.error_kind == "cancelled" and "level's cap" in r.error_detail
        assert r.output_tokens >= 1  # what it had received is kept


def test_one_request_per_stream_prints_not_measured_instead_of_zero(slow) -> None:
    # `--concurrency 64 --requests 64`, scaled down: every stream sends one request, all at once, so the
    # window (first .. last send) holds no completion.
    proc = subprocess.run([*SERVELAB, "bench", slow.url, "--mode", "concurrency", "--concurrency", "8",
                           "--requests", "8", "--warmup", "0", "--max-tokens", "5"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "not measured: too short for steady state (0 requests in the window, E2E p50" in out
    assert "budget of 8 requests was spent first" in out
    row = next(line for line in proc.stdout.splitlines() if "8/8" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[2] == "–" and cells[3] == "–"  # output tok/s and req/s: no value, not 0.00


def test_the_sweep_stops_at_a_level_that_is_not_measured(slow) -> None:
    result = bench(slow.url, options(mode="sweep", duration=0.5, max_level_duration=1.5, max_concurrency=8))
    assert len(result.levels) == 1  # c1 could not be measured in 1.5 s: higher concurrency is not tried
    assert "concurrency 1 was not measured (too short for steady state" in result.stop_reason


def test_an_open_loop_level_says_when_the_server_did_not_keep_up() -> None:
    """A server with one slot and 60 ms answers completes at most ~16 req/s; 40 req/s are offered."""
    server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "slot_server.py"), "--slots", "1",
                               "--ttft-ms", "30", "--itl-ms", "10", "--tokens", "4"], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{server.stdout.readline().split()[1]}"
        result = bench(url, options(mode="rate", rate="40", arrival="constant", duration=1, max_level_duration=2))
    finally:
        server.terminate()
        server.wait(10)
    (lv,) = result.levels
    assert lv.steady.kept_up is False and lv.steady.offered_rate == 40
    assert lv.steady.completed_rate < 20
    note = "the server did not keep up: offered 40 req/s, completed "
    assert any(note in w for w in lv.warnings) or note in (lv.steady.reason or "")


def test_an_open_loop_budget_too_small_is_not_measured(slow) -> None:
    result = bench(slow.url, options(mode="rate", rate="20", requests=6))
    (lv,) = result.levels
    assert lv.requests == 6  # the budget is sent whole
    assert not lv.steady.measured and lv.steady.ended_by == "budget"
    assert lv.figures["output_tok_s"].value is None


def test_slo_search_refuses_to_call_a_level_met_on_too_few_requests(slow) -> None:
    # Every level would meet a 5 s E2E target, but 6 requests a level are fewer than the 10 the rule asks for:
    # no probe is called met, and each says why.
    few = bench(slow.url, options(mode="slo-search", search="concurrency", concurrency=1, max_concurrency=4,
                                  requests=6, slo="e2e_p99_ms=5000", max_probes=3))
    assert few.search["best"] is None
    for probe in few.search["probes"]:
        assert probe["passed"] is False and probe["judged"] is False
        assert probe["reason"].startswith("not measured: too short for steady state")
    assert "not measured and counted as not meeting the targets" in few.search["stop_reason"]
    assert all(lv.slo["judged"] is False and lv.slo["passed"] is False for lv in few.levels)
    # With enough requests the same levels are judged, and met.
    enough = bench(slow.url, options(mode="slo-search", search="concurrency", concurrency=4, max_concurrency=4,
                                     requests=24, slo="e2e_p99_ms=5000", max_probes=1))
    assert enough.search["best"] == 4 and enough.search["probes"][0]["passed"] is True


def test_a_window_ended_by_the_latency_condition_is_judged_long_enough() -> None:
    """Where the window's end is set by K x p50 (not by a completion), the judgement of the finished level must
    agree with the decision taken while it ran, whatever the rounding of nanoseconds."""
    rule = SteadyRule(min_completed=3, latency_multiple=3.0)
    records = [record(i, 0.0, 1.0) for i in range(4)]
    for r in records:
        r.t_end_ns = 2_095_513_148  # an E2E whose 3 x p50, in ns, truncates below 3 x p50 in seconds
    end = earliest_end(0, 3 * S, 60 * S, [(r.t_end_ns, (r.t_end_ns - r.t_send_ns) / S) for r in records], rule)
    assert end is not None
    assert judge(records, (0, end), rule, ended_by="steady").measured
