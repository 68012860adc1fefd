"""The figures of a load level, declared once: what each one is, how it pools across trials and where it shows.

Every key a level Summary's `figures` can hold has one entry here, in the order a Summary holds them. What reads
the table:

- bench/metrics.py `summarize` computes each entry with its function (`metrics.MEASURES`, by key) and takes the
  figure's unit, definition, headline statistic and `counted_by` from here;
- bench/steady.py withholds the window rates of a level that is not measured (`AGGREGATE_KEYS`), and
  bench/trials.py pools those rates across trials as a window-weighted mean, recomputing every other figure from
  the trials' requests together;
- store/export.py lays out the figure columns of levels.csv, report/terminal.py the columns of the level table;
- compare can read a figure's unit and direction here (`lookup` takes a headline key such as "single.ttft_ms").

Adding a figure: one entry here, and its function in bench/metrics.py `MEASURES`. Its definition goes in
docs/metrics.md under the anchor the entry names.

The GPU figures (`GPU_FIGURES`) are level figures of the same kind, read by the same code, but they come from the
level's GPU telemetry (its `GpuSummary`), not from its requests: bench/gpu_figures.py makes them
(`gpu_level_figures`, each from its function in `GPU_MEASURES`) and pools them across trials (`pool_gpu`), so
`summarize` and `MEASURES` know nothing of them. Adding one: an entry in `GPU_FIGURES` and its function there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from servelab.records import Distribution, Figure


class Pooling(Enum):
    """How a figure of several trials' levels of one tag becomes one figure (docs/metrics.md#trials)."""

    # A count over the level's measurement window ÷ its length (output tok/s). A window that did not reach a
    # steady state has no such rate (docs/metrics.md#steady-state); across trials, the window-weighted mean of
    # the measured trials' rates.
    WINDOW_RATE = "window rate"
    # A distribution over requests or their token gaps (TTFT, ITL): recomputed over every trial's requests.
    REQUESTS = "requests"
    # A ratio of sums over requests (reasoning share, cache hit ratio): recomputed over every trial's requests.
    RATIO = "ratio"
    # A figure of the level's GPU telemetry (docs/metrics.md#gpu): recomputed from the measured trials' sums, as
    # if their windows were one: (Σ energy) ÷ (Σ tokens) for energy per token, (Σ energy) ÷ (Σ window) for power,
    # means over every trial's readings (bench/gpu_figures.py `pool_gpu`). Neither a window rate nor a
    # distribution over requests.
    TELEMETRY = "telemetry"


@dataclass(frozen=True)
class TerminalColumn:
    """One column of the terminal's level table: a two-line header (name, then unit and statistic), the value or
    one statistic of the figure's distribution, and its digits."""

    header: str
    stat: str = "value"  # "value", or a Distribution field (p50, p99, …)
    digits: int = 1


@dataclass(frozen=True)
class CsvColumns:
    """Where a figure sits in levels.csv: `position` orders the figure columns. Scripts index columns, so a
    figure added later takes the next position and earlier columns keep their place."""

    position: int
    # "value": one column, the figure's value (`output_tok_s`); "stats": one per statistic of its distribution
    # (`ttft_ms_n`, `ttft_ms_mean`, … `ttft_ms_max`)
    columns: Literal["value", "stats"]

    @property
    def stats(self) -> bool:
        return self.columns == "stats"


@dataclass(frozen=True)
class LevelFigure:
    """One figure of a load level, as everything that computes, pools, withholds, writes or shows it reads it."""

    key: str
    unit: str
    higher_is_better: bool | None  # None: neither (a token count, a share: it explains, it is not a goal)
    definition: str  # anchor in docs/metrics.md
    pooling: Pooling
    # The statistic of the figure's distribution that is its value ("p50", "mean", "p99"); None: the value is
    # computed apart (a rate, a ratio of sums).
    headline: str | None
    # Whether the figure depends on how tokens were counted, so it carries the level's `counted_by` (a pure
    # timing, such as E2E or request/s, does not).
    counts_tokens: bool
    csv: CsvColumns | None
    terminal: tuple[TerminalColumn, ...] = ()
    # Which levels have the figure: "all"; "streamed" (it times tokens in a stream: TTFT, ITL, output tok/s),
    # absent from a level of non-streamed requests (embeddings, rerank) rather than 0; "unary" (items/s, input
    # tok/s): only such a level has it (docs/metrics.md#non-streamed).
    applies: Literal["all", "streamed", "unary"] = "all"
    # The columns of the level table of a non-streamed run (report/terminal.py), which has no token columns.
    unary_terminal: tuple[TerminalColumn, ...] = ()

    @property
    def withheld_unmeasured(self) -> bool:
        """Blanked on a level that is not measured: a rate over a window that never reached a steady state means
        nothing, while each request's latency is still a real measurement."""
        return self.pooling is Pooling.WINDOW_RATE

    def make(self, value: float | None, *, dist: Distribution | None = None, note: str | None = None,
             counted_by: str | None = None) -> Figure:
        """The figure with this entry's unit and definition; `counted_by` only when it counts tokens."""
        return Figure(value=value, unit=self.unit, definition=self.definition,
                      counted_by=counted_by if self.counts_tokens else None, dist=dist, note=note)


def _fig(key: str, unit: str, higher_is_better: bool | None, definition: str, pooling: Pooling, *,
         headline: str | None = None, counts_tokens: bool, csv: tuple[int, Literal["value", "stats"]] | None,
         terminal: tuple[TerminalColumn, ...] = (), applies: Literal["all", "streamed", "unary"] = "streamed",
         unary_terminal: tuple[TerminalColumn, ...] = ()) -> LevelFigure:
    return LevelFigure(key, unit, higher_is_better, definition, pooling, headline, counts_tokens,
                       CsvColumns(*csv) if csv else None, terminal, applies, unary_terminal)


RATE, REQUESTS, RATIO = Pooling.WINDOW_RATE, Pooling.REQUESTS, Pooling.RATIO
HIGHER, LOWER, NEITHER = True, False, None

LEVEL_FIGURES: tuple[LevelFigure, ...] = (
    _fig("output_tok_s", "tok/s", HIGHER, "output-tok-s", RATE, counts_tokens=True, csv=(1, "value"),
         terminal=(TerminalColumn("output\ntok/s"),)),
    _fig("request_s", "req/s", HIGHER, "request-s", RATE, counts_tokens=False, csv=(2, "value"),
         terminal=(TerminalColumn("req/s", digits=2),), applies="all",
         unary_terminal=(TerminalColumn("req/s", digits=2),)),
    _fig("decode_tok_s", "tok/s", HIGHER, "decode-tok-s", REQUESTS, headline="p50", counts_tokens=True,
         csv=(11, "stats"), terminal=(TerminalColumn("decode\ntok/s p50"),)),
    _fig("ttft_ms", "ms", LOWER, "ttft", REQUESTS, headline="p50", counts_tokens=True, csv=(5, "stats"),
         terminal=(TerminalColumn("TTFT\nms p50", "p50"), TerminalColumn("TTFT\nms p99", "p99"))),
    _fig("ttfo_ms", "ms", LOWER, "ttfo", REQUESTS, headline="p50", counts_tokens=True, csv=(6, "stats")),
    _fig("itl_ms", "ms", LOWER, "itl", REQUESTS, headline="p50", counts_tokens=True, csv=(7, "stats"),
         terminal=(TerminalColumn("ITL\nms p50", "p50"), TerminalColumn("ITL\nms p99", "p99"))),
    _fig("itl_chunk_ms", "ms", LOWER, "itl-chunk", REQUESTS, headline="p50", counts_tokens=False,
         csv=(8, "stats")),
    _fig("tpot_ms", "ms", LOWER, "tpot", REQUESTS, headline="p50", counts_tokens=True, csv=(9, "stats")),
    _fig("e2e_ms", "ms", LOWER, "e2e", REQUESTS, headline="p50", counts_tokens=False, csv=(10, "stats"),
         terminal=(TerminalColumn("E2E\nms p50", digits=0),), applies="all",
         unary_terminal=(TerminalColumn("latency\nms p50", "p50"), TerminalColumn("latency\nms p90", "p90"),
                         TerminalColumn("latency\nms p99", "p99"))),
    _fig("output_tokens", "tokens", NEITHER, "output-tokens", REQUESTS, headline="mean", counts_tokens=True,
         csv=(12, "stats")),
    # Reasoning apart from the answer (docs/metrics.md#reasoning): the figures that mean the same whether or not
    # an engine thinks.
    _fig("answer_tok_s", "tok/s", HIGHER, "answer-tok-s", RATE, counts_tokens=True, csv=(14, "value")),
    _fig("reasoning_tokens", "tokens", NEITHER, "reasoning-tokens", REQUESTS, headline="mean", counts_tokens=True,
         csv=(18, "stats")),
    _fig("answer_tokens", "tokens", NEITHER, "answer-tokens", REQUESTS, headline="mean", counts_tokens=True,
         csv=(17, "stats")),
    _fig("reasoning_share", "fraction", NEITHER, "reasoning-share", RATIO, counts_tokens=True, csv=(15, "value")),
    # Only where requests had a schedule to lag behind (open loop).
    _fig("client_lag_ms", "ms", LOWER, "client-lag", REQUESTS, headline="p99", counts_tokens=False,
         csv=(13, "stats"), applies="all"),
    # Only with latency targets (bench/slo.py).
    _fig("goodput_req_s", "req/s", HIGHER, "goodput", RATE, counts_tokens=False, csv=(3, "value"), applies="all"),
    _fig("slo_attainment", "fraction", HIGHER, "slo-attainment", RATIO, counts_tokens=False, csv=(4, "value"),
         applies="all"),
    # Only when some request reported cached prompt tokens (bench/cache_figures.py).
    _fig("cache_hit_ratio", "fraction", NEITHER, "cache-hit-ratio", RATIO, counts_tokens=False,
         csv=(16, "value")),
    _fig("cached_tokens", "tokens", NEITHER, "cached-tokens", REQUESTS, headline="mean", counts_tokens=False,
         csv=(19, "stats")),
    _fig("ttft_cached_ms", "ms", LOWER, "ttft-by-cache", REQUESTS, headline="p50", counts_tokens=False,
         csv=(20, "stats")),
    _fig("ttft_uncached_ms", "ms", LOWER, "ttft-by-cache", REQUESTS, headline="p50", counts_tokens=False,
         csv=(21, "stats")),
    # Only on a level of chat with images (bench/image_figures.py; docs/metrics.md#images).
    _fig("images_per_request", "images", NEITHER, "images-per-request", REQUESTS, headline="mean",
         counts_tokens=False, csv=(30, "stats")),
    _fig("image_megapixels", "MP", NEITHER, "image-megapixels", REQUESTS, headline="mean", counts_tokens=False,
         csv=(31, "stats")),
    _fig("ttft_image_ms", "ms", LOWER, "ttft-by-images", REQUESTS, headline="p50", counts_tokens=False,
         csv=(32, "stats")),
    _fig("ttft_text_ms", "ms", LOWER, "ttft-by-images", REQUESTS, headline="p50", counts_tokens=False,
         csv=(33, "stats")),
    # Only on a level of non-streamed requests (embeddings, rerank; docs/metrics.md#non-streamed). Their CSV
    # columns follow the GPU figures'.
    _fig("items_s", "items/s", HIGHER, "items-s", RATE, counts_tokens=False, csv=(28, "value"), applies="unary",
         unary_terminal=(TerminalColumn("items/s"),)),
    _fig("input_tok_s", "tok/s", HIGHER, "input-tok-s", RATE, counts_tokens=False, csv=(29, "value"),
         applies="unary", unary_terminal=(TerminalColumn("input\ntok/s"),)),
    # Only where requests declared tools or asked for a response format (bench/answer_figures.py;
    # docs/metrics.md#tool-calls, #structured-output).
    _fig("tool_first_ms", "ms", LOWER, "tool-first", REQUESTS, headline="p50", counts_tokens=False,
         csv=(34, "stats")),
    _fig("tool_call_ms", "ms", LOWER, "tool-call", REQUESTS, headline="p50", counts_tokens=False,
         csv=(35, "stats")),
    _fig("tool_call_share", "fraction", NEITHER, "tool-call-share", RATIO, counts_tokens=False, csv=(36, "value")),
    _fig("tool_parse_share", "fraction", HIGHER, "tool-parse-share", RATIO, counts_tokens=False,
         csv=(37, "value")),
    _fig("tool_valid_share", "fraction", HIGHER, "tool-valid-share", RATIO, counts_tokens=False,
         csv=(38, "value")),
    _fig("schema_valid_share", "fraction", HIGHER, "schema-valid-share", RATIO, counts_tokens=False,
         csv=(39, "value")),
)

TELEMETRY = Pooling.TELEMETRY

# From the level's GPU telemetry (bench/gpu_figures.py), over the engine's GPUs; their CSV columns follow the
# request figures'.
GPU_FIGURES: tuple[LevelFigure, ...] = (
    _fig("j_per_output_token", "J/token", LOWER, "gpu-j-per-token", TELEMETRY, counts_tokens=True,
         csv=(22, "value")),
    _fig("j_per_answer_token", "J/token", LOWER, "gpu-j-per-answer-token", TELEMETRY, counts_tokens=True,
         csv=(23, "value")),
    _fig("output_tokens_per_j", "tok/J", HIGHER, "gpu-tokens-per-j", TELEMETRY, counts_tokens=True,
         csv=(24, "value")),
    _fig("gpu_power_w_mean", "W", NEITHER, "gpu-power", TELEMETRY, counts_tokens=False, csv=(25, "value"),
         applies="all"),
    _fig("gpu_sm_active_pct_mean", "%", NEITHER, "gpu-sm-activity", TELEMETRY, counts_tokens=False,
         csv=(26, "value"), applies="all"),
    _fig("gpu_idle_share", "fraction", NEITHER, "gpu-idle-share", TELEMETRY, counts_tokens=False,
         csv=(27, "value"), applies="all"),
)

FIGURES: dict[str, LevelFigure] = {f.key: f for f in LEVEL_FIGURES}
GPU_FIGURE_BY_KEY: dict[str, LevelFigure] = {f.key: f for f in GPU_FIGURES}

# The window rates: blanked on a level that is not measured (bench/steady.py), pooled across trials as a
# window-weighted mean (bench/trials.py).
AGGREGATE_KEYS: tuple[str, ...] = tuple(f.key for f in LEVEL_FIGURES if f.pooling is Pooling.WINDOW_RATE)
WITHHELD_KEYS: tuple[str, ...] = tuple(f.key for f in LEVEL_FIGURES if f.withheld_unmeasured)

# The scopes a headline key names its level figure under ("single.ttft_ms": the single-stream level's ttft_ms).
HEADLINE_SCOPES = ("single", "peak", "load", "slo")


def lookup(key: str) -> LevelFigure | None:
    """The level figure a key names: a level key ("ttft_ms"), or a headline key that takes a level's figure
    ("single.ttft_ms", "peak.output_tok_s"). None for a key of no level figure ("peak.concurrency")."""
    scope, dot, name = key.partition(".")
    if not dot:
        return FIGURES.get(key) or GPU_FIGURE_BY_KEY.get(key)
    return (FIGURES.get(name) or GPU_FIGURE_BY_KEY.get(name)) if scope in HEADLINE_SCOPES else None
