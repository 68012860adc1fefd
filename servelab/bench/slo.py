"""Latency targets (SLOs): parsing them, and judging a load level and each request against them.

A target names a quantity, a statistic and a limit: `ttft_p99_ms=500` means "the 99th percentile of TTFT is at
most 500 ms". Quantities: ttft, ttfo, itl, tpot, e2e (docs/metrics.md); statistics: p50, p90, p95, p99, max.

Two judgements (definitions: docs/metrics.md#slo-attainment and #slo-level):
- a request meets the targets when its own value is within every limit: its TTFT/TTFO/E2E/TPOT, and for ITL the
  same statistic over its own token gaps. A failed request meets none; a request too short to have an ITL or
  TPOT meets those targets vacuously, but one without any token cannot meet a TTFT/TTFO target.
- a level meets the targets when each statistic, computed over all measured requests with every failed request
  counted as infinitely slow, is within its limit. So failures cannot make a level look better by leaving the
  distribution, and p99 <= X tolerates at most 1 % failures. A request cancelled in flight (Ctrl-C) is no failure:
  it is left out of both judgements (docs/metrics.md#cancelled).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servelab.bench.request_figures import is_cancelled, token_gaps_ms
# A request judged against targets is a per-request quantity (bench/request_figures.py), where the tally reads it;
# re-exported as part of what an SLO is.
from servelab.bench.request_figures import request_meets as request_meets
from servelab.bench.request_figures import request_value_ms as request_value_ms
from servelab.bench.sketch import Samples
from servelab.bench.tally import as_tally
from servelab.errors import UserError
from servelab.records import RequestRecord

QUANTITIES = ("ttft", "ttfo", "itl", "tpot", "e2e")
STATS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
_KEY = re.compile(r"(?P<q>[a-z0-9]+)_(?P<s>p50|p90|p95|p99|max)_ms")
_HINT = "e.g. --slo ttft_p99_ms=500,itl_p99_ms=50,e2e_p99_ms=10000"


@dataclass(frozen=True)
class SLO:
    quantity: str  # one of QUANTITIES
    stat: str  # one of STATS
    limit_ms: float

    @property
    def key(self) -> str:
        return f"{self.quantity}_{self.stat}_ms"

    @property
    def q(self) -> float:
        return STATS[self.stat]


def parse_slos(text: str | None) -> list[SLO]:
    """`ttft_p99_ms=500,itl_p99_ms=50` -> targets. Empty or None -> no targets."""
    if not text or not text.strip():
        return []
    slos: dict[str, SLO] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        m = _KEY.fullmatch(key.strip())
        if not sep or not m or m.group("q") not in QUANTITIES:
            raise UserError(f"bad SLO '{part.strip()}'", hint=f"QUANTITY_STAT_ms=LIMIT with QUANTITY in "
                                                             f"{'/'.join(QUANTITIES)}, STAT in {'/'.join(STATS)}; "
                                                             f"{_HINT}")
        try:
            limit = float(value)
        except ValueError:
            raise UserError(f"bad SLO limit in '{part.strip()}': not a number", hint=_HINT) from None
        if not limit > 0:
            raise UserError(f"bad SLO limit in '{part.strip()}': must be positive")
        slo = SLO(m.group("q"), m.group("s"), limit)
        slos[slo.key] = slo
    return list(slos.values())


def level_values(records: Sequence[RequestRecord], slo: SLO) -> list[float]:
    """The samples a level's statistic is taken over; a failed request is one infinite sample, a cancelled one
    none (it did not run to its end, and nothing failed)."""
    values: list[float] = []
    for r in records:
        if r.warmup or is_cancelled(r):
            continue
        if not r.ok:
            values.append(math.inf)
        elif slo.quantity == "itl":
            values.extend(token_gaps_ms(r))
        else:
            v = request_value_ms(r, slo)
            if v is not None:
                values.append(v)
            elif slo.quantity in ("ttft", "ttfo"):
                values.append(math.inf)  # a successful request without any token never reached its first one
    return values


def level_verdict(records, slos: Sequence[SLO]) -> dict[str, Any]:
    """{"passed", "targets": {key: {"limit_ms", "observed_ms", "passed"}}}: the shape stored in Summary.slo.
    `records`: a level's records or its LevelTally (bench/tally.py); the samples are those of `level_values`."""
    tally = as_tally(records)
    targets: dict[str, Any] = {}
    for slo in slos:
        if slo.quantity == "itl":
            samples = tally.itl
            observed = samples.quantile(slo.q, extra_infinite=tally.failed) \
                if samples.n + samples.infinite + tally.failed else math.inf
        else:
            samples = Samples()
            per_request = {"ttft": tally.ttft_ms, "ttfo": tally.ttfo_ms, "tpot": tally.tpot_ms}.get(slo.quantity)
            values = per_request if per_request is not None else tally.e2e_ms()
            for v in values:
                if not math.isnan(v):
                    samples.add(v)
                elif slo.quantity in ("ttft", "ttfo"):
                    samples.add(math.inf)  # a successful request without any token never reached its first one
            samples.add(math.inf, tally.failed)
            observed = samples.quantile(slo.q) if samples.n + samples.infinite else math.inf
        if math.isnan(observed):  # interpolating between two infinite samples (inf - inf)
            observed = math.inf
        targets[slo.key] = {"limit_ms": slo.limit_ms, "observed_ms": None if math.isinf(observed) else observed,
                            "passed": observed <= slo.limit_ms}
    measured = tally.measured - tally.cancelled
    return {"passed": measured > 0 and all(t["passed"] for t in targets.values()), "targets": targets}


def describe(slos: Sequence[SLO]) -> str:
    return ",".join(f"{s.key}={s.limit_ms:g}" for s in slos)
