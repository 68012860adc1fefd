"""Server-side evidence: the engine's own Prometheus `/metrics`, read before, during and after each load level.

It answers what the client cannot see: how many tokens the server says it generated, its own TTFT histogram
(to cross-check the client's TTFT), how busy its queue and KV cache were, and how often speculative drafts were
accepted. Metric names come from the engine adapter (`metric_names`, by meaning), so this module knows no
engine; parsing is prometheus_client's.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servelab.records import RequestRecord, ServerEvidence, SpecDecode

COUNTERS = ("generated_tokens", "prompt_tokens", "spec_drafted", "spec_accepted", "spec_drafts")
GAUGES = ("running", "waiting", "kv_usage", "spec_accept_length", "spec_accept_rate")
_TOTAL_SUFFIXES = ("_total", "_count", "_sum")


@dataclass
class Scrape:
    """One read of /metrics, by what each sample is (the exposition's `# TYPE`).

    Counters, and a histogram's or summary's `_sum`, `_count` and buckets, add up over label sets: eight ranks'
    token counters are the server's total. Gauges do not: eight schedulers each at 0.4 KV usage are a server at
    0.4, not 3.2; each label set stays a series of its own (one per rank, DP engine, ...)."""

    totals: dict[str, float] = field(default_factory=dict)  # sample name -> summed over label sets
    gauges: dict[str, list[float]] = field(default_factory=dict)  # sample name -> one value per label set
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # histogram -> le -> count, summed
    types: dict[str, str] = field(default_factory=dict)  # family name -> counter, gauge, histogram, ...


def _sample_kind(family_type: str, family: str, sample: str) -> str | None:
    """"total", "gauge", "bucket", or None (not read: `_created` timestamps, a summary's quantiles)."""
    if sample.endswith("_created"):
        return None
    if family_type == "counter":
        return "total"
    if family_type in ("histogram", "summary"):
        if sample == family + "_bucket":
            return "bucket"
        if sample in (family + "_sum", family + "_count"):
            return "total"
        return None  # a summary's `{quantile=...}` samples: neither additive nor comparable across series
    if family_type in ("unknown", "untyped"):  # no # TYPE line: judge by the name's convention
        return "total" if sample.endswith(_TOTAL_SUFFIXES) else "gauge"
    return "gauge"  # gauge, and what behaves like one (info, stateset, gaugehistogram)


def parse_metrics(text: str) -> Scrape:
    out = Scrape()
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        out.types.setdefault(family.name, family.type)
        for sample in family.samples:
            kind = _sample_kind(family.type, family.name, sample.name)
            if kind == "total":
                totals[sample.name] += sample.value
            elif kind == "gauge":
                out.gauges.setdefault(sample.name, []).append(sample.value)
            elif kind == "bucket":
                le = float(sample.labels.get("le", "+Inf"))
                by_le = out.buckets.setdefault(family.name, {})
                by_le[le] = by_le.get(le, 0.0) + sample.value
    out.totals = dict(totals)
    return out


async def scrape(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 3.0) -> Scrape | None:
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(base_url + "/metrics") as resp:
                if resp.status != 200:
                    return None
                text = (await resp.read()).decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError):
        return None
    try:
        return parse_metrics(text)
    except ValueError:  # not Prometheus text (an HTML error page, say)
        return None


def _lookup(scrape: Scrape, name: str) -> float | None:
    """A counter-like total: the counter itself, or the `_sum` of a histogram of counts (TGI's
    `tgi_request_generated_tokens` is a histogram of tokens per request, so its `_sum` is the tokens generated)."""
    # prometheus_client reports counters as `<name>_total` whether or not the exposition had the suffix.
    base = name[:-6] if name.endswith("_total") else name
    for candidate in (name, base if base != name else name + "_total"):
        if candidate in scrape.totals:
            return scrape.totals[candidate]
    if scrape.types.get(base) in ("histogram", "summary"):
        return scrape.totals.get(base + "_sum")
    return None


def _series(scrape: Scrape, name: str) -> list[float] | None:
    """A gauge's values, one per series; a name that is a total after all (an untyped metric named `_total`)
    counts as one series."""
    if name in scrape.gauges:
        return scrape.gauges[name]
    value = _lookup(scrape, name)
    return None if value is None else [value]


def gauge_words(gauge: dict[str, float], digits: int = 2) -> str:
    """"mean 0.40, max 0.52 over 8 series" (docs/metrics.md#server-gauges). A run recorded before gauges were kept
    per series has no `series`: its figures added every rank's value up, and the words say so."""
    words = f"mean {gauge['mean']:.{digits}f}, max {gauge['max']:.{digits}f}"
    if "series" not in gauge:
        return words + " (an older run's figure: the sum over ranks, where there were several)"
    series = int(gauge["series"])
    return words + (f" over {series} series" if series > 1 else "")


@dataclass
class LevelWatch:
    """Scrapes for one level: one before, one every `interval_s` during, one after."""

    names: dict[str, str]
    before: Scrape | None = None
    during: list[Scrape] = field(default_factory=list)
    after: Scrape | None = None


class MetricsWatcher:
    def __init__(self, base_url: str, names: dict[str, str], interval_s: float = 1.0,
                 headers: dict[str, str] | None = None):
        self.base_url = base_url
        self.names = names
        self.interval_s = interval_s
        self.headers = headers  # the API key, when the server wants one for /metrics too
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._watch: LevelWatch | None = None
        self.available = True

    async def __aenter__(self) -> MetricsWatcher:
        self._session = aiohttp.ClientSession(headers=self.headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
        if self._session:
            await self._session.close()

    async def start_level(self) -> None:
        if not self.available or not self.names:
            return
        self._watch = LevelWatch(names=self.names, before=await scrape(self._session, self.base_url))
        if self._watch.before is None:
            self.available = False  # no /metrics (or not Prometheus): stop asking
            self._watch = None
            return
        self._task = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            s = await scrape(self._session, self.base_url)
            if s is not None and self._watch is not None:
                self._watch.during.append(s)

    async def end_level(self, records: Sequence[RequestRecord]) -> ServerEvidence | None:
        if self._watch is None:
            return None
        if self._task:
            self._task.cancel()
            self._task = None
        self._watch.after = await scrape(self._session, self.base_url)
        watch, self._watch = self._watch, None
        return evidence(watch, records)


def evidence(watch: LevelWatch, records: Sequence[RequestRecord]) -> ServerEvidence | None:
    """Pure: turn a level's scrapes and its records into ServerEvidence."""
    if watch.before is None or watch.after is None:
        return None
    ev = ServerEvidence(samples=len(watch.during))
    for meaning in COUNTERS:
        name = watch.names.get(meaning)
        if not name:
            continue
        a, b = _lookup(watch.before, name), _lookup(watch.after, name)
        if a is not None and b is not None:
            ev.counters[meaning] = b - a
    for meaning in GAUGES:
        name = watch.names.get(meaning)
        if not name:
            continue
        gauge = gauge_summary([_series(s, name) for s in [*watch.during, watch.after]])
        if gauge is not None:
            ev.gauges[meaning] = gauge

    from servelab.bench.metrics import as_tally

    tally = as_tally(records)
    ttft = watch.names.get("ttft")  # a histogram: <name>_sum and <name>_count
    if ttft:
        s0, s1 = _lookup(watch.before, ttft + "_sum"), _lookup(watch.after, ttft + "_sum")
        c0, c1 = _lookup(watch.before, ttft + "_count"), _lookup(watch.after, ttft + "_count")
        if None not in (s0, s1, c0, c1) and c1 > c0:
            ev.server_ttft_mean_ms = (s1 - s0) / (c1 - c0) * 1000.0
            ev.client_ttft_mean_ms = tally.ttft_mean_ms()

    generated = ev.counters.get("generated_tokens")
    client_tokens = tally.client_tokens
    if generated is not None and tally.measured and abs(generated - client_tokens) > max(2, 0.02 * client_tokens):
        ev.notes.append(f"the server counted {generated:.0f} generated tokens during the level, the client "
                        f"received {client_tokens}: other traffic, or requests cut short")
    ev.spec_decode = spec_decode(ev, watch.names)
    return ev


def gauge_summary(scrapes: Sequence[list[float] | None]) -> dict[str, float] | None:
    """A gauge over a level, per series (a rank's or a DP engine's value is never added to another's): `mean` over
    every series in every scrape, `max` of any series in any scrape, `last` the mean over series in the last scrape
    that had the gauge, `series` how many series that scrape had."""
    seen = [values for values in scrapes if values]
    if not seen:
        return None
    pooled = [v for values in seen for v in values]
    return {"mean": sum(pooled) / len(pooled), "max": max(pooled), "last": sum(seen[-1]) / len(seen[-1]),
            "series": float(len(seen[-1]))}


def spec_decode(ev: ServerEvidence, names: dict[str, str]) -> SpecDecode | None:
    drafted, accepted, drafts = (ev.counters.get(k) for k in ("spec_drafted", "spec_accepted", "spec_drafts"))
    if drafted:
        return SpecDecode(
            drafted_tokens=drafted, accepted_tokens=accepted, drafts=drafts,
            acceptance_rate=accepted / drafted if accepted is not None else None,
            mean_accepted_length=1 + accepted / drafts if accepted is not None and drafts else None,
            source=f"{names.get('spec_drafted')} and related counters (/metrics), increase over the level")
    length = ev.gauges.get("spec_accept_length")
    rate = ev.gauges.get("spec_accept_rate")
    if length or rate:  # SGLang exposes gauges only
        return SpecDecode(mean_accepted_length=length["last"] if length else None,
                          acceptance_rate=rate["last"] if rate else None,
                          source=f"{names.get('spec_accept_length') or names.get('spec_accept_rate')} gauges "
                                 "(/metrics), last value in the level" + _over_series(length or rate))
    return None


def _over_series(gauge: dict[str, float]) -> str:
    series = int(gauge.get("series", 1))
    return f", mean over {series} series (one per scheduler)" if series > 1 else ""
