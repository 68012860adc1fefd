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

Scrape = dict[str, float]  # sample name -> value summed over label sets (per-rank, per-model series add up)

COUNTERS = ("generated_tokens", "prompt_tokens", "spec_drafted", "spec_accepted", "spec_drafts")
GAUGES = ("running", "waiting", "kv_usage", "spec_accept_length", "spec_accept_rate")


def parse_metrics(text: str) -> Scrape:
    values: Scrape = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            values[sample.name] += sample.value
    return dict(values)


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
    # prometheus_client reports counters as `<name>_total` whether or not the exposition had the suffix.
    if name in scrape:
        return scrape[name]
    alt = name[:-6] if name.endswith("_total") else name + "_total"
    return scrape.get(alt)


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
        seen = [v for s in [*watch.during, watch.after] if (v := _lookup(s, name)) is not None]
        if seen:
            ev.gauges[meaning] = {"mean": sum(seen) / len(seen), "max": max(seen), "last": seen[-1]}

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
                                 "(/metrics), last value in the level")
    return None


