"""How many warm-up requests a bench sends before its first level, and how (docs/metrics.md#warm-up).

A server just started (or idle for a while) is slower on its first requests: pages of the weights not yet read,
the KV cache and batch buffers not yet touched at the sizes the load will use, a JIT or CUDA graph compiled on
first use. A level measured right after start-up then measures that, and one request warms only the
single-stream path. So, by default ("auto"), the warm-up is the load the run will reach, once:

- as many requests at once as the highest concurrency the plan uses, capped by the server's slots where the
  server says how many it has (llama.cpp's /props `total_slots`: more requests than slots would only queue);
- then one request alone, so the single-stream path is warm too and the first level starts on an idle server.

The highest concurrency the plan uses, as each mode declares it (bench/modes/, `peak_streams`): 1 for
single-stream, the sweep's top level (`max_concurrency`, or the levels a later trial repeats), `--concurrency` for
one level, the users of a closed-loop multi-turn run, the highest concurrency an SLO search over concurrency may
try; for open-loop modes (rate, rate-sweep, slo-search over rates, open-loop multi-turn, replay) the
`--max-concurrency` cap on requests in flight, else OPEN_LOOP_STREAMS.

`--warmup N` (an explicit number) keeps its meaning: N requests, one at a time (0: none). Every warm-up request
is recorded with `warmup: true` and is outside every figure, level window and server-metric window.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.bench.modes import mode_of

OPEN_LOOP_STREAMS = 4  # open loop without a cap: requests in flight for the auto warm-up


@dataclass(frozen=True)
class WarmUp:
    concurrent: int = 0  # sent at once, first
    sequential: int = 0  # then one at a time

    @property
    def total(self) -> int:
        return self.concurrent + self.sequential

    def describe(self) -> str:
        """8 concurrent + 1; 2 requests, one at a time; 1 request."""
        if self.concurrent:
            return f"{self.concurrent} concurrent + {self.sequential}" if self.sequential else \
                f"{self.concurrent} concurrent"
        return "1 request" if self.sequential == 1 else f"{self.sequential} requests, one at a time"


def peak_streams(options) -> int:
    """The highest concurrency the bench's plan will use (OPEN_LOOP_STREAMS for open loop without a cap)."""
    streams = mode_of(options).peak_streams(options)
    return OPEN_LOOP_STREAMS if streams is None else streams


def plan_warmup(options, server_slots: int | None = None) -> WarmUp:
    """The warm-up of a bench with these options against a server with `server_slots` slots (None: unknown).
    `options.warmup`: None is auto (module docstring), a number that many requests one at a time."""
    if options.warmup is not None:
        return WarmUp(sequential=options.warmup)
    streams = max(1, peak_streams(options))
    if server_slots is not None and server_slots > 0:
        streams = min(streams, server_slots)
    if streams == 1:  # one at a time either way
        return WarmUp(sequential=2)
    return WarmUp(concurrent=streams, sequential=1)
