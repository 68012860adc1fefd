"""Can these runs be compared at all? Warnings, never refusals: the user decides, knowing what differs.

Two runs measured with different workloads (lengths, sampling, ignore_eos, endpoint, tokenizer) or counted
differently (server per-chunk counts vs one token per chunk) differ for reasons other than the servers. A run
whose configuration carries a serious lint finding measures the misconfiguration, not what the engine can do.
"""

from __future__ import annotations

from typing import Any

from servelab.compare.metrics import run_reasoning_share
from servelab.compare.run_data import RunData

# What describes the server rather than the workload: expected to differ between cells.
NOT_WORKLOAD = {"engine_detected", "gpu_telemetry"}
# Headline figures whose `counted_by` says how their tokens were counted.
COUNTED = ("single.decode_tok_s", "peak.output_tok_s")


def workload_of(run: RunData) -> dict[str, Any]:
    """The workload as sent, merged over the run's bench steps (single and sweep share one in `servelab run`)."""
    merged: dict[str, Any] = {}
    for bench in run.benches:
        for key, value in bench.workload.items():
            if key not in NOT_WORKLOAD:
                merged.setdefault(key, value)
    return merged


def uses_tokenizer(run: RunData) -> bool:
    """Whether any of the run's tokens were counted by its tokenizer (`workload.tokenizer` recounts only what a
    server did not count per chunk); a run without records to tell by is taken to use it."""
    return not run.records or any(r.count_method != "server_per_chunk" for r in run.records if r.ok)


def comparability_warnings(baseline: RunData, others: list[RunData]) -> list[str]:
    warnings: list[str] = []
    for run in [baseline, *others]:
        for finding in run.serious:
            warnings.append(f"{run.name} is NOT REPRESENTATIVE: {finding.setting}: {finding.why}")
        if run.status != "complete" and not run.literal and run.peer is None:
            warnings.append(f"{run.name} did not complete (status {run.status}): its figures may be partial")
    if baseline.literal:
        warnings.append(f"the baseline {baseline.name} is literal figures: no records, so no interval on its side "
                        f"and no workload to check the others against")
    base_workload = workload_of(baseline)
    for run in others:
        if run.literal or baseline.literal or run.peer is not None or baseline.peer is not None:
            continue  # nothing recorded to check against (a peer's workload is in its own terms: compare.py)
        theirs = workload_of(run)
        ignored = set() if uses_tokenizer(baseline) or uses_tokenizer(run) else {"tokenizer"}
        diffs = [f"{key} {base_workload.get(key)!r} vs {theirs.get(key)!r}"
                 for key in sorted(set(base_workload) | set(theirs))
                 if base_workload.get(key) != theirs.get(key) and key not in ignored]
        if diffs:
            warnings.append(f"workloads differ between {baseline.name} and {run.name}: " + "; ".join(diffs))
        for key in COUNTED:
            a, b = baseline.headline.get(key), run.headline.get(key)
            if a and b and a.counted_by != b.counted_by:
                warnings.append(f"{key}: tokens counted by {a.counted_by} for {baseline.name} but by "
                                f"{b.counted_by} for {run.name}")
        shares = reasoning_share_warning(baseline, run)
        if shares:
            warnings.append(shares)
    return warnings


# Reasoning shares this far apart (or one run thinking and the other not at all) make output tok/s, tokens per
# request and TTFT count different things.
SHARE_DIFFERENCE = 0.05


def reasoning_share_warning(a: RunData, b: RunData) -> str | None:
    """Say when two runs differ in the share of their output that was reasoning, and what to compare instead."""
    sa, sb = run_reasoning_share(a), run_reasoning_share(b)
    if sa is None or sb is None or ((sa == 0) == (sb == 0) and abs(sa - sb) < SHARE_DIFFERENCE):
        return None
    why = ("one thinks and the other does not: a model that does not reason, thinking turned off, or an engine "
           "launched without its reasoning parser, whose thinking then counts as answer" if (sa == 0) != (sb == 0)
           else "different models, prompts or thinking budgets")
    return (f"reasoning shares differ: {a.name} {sa * 100:.0f} % of output tokens, {b.name} {sb * 100:.0f} % "
            f"({why}): output tok/s, tokens per request and TTFT count thinking as output; compare the "
            f"answer-only figures: TTFO and answer tok/s")
