"""One load level's requests, folded as they finish into what its figures need, in bounded memory.

A level used to keep every RequestRecord (every token event an object with its text) until its summary: memory
grew with the run, ~0.8 KB per streamed token. A LevelTally takes each finished record once (`append`, the list
API the load modes already used) and keeps only:

- per request, a handful of numbers in compact arrays (send and end times, TTFT, TTFO, E2E, decode tok/s,
  TPOT, token counts, SLO verdict): O(requests), 8 bytes each, what per-request figures and bootstrap
  intervals need;
- every token gap in a `Samples` (exact up to a million gaps, then a quantile sketch: bench/sketch.py);
- the tokens and events counted inside the measurement window. The window's end is decided only when the level
  stops sending, so a token event is folded into those counts once it is known to lie before any end the window
  can still have (`floor`, from the level's LevelControl: the window never ends before the latest send); the few
  events after that floor wait, as three numbers each, until the window is known;
- counts and a first example for each warning, and the level's error groups.

`keep=True` also keeps the records themselves (tests, and callers that iterate what a level returned); a bench
run does not. Every figure of bench/metrics.py is computed from a tally, so a level summarised as it runs and
the same records summarised later from disk give the same numbers.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

from servelab.bench.answer_figures import tool_row
from servelab.bench.cache_figures import cache_row
from servelab.bench.image_figures import image_row
from servelab.bench.request_figures import (error_key, generated_tokens, is_cancelled, one_short_by_eos,
                                            request_meets, ttfo_ns)
from servelab.bench.sketch import Samples
from servelab.records import ErrorCount, RequestRecord

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
NONE_NS = -1  # an absent time in an int array (a request that never ended)
NAN = math.nan


class LevelTally:
    def __init__(self, *, window_start_ns: int | None = None, floor: Callable[[], int] | None = None,
                 slos: Sequence | None = None, keep: bool = True,
                 waiting: Callable[[RequestRecord], bool] | None = None, count_window: bool = True):
        """`window_start_ns`: events before it are outside the window (None: no event is: a level whose window
        starts at its first send). `floor`: a time before which the window's end can no longer fall (None: the
        window may end anywhere, so every event waits for it: exact, but memory grows; fine for records
        already in memory). `slos`: targets each request is judged against as it is folded (goodput). `waiting`:
        says a record still waits for its token recount (bench/loads/common.py Recorder): it is folded later,
        by `fold_waiting`, once recounted. `count_window=False`: no window counts at all (a pooled level, whose
        rates come from its trials' own), so no event waits for a window."""
        self.window_start_ns = window_start_ns
        self.floor = floor
        self.slos = list(slos or ())
        self.records: list[RequestRecord] | None = [] if keep else None
        self.waiting = waiting
        self.count_window = count_window
        self._late: list[RequestRecord] = []  # appended while waiting for their recount
        self.appended = 0  # every record given, warm-up ones included (len())
        # ---- per measured (non-warm-up) request ----
        self.status = array("b")  # 0 ok, 1 failed, 2 cancelled
        self.t_send = array("q")
        self.t_end = array("q")  # NONE_NS when it never ended
        self.lag_ms = array("d")  # send - scheduled (open loop), NaN when it had no schedule
        self.meets = array("b")  # met every SLO target (only with slos)
        # ---- per successful request ----
        self.ok_end = array("q")
        self.ttft_ms = array("d")
        self.ttfo_ms = array("d")
        self.e2e_ns = array("q")  # NONE_NS when it never ended
        self.decode_tok_s = array("d")
        self.tpot_ms = array("d")
        self.output_tokens = array("q")
        self.answer_tokens = array("q")
        self.reasoning_tokens = array("q")
        self.count_methods: set[str] = set()
        # non-streamed requests (embeddings, rerank): how many of the measured ones, and per successful one its
        # items and the server's usage.prompt_tokens (-1: not given)
        self.unary = 0
        self.items = array("q")
        self.usage_prompt = array("q")
        # prefix-cache rows (bench/cache_figures.py) of the successful requests that reported cached tokens or
        # belonged to a conversation turn; the others add nothing but to `ok`
        self.cache_rows: list = []
        # tool-call rows (bench/answer_figures.py) of the successful requests that declared tools, and the schema
        # verdicts of those that asked for a response format
        self.tool_rows: list = []
        self.schema_verdicts: list[bool] = []
        # chat-with-images rows (bench/image_figures.py) of the successful requests of an image workload
        self.image_rows: list = []
        # ---- token gaps of successful requests ----
        self.itl = Samples()  # per token: an event of k tokens after a gap g counts k samples of g/k
        self.itl_chunk = Samples()  # per token-bearing event
        # ---- the window's tokens and events ----
        self.folded_tokens = 0  # tokens of successful requests in events known to be inside the window
        self.folded_answer = 0
        self.folded_events = 0  # token events of any measured request known inside (the client ceiling check)
        self._pending_t = array("q")  # events that may still fall after the window's end
        self._pending_tokens = array("q")
        self._pending_flags = array("b")  # 1: of a successful request, 2: answer tokens
        # ---- failures and warnings ----
        self.errors: Counter[str] = Counter()
        self._groups: dict[tuple, ErrorCount] = {}
        self.warn_counts: Counter[str] = Counter()
        self.warn_example: dict[str, str] = {}
        self.client_tokens = 0  # tokens received by every measured request (server evidence)

    # ---- the list API the load modes use ----
    def append(self, record: RequestRecord) -> None:
        self.appended += 1
        if self.records is not None:
            self.records.append(record)
        if record.warmup:
            return
        if self.waiting is not None and self.waiting(record):
            self._late.append(record)
        else:
            self._fold(record)

    def fold_waiting(self) -> None:
        """Fold the records whose recount is done (all of them once the recorder settled)."""
        still = []
        for r in self._late:
            if self.waiting is not None and self.waiting(r):
                still.append(r)
            else:
                self._fold(r)
        self._late = still

    def extend(self, records: Iterable[RequestRecord]) -> None:
        for r in records:
            self.append(r)

    def __len__(self) -> int:
        return self.appended

    def __iter__(self) -> Iterator[RequestRecord]:
        if self.records is None:
            raise TypeError("this level did not keep its records (bounded memory): read them from the run "
                            "directory")
        return iter(self.records)

    def __getitem__(self, i):
        if self.records is None:
            raise TypeError("this level did not keep its records")
        return self.records[i]

    def __bool__(self) -> bool:
        return self.appended > 0

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord], slos: Sequence | None = None,
                     window_start_ns: int | None = None) -> LevelTally:
        tally = cls(slos=slos, keep=False, window_start_ns=window_start_ns)
        for r in records:
            tally.append(r)
        return tally

    # ---- folding one record ----
    def _fold(self, r: RequestRecord) -> None:
        """One finished request into the tally. This runs in the client's event loop as each request ends, where
        its time delays the reading of every other stream's tokens: each event list is walked a few times in
        C-level passes (comprehensions, sum, min, max), never once per event in Python statements."""
        status = 0 if r.ok else 2 if is_cancelled(r) else 1
        self.status.append(status)
        self.t_send.append(r.t_send_ns)
        self.t_end.append(r.t_end_ns if r.t_end_ns is not None else NONE_NS)
        self.lag_ms.append((r.t_send_ns - r.scheduled_ns) / NS_PER_MS if r.scheduled_ns is not None else NAN)
        if not r.stream:
            self.unary += 1
        carrying = [e for e in r.events if e.tokens > 0]  # request_figures.token_events, as TokenEvents
        times = [e.t_ns for e in carrying]
        counts = [e.tokens for e in carrying]
        output = sum(counts)
        answer = sum([e.tokens for e in carrying if e.kind == "answer"])
        self.client_tokens += output
        if self.slos:
            self.meets.append(1 if status != 2 and request_meets(r, self.slos) else 0)
        if self.count_window and carrying:
            self._fold_events(carrying, times, output, answer, status == 0)
        if status == 1:
            self.errors[r.error_kind or "unknown"] += 1
            self._group_error(r)
            if r.images is not None:  # counted per image group as failed (image_figures.py)
                self.image_rows.append(image_row(r, None))
            return
        if status == 2:
            return
        if not r.stream:
            self._fold_unary(r)
            return
        self.count_methods.add(r.count_method)
        self.ok_end.append(r.t_end_ns if r.t_end_ns is not None else NONE_NS)
        self.ttft_ms.append(_ms(times[0] - r.t_send_ns) if times else NAN)
        self.ttfo_ms.append(_ms(ttfo_ns(r)))
        self.e2e_ns.append(r.t_end_ns - r.t_send_ns if r.t_end_ns is not None else NONE_NS)
        # request_figures.decode_span, from the lists above: tokens after the first event, over first to last event
        decode_tokens, decode_ns = output - (counts[0] if counts else 0), (times[-1] - times[0] if times else 0)
        decoded = len(times) > 1 and decode_tokens > 0 and decode_ns > 0
        self.decode_tok_s.append(decode_tokens * NS_PER_S / decode_ns if decoded else NAN)
        self.tpot_ms.append(decode_ns / decode_tokens / NS_PER_MS if decoded else NAN)
        self.output_tokens.append(output)
        self.answer_tokens.append(answer)
        self.reasoning_tokens.append(output - answer)  # an event's tokens are answer or reasoning
        if len(times) > 1:
            later = counts[1:]
            per_event = [(t - t_prev) / NS_PER_MS for t_prev, t in zip(times, times[1:])]
            if max(later) == 1:  # one token per event (the usual stream): per-token gaps are the event gaps
                self.itl.add_all(per_event)
            else:
                self.itl.add_all([(t - t_prev) / k / NS_PER_MS for t_prev, t, k in zip(times, times[1:], later)],
                                 later)
            self.itl_chunk.add_all(per_event)
        self._warnings(r, output)
        if (r.usage is not None and r.usage.cached_tokens is not None) or r.turn is not None:
            self.cache_rows.append(cache_row(r))  # only these make a row worth keeping (cache_figures.py)
        if r.tools_declared is not None:  # the shares are over requests that declared tools (docs/metrics.md)
            self.tool_rows.append(tool_row(r))
        if r.schema_valid is not None:
            self.schema_verdicts.append(r.schema_valid)
        if r.images is not None:
            self.image_rows.append(image_row(r, _ms(times[0] - r.t_send_ns) if times else None))

    def _fold_unary(self, r: RequestRecord) -> None:
        """A successful non-streamed request: its end and latency, items and prompt tokens; no token figures."""
        self.ok_end.append(r.t_end_ns if r.t_end_ns is not None else NONE_NS)
        self.e2e_ns.append(r.t_end_ns - r.t_send_ns if r.t_end_ns is not None else NONE_NS)
        self.items.append(r.items or 0)
        prompt = r.usage.prompt_tokens if r.usage is not None else None
        self.usage_prompt.append(prompt if prompt is not None else -1)
        if r.input_tokens is not None and prompt is not None and prompt != r.input_tokens:
            self._warn("prompt", f"request {r.index}: {r.input_tokens} sent, {prompt} in usage.prompt_tokens")

    def _fold_events(self, carrying: list, times: list[int], tokens: int, answer: int, ok: bool) -> None:
        """The window's tokens: counted at once for events before the floor, kept (three numbers each) for later
        ones until the window's end is known."""
        floor = self.floor() if self.floor is not None else None
        start = self.window_start_ns
        if floor is not None and max(times) < floor and (start is None or min(times) >= start):
            self.folded_events += len(times)  # the usual case: every event inside
            if ok:
                self.folded_tokens += tokens
                self.folded_answer += answer
            return
        for e in carrying:
            if start is not None and e.t_ns < start:
                continue
            if floor is not None and e.t_ns < floor:
                self.folded_events += 1
                if ok:
                    self.folded_tokens += e.tokens
                    if e.kind == "answer":
                        self.folded_answer += e.tokens
            else:
                self._pending_t.append(e.t_ns)
                self._pending_tokens.append(e.tokens)
                self._pending_flags.append((1 if ok else 0) | (2 if e.kind == "answer" else 0))

    def _group_error(self, r: RequestRecord) -> None:
        key = error_key(r)
        if key in self._groups:
            self._groups[key].count += 1
        else:
            self._groups[key] = ErrorCount(kind=r.error_kind or "unknown", status=r.http_status,
                                           detail=r.error_detail, count=1)

    def _warnings(self, r: RequestRecord, output: int) -> None:
        usage = r.usage
        if usage and usage.completion_tokens and not r.events:
            # the server generated tokens, and no event the client read carried one (an event type it does not
            # read): no TTFT, no output figure from this request, and the summary says why instead of a silent 0
            self._warn("unread", f"request {r.index}: {usage.completion_tokens} in usage, no token event read "
                                 f"from {r.chunks} events")
        elif usage and usage.completion_tokens is not None and usage.completion_tokens != output \
                and not one_short_by_eos(r):
            self._warn("usage", f"request {r.index}: {output} counted by {r.count_method}, "
                                f"{usage.completion_tokens} in usage")
        if r.sampling.get("ignore_eos") and r.max_tokens is not None and output != r.max_tokens:
            self._warn("ignore_eos", f"request {r.index}: {output} of {r.max_tokens}")
        if r.input_tokens is not None and usage and usage.prompt_tokens is not None \
                and usage.prompt_tokens != r.input_tokens:
            self._warn("prompt", f"request {r.index}: {r.input_tokens} sent, {usage.prompt_tokens} in "
                                 f"usage.prompt_tokens")
        min_tokens = r.sampling.get("min_tokens")
        if isinstance(min_tokens, int) and generated_tokens(r) < min_tokens:
            self._warn("min_tokens", f"request {r.index}: {generated_tokens(r)} of at least {min_tokens}")

    def _warn(self, key: str, example: str) -> None:
        self.warn_counts[key] += 1
        self.warn_example.setdefault(key, example)

    # ---- reading ----
    @property
    def measured(self) -> int:
        return len(self.status)

    @property
    def ok(self) -> int:
        return len(self.ok_end)

    @property
    def failed(self) -> int:
        return self.status.count(1)

    @property
    def cancelled(self) -> int:
        return self.status.count(2)

    def counted_by(self) -> str | None:
        if not self.count_methods:
            return None
        return next(iter(self.count_methods)) if len(self.count_methods) == 1 else "mixed"

    def in_window(self, window: tuple[int, int]) -> tuple[int, int, int]:
        """(tokens of successful requests, their answer tokens, token events of every measured request) inside
        `window`, counting each event whose time t has start <= t <= end. The folded counts already hold the
        events before the floor; those must lie inside any window the level can end with."""
        ws, we = window
        tokens, answer, events = self.folded_tokens, self.folded_answer, self.folded_events
        if self.window_start_ns is not None and ws > self.window_start_ns and self.folded_events:
            # events before `ws` were folded as inside: only a window starting no later than the level can be
            # counted from this tally (an interrupted level's window starts at its begin, a little earlier)
            raise ValueError("the window starts after the tally's own start")
        for t, k, flags in zip(self._pending_t, self._pending_tokens, self._pending_flags):
            if ws <= t <= we:
                events += 1
                if flags & 1:
                    tokens += k
                    if flags & 2:
                        answer += k
        return tokens, answer, events

    def span(self) -> tuple[int, int]:
        """(first send, last end or send) of the measured requests: a single-stream level's window."""
        if not self.t_send:
            return 0, 0
        return self.t_send[0], max(max(self.t_send), max(self.t_end))

    def completed_in(self, window: tuple[int, int]) -> int:
        ws, we = window
        return sum(1 for t in self.ok_end if t != NONE_NS and ws <= t <= we)

    def unary_in(self, window: tuple[int, int]) -> tuple[int, int, int]:
        """(items, server-counted prompt tokens, requests without usage.prompt_tokens) of the successful
        non-streamed requests that ended inside `window`."""
        ws, we = window
        items = tokens = missing = 0
        for t, k, p in zip(self.ok_end, self.items, self.usage_prompt):
            if t != NONE_NS and ws <= t <= we:
                items += k
                if p < 0:
                    missing += 1
                else:
                    tokens += p
        return items, tokens, missing

    def ok_e2e_s(self) -> Iterator[tuple[int, float]]:
        """(end ns, E2E s) of every successful request that ended."""
        for t, e in zip(self.ok_end, self.e2e_ns):
            if t != NONE_NS:
                yield t, e / NS_PER_S

    def e2e_ms(self) -> list[float]:
        return [e / NS_PER_MS for e in self.e2e_ns if e != NONE_NS]

    def top_errors(self, limit: int) -> list[ErrorCount]:
        return sorted(self._groups.values(), key=lambda e: -e.count)[:limit]

    def ttft_mean_ms(self) -> float | None:
        values = [v for v in self.ttft_ms if not math.isnan(v)]
        return sum(values) / len(values) if values else None


def as_tally(records: Sequence[RequestRecord] | LevelTally, slos: Sequence | None = None) -> LevelTally:
    """The tally of `records` (itself when it is one). A tally must have been told the SLO targets it is
    asked about: it judged each request against them as it was folded."""
    if isinstance(records, LevelTally):
        if slos and [s.key for s in slos] != [s.key for s in records.slos]:
            raise ValueError("this level was tallied without these SLO targets")
        return records
    return LevelTally.from_records(records, slos=slos)


def finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def _ms(ns: int | None) -> float:
    return ns / NS_PER_MS if ns is not None else NAN
