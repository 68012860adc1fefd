"""From what a peer's file holds (one load level at a time) to a RunData: levels, headline figures, and
RequestRecords rebuilt from per-request data when the file has it.

A rebuilt record holds what the peer measured, in its own terms: its send time (0 when the file has no timeline),
its first timed chunk at send + its TTFT, then one event per later chunk at the gaps it recorded. Tokens per chunk
are in none of these files: a request's output tokens are spread over its chunks (the first chunk carries one;
with more chunks than tokens, as vLLM's timed role and finish chunks make, those carry none). A request's tokens
after its first token-bearing chunk and the span from it to its last are then the peer's own, and servelab's
per-request definitions (decode tok/s, TTFT) computed from the record apply servelab's formula to the peer's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.compare.peers.common import PeerInfo
from servelab.compare.run_data import RunData
from servelab.records import BenchResult, Distribution, Figure, RequestRecord, Step, Summary, TokenEvent, Trial, Usage

NS_PER_MS = 1_000_000


@dataclass
class PeerRequest:
    """One request as a peer recorded it: times in ms from its start."""

    ok: bool
    ttft_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list)  # between consecutive timed chunks after the first
    output_tokens: int | None = None
    input_tokens: int | None = None
    start_ns: int | None = None  # on the peer's own clock, when the file has a timeline
    e2e_ms: float | None = None


@dataclass
class PeerLevel:
    """One load level of a peer's run, with its figures already in servelab's units (None: not in the file)."""

    concurrency: int | None  # closed loop; 1 is single stream
    rate: float | None = None  # open loop, requests per second
    requests: int = 0
    ok: int = 0
    failed: int = 0
    duration_s: float = 0.0
    ttft_ms: float | None = None  # p50
    decode_tok_s: float | None = None  # p50 of per-request decode rate
    itl_ms: float | None = None  # p50
    e2e_ms: float | None = None  # p50
    output_tok_s: float | None = None
    request_s: float | None = None
    requests_data: list[PeerRequest] = field(default_factory=list)
    timeline: bool = False  # requests_data carry start times on one clock (a throughput interval can be drawn)
    # The peer's own distributions where its file has every statistic (figure key -> Distribution)
    dists: dict[str, Distribution] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        if self.concurrency == 1 and self.rate is None:
            return "single"
        if self.rate is not None:
            return f"r{self.rate:g}"
        return f"c{self.concurrency}" if self.concurrency else "level"


def records_of(level: PeerLevel, tag: str, endpoint: str, first_index: int = 0) -> list[RequestRecord]:
    out = []
    for i, req in enumerate(level.requests_data):
        t0 = req.start_ns if (level.timeline and req.start_ns is not None) else 0
        events: list[TokenEvent] = []
        if req.ok and req.ttft_ms is not None:
            times = [t0 + round(req.ttft_ms * NS_PER_MS)]
            for gap in req.gaps_ms:
                times.append(times[-1] + round(gap * NS_PER_MS))
            for t, tokens in zip(times, spread(req.output_tokens, len(times))):
                events.append(TokenEvent(t_ns=t, kind="answer", tokens=tokens))
        end = (t0 + round(req.e2e_ms * NS_PER_MS)) if req.e2e_ms is not None else (events[-1].t_ns if events
                                                                                     else None)
        out.append(RequestRecord(index=first_index + i, tag=tag, endpoint=endpoint, t_send_ns=t0, t_end_ns=end,
                                 events=events, chunks=len(events), ok=req.ok, input_tokens=req.input_tokens,
                                 usage=Usage(completion_tokens=req.output_tokens) if req.output_tokens is not None
                                 else None, count_method="chunk_count",
                                 error_kind=None if req.ok else "http"))
    return out


def spread(tokens: int | None, chunks: int) -> list[int]:
    """`tokens` over `chunks` chunks: one each when they are equal; otherwise the first chunk one token and the rest
    shared evenly (the first chunk none when there are more chunks than tokens, e.g. vLLM's timed role chunk)."""
    if chunks <= 0:
        return []
    if tokens is None or tokens == chunks:
        return [1] * chunks
    if tokens < chunks:
        # Chunks without a token: vLLM times the role chunk first and the finish chunk last (one more chunk: the
        # role chunk; two more: both); further empty ones are taken to come right after the role chunk.
        if tokens <= 0:
            return [0] * chunks
        extra = chunks - tokens
        tail = 1 if extra >= 2 else 0
        return [0] * (extra - tail) + [1] * tokens + [0] * tail
    rest, extra = divmod(tokens - 1, chunks - 1) if chunks > 1 else (0, 0)
    if chunks == 1:
        return [tokens]
    return [1] + [rest + (1 if i < extra else 0) for i in range(chunks - 1)]


# A level's figure -> the key figures it stands for (compare/metrics.py), whose definition notes it carries.
_KEYS = {"ttft_ms": ("single.ttft_ms", "load.ttft_ms"), "decode_tok_s": ("single.decode_tok_s",),
         "itl_ms": ("single.itl_ms",), "output_tok_s": ("peak.output_tok_s",)}


def _note(info: PeerInfo, name: str, single: bool) -> str:
    keys = _KEYS.get(name, ())
    d = next((info.definition(k) for k in keys if info.definition(k) and (single or not k.startswith("single."))),
             None)
    if d is None:
        return f"{info.tool}'s own figure"
    return f"{info.tool}: {d.theirs}" + ("" if d.matches else " (defined differently)")


def level_summary(level: PeerLevel, info: PeerInfo) -> Summary:
    single = level.tag == "single"
    specs = {"ttft_ms": (level.ttft_ms, "ms", "ttft"), "decode_tok_s": (level.decode_tok_s, "tok/s", "decode-tok-s"),
             "itl_ms": (level.itl_ms, "ms", "itl"), "e2e_ms": (level.e2e_ms, "ms", "e2e"),
             "output_tok_s": (level.output_tok_s, "tok/s", "output-tok-s"),
             "request_s": (level.request_s, "req/s", "request-s")}
    if level.e2e_ms is None:  # not among the statistics the file kept: from its requests, when it has them
        e2e = sorted(r.e2e_ms for r in level.requests_data if r.ok and r.e2e_ms is not None)
        if e2e:
            from servelab.bench.metrics import percentile

            specs["e2e_ms"] = (percentile(e2e, 50), "ms", "e2e")
    # Every figure a level table shows is there, None where the file has no such figure ("–").
    figures = {name: Figure(value=value, unit=unit, definition=definition, dist=level.dists.get(name),
                            note=_note(info, name, single) if value is not None else f"not in {info.tool}'s file")
               for name, (value, unit, definition) in specs.items()}
    mode = "single" if level.tag == "single" else "rate" if level.rate is not None else "concurrency"
    return Summary(tag=level.tag, mode=mode, concurrency=level.concurrency or 0, requests=level.requests,
                   ok=level.ok, failed=level.failed, window_s=level.duration_s, figures=figures, rate=level.rate)


def peer_run(name: str, info: PeerInfo, levels: list[PeerLevel], model: str = "", url: str = "",
             endpoint: str = "/v1/chat/completions") -> RunData:
    """The RunData of a peer's file: its single-stream level (concurrency 1) as `single`, the others as a sweep."""
    records: list[RequestRecord] = []
    single_levels: list[Summary] = []
    sweep_levels: list[Summary] = []
    for level in levels:
        summary = level_summary(level, info)
        (single_levels if summary.mode == "single" else sweep_levels).append(summary)
        records += records_of(level, summary.tag, endpoint, len(records))
    single = sweep = None
    headline: dict[str, Figure] = {}
    if single_levels:
        s = single_levels[0]
        single = BenchResult(url=url or "peer", model=model, mode="single", workload={}, levels=single_levels)
        for key in ("decode_tok_s", "ttft_ms", "itl_ms", "e2e_ms", "output_tok_s"):
            if s.figures[key].value is not None:
                headline[f"single.{key}"] = s.figures[key]
        single.headline = dict(headline)
    if sweep_levels:
        sweep = BenchResult(url=url or "peer", model=model, mode="sweep", workload={}, levels=sweep_levels)
        rated = [s for s in sweep_levels if s.figures["output_tok_s"].value is not None]
        if rated:
            best = max(rated, key=lambda s: s.figures["output_tok_s"].value or 0.0)
            headline["peak.output_tok_s"] = best.figures["output_tok_s"]
            headline["peak.concurrency"] = Figure(value=best.concurrency, unit="streams", definition="peak")
            sweep.headline = {k: v for k, v in headline.items() if k.startswith("peak.")}
    for r in records:
        r.trial = 0
    info.per_request = any(level.requests_data for level in levels)
    info.timeline = info.per_request and all(level.timeline for level in levels if level.requests_data)
    steps = [Step(name=n, result=r) for n, r in (("single", single), ("sweep", sweep)) if r is not None]
    return RunData(name=name, ref=info.path, steps=steps, headline=headline, records=records,
                   trials=[Trial(index=0, steps=steps)], counted=[0], peer=info)
