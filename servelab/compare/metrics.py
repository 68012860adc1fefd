"""The figures `compare` sets side by side, which way is better for each, and the data to resample them from.

Each key names a figure a run already holds (a headline figure, or a figure of one of its levels), taken
unchanged; `resampler` rebuilds the same figure from the run's per-request records so bootstrap.py can put an
interval around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servelab.bench import metrics as m
from servelab.bench.request_figures import tool_first_ns
from servelab.bench.steady import is_measured
from servelab.compare.bootstrap import (BinnedRate, EnergyPerToken, MeanOf, MedianOf, PercentileOf, PooledMedian,
                                         Resampler, Trials, time_bins)
from servelab.compare.run_data import RunData
from servelab.records import Figure, RequestRecord, Step, Summary


@dataclass(frozen=True)
class KeyMetric:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    definition: str  # anchor in docs/metrics.md
    resampler: Callable[[RunData], Resampler | None] | None = None
    # Where the figure is read from; None: the run's headline figure under `key`.
    figure: Callable[[RunData], Figure | None] | None = None
    # What the figure was measured at, when that can differ between runs (e.g. "c4").
    where: Callable[[RunData], str | None] | None = None
    # Shown only when some run of the comparison counted reasoning tokens (the answer-only figures equal the
    # plain ones otherwise); `neutral`: no better or worse, only different (the reasoning share).
    reasoning_only: bool = False
    neutral: bool = False
    # Why a run has no value, when it has none ("not measured: no GPU telemetry source"); a metric with it is shown
    # when any run has the figure (the others say why), not only when the baseline does.
    why_none: Callable[[RunData], str | None] | None = None

    def value(self, run: RunData) -> float | None:
        # literal figures are typed by key; a measured run's figure is read where the metric says
        fig = self.figure(run) if self.figure and not run.literal else run.headline.get(self.key)
        return fig.value if fig is not None else None


def step_of_mode(run: RunData, mode: str) -> Step | None:
    """The run's first step of a mode (its levels pool the trials that count)."""
    return next((s for s in run.steps if s.result.mode == mode), None)


def single_level(run: RunData) -> Summary | None:
    """The level the `single.*` headline figures come from: the single-stream run, else a sweep's concurrency 1
    (as bench/runner.py `headline` picks it)."""
    if run.single is not None:
        level = next((s for s in run.single.levels if s.mode == "single"), None)
        if level is not None:
            return level
    levels = run.sweep.levels if run.sweep else []
    return next((s for s in levels if s.mode == "single"), None) or next(
        (s for s in levels if s.mode == "concurrency" and s.concurrency == 1), None)


def _peak_bench(run: RunData):
    """The bench the run's `peak.*` headline came from: the first step other than single-stream that has one (as
    bench/trials.py run_headline picks it), else the sweep (or what ran in its place)."""
    return next((s.result for s in run.steps if s.result.mode != "single" and "peak.output_tok_s" in
                 s.result.headline), None) or run.sweep


def peak_level(run: RunData) -> Summary | None:
    """The level `peak.output_tok_s` was reached at: the one with the highest output tok/s among the levels the
    headline chose from (concurrency levels, else offered-rate levels)."""
    bench = _peak_bench(run)
    levels = bench.levels if bench else []
    for mode in ("concurrency", "rate"):
        candidates = [s for s in levels if s.mode == mode and s.figures.get("output_tok_s")
                      and s.figures["output_tok_s"].value]
        if candidates:
            return max(candidates, key=lambda s: s.figures["output_tok_s"].value or 0.0)
    return None


def top_level(run: RunData) -> Summary | None:
    """The sweep's highest concurrency level: the most load both engines were asked to carry."""
    levels = [s for s in (run.sweep.levels if run.sweep else []) if s.mode == "concurrency" and s.ok]
    measured = [s for s in levels if is_measured(s)]  # a level too short for a steady state only if none was
    levels = measured or levels
    return max(levels, key=lambda s: s.concurrency) if levels else None


def _over_trials(run: RunData, level: Summary | None, build: Callable[[RunData, Summary, int], Resampler | None]
                 ) -> Resampler | None:
    """The figure's resampler over the trials that count (a Trials, hierarchical), each trial's part built from
    that trial's records of the level."""
    if level is None:
        return None
    built = [(trial, build(run, level, trial)) for trial in run.counted]
    kept = [(trial, p) for trial, p in built if p is not None and p.n]
    return Trials([p for _, p in kept], ids=[run.round_of(trial) for trial, _ in kept]) if kept else None


def _per_request(value: Callable, level_of: Callable[[RunData], Summary | None] = single_level
                 ) -> Callable[[RunData], Resampler | None]:
    def part(run: RunData, level: Summary, trial: int) -> Resampler | None:
        values = [v for v in (value(r) for r in run.records_of(level.tag, trial)) if v is not None]
        return MedianOf(values) if values else None
    return lambda run: _over_trials(run, level_of(run), part)


def _per_request_share(verdict: Callable[[RequestRecord], bool | None]) -> Callable[[RunData], Resampler | None]:
    """A share in % of the requests with a verdict (None: not judged), resampling whole requests."""
    def part(run: RunData, level: Summary, trial: int) -> Resampler | None:
        values = [100.0 if v else 0.0 for v in (verdict(r) for r in run.records_of(level.tag, trial))
                  if v is not None]
        return MeanOf(values) if values else None
    return lambda run: _over_trials(run, single_level(run), part)


def _single_level_figure(key: str) -> Callable[[RunData], Figure | None]:
    def figure(run: RunData) -> Figure | None:
        level = single_level(run)
        return level.figures.get(key) if level is not None else None
    return figure


def _single_level_share(key: str) -> Callable[[RunData], Figure | None]:
    """A level's share (a fraction) as the % compare shows shares in."""
    def figure(run: RunData) -> Figure | None:
        fig = _single_level_figure(key)(run)
        if fig is None or fig.value is None:
            return None
        return Figure(value=fig.value * 100, unit="%", definition=fig.definition, note=fig.note)
    return figure


def _no_answers(run: RunData, key: str) -> str | None:
    """Why a run has no tool-call or schema figure: its requests declared no tools, asked for no format, or (tools
    declared, none called) made no call to time or judge."""
    if _single_level_figure(key)(run) is not None:
        return None
    if key == "schema_valid_share":
        return "not measured: its requests asked for no response format"
    if _single_level_figure("tool_call_share")(run) is not None:
        return "not measured: no request made a tool call"
    return "not measured: its requests declared no tools"


def _itl(run: RunData) -> Resampler | None:
    def part(run: RunData, level: Summary, trial: int) -> Resampler | None:
        return PooledMedian([m.token_gaps_ms(r) for r in run.records_of(level.tag, trial)])
    return _over_trials(run, single_level(run), part)


def _trial_level(run: RunData, tag: str, trial: int) -> Summary | None:
    """One trial's own level of a tag (the run's levels pool every trial)."""
    found = run.trial(trial)
    return next((s for s in found.levels if s.tag == tag), None) if found else None


def _peak_throughput(run: RunData, kind: str | None = None,
                     level_of: Callable[[RunData], Summary | None] = peak_level) -> Resampler | None:
    """Output tok/s at the peak level (or `level_of`'s); with `kind` ("answer"), only the tokens of that kind
    (answer tok/s)."""
    key = "answer_tok_s" if kind == "answer" else "output_tok_s"
    if run.peer is not None and not run.peer.timeline:
        return None  # another tool's requests without start times: no time bins to draw

    def part(run: RunData, pooled: Summary, trial: int) -> Resampler | None:
        level = _trial_level(run, pooled.tag, trial) or (pooled if len(run.counted) == 1 else None)
        records = run.records_of(pooled.tag, trial)
        if level is None or not records or level.window_s <= 0:
            return None
        fig = level.figures.get(key)
        if fig is None or not fig.value:
            return None  # not measured in this trial (too short for a steady state)
        # The level's window began at its first send (bench/loads: the level starts, then the first request
        # goes); the figure is tokens received inside it over its length.
        start = min(r.t_send_ns for r in records)
        counts, bin_s = time_bins([(e.t_ns, e.tokens) for r in records for e in r.events
                                   if kind is None or e.kind == kind], start, level.window_s)
        if not sum(counts):
            return None
        observed = sum(counts) / level.window_s
        return BinnedRate(counts, bin_s, scale=fig.value / observed if observed else 1.0)
    return _over_trials(run, level_of(run), part)


def _peak_answer_throughput(run: RunData) -> Resampler | None:
    """Answer tok/s at the peak level: the peak's resampler over answer tokens only."""
    return _peak_throughput(run, kind="answer")


def run_reasoning_share(run: RunData) -> float | None:
    """Reasoning tokens over output tokens of every measured, successful request of the run (trials that
    count); None for literal figures or a run without records."""
    records = [r for r in run.records if not r.warmup and r.ok and r.trial in set(run.counted)]
    total = sum(r.output_tokens for r in records)
    return sum(r.reasoning_tokens for r in records) / total if total else None


def _share_figure(run: RunData) -> Figure | None:
    share = run_reasoning_share(run)
    return Figure(value=share * 100, unit="%", definition="reasoning-share") if share is not None else None


def _ms(ns: int | None) -> float | None:
    return ns / m.NS_PER_MS if ns is not None else None


def multiturn_level(run: RunData) -> Summary | None:
    """A multi-turn level (issue 16): the first level with figures per turn."""
    return next((s for s in run.levels if s.turns), None)


def _late_ttfts(run: RunData, level: Summary, trial: int | None = None) -> list[float]:
    """TTFT of the level's late turns: those past the middle of its longest conversation (turns 4-6 of 6)."""
    last = max(t.turn for t in level.turns)
    return [v for r in run.records_of(level.tag, trial) if r.turn is not None and r.turn > last / 2
            and (v := _ms(m.ttft_ns(r))) is not None]


def _late_ttft(run: RunData) -> Resampler | None:
    def part(run: RunData, level: Summary, trial: int) -> Resampler | None:
        values = _late_ttfts(run, level, trial)
        return MedianOf(values) if values else None
    return _over_trials(run, multiturn_level(run), part)


def _late_ttft_figure(run: RunData) -> Figure | None:
    level = multiturn_level(run)
    values = sorted(_late_ttfts(run, level)) if level else []
    return Figure(value=m.percentile(values, 50), unit="ms", definition="late-turn-ttft") if values else None


def _late_turns(run: RunData) -> str | None:
    level = multiturn_level(run)
    if level is None:
        return None
    last = max(t.turn for t in level.turns)
    return f"turns {last // 2 + 1}-{last}"


def _hit_ratio_figure(run: RunData) -> Figure | None:
    level = multiturn_level(run) or next((s for b in run.benches if b.mode != "single" for s in b.levels
                                          if "cache_hit_ratio" in s.figures), None)
    fig = level.figures.get("cache_hit_ratio") if level else None
    if fig is None or fig.value is None:
        return None
    return Figure(value=fig.value * 100, unit="%", definition="cache-hit-ratio", note=f"at {level.tag}")


# ---- an SLO search (docs/metrics.md#slo-search): its answer and the goodput there, trial by trial ----

def _search_answer(bench) -> Summary | None:
    """The level of a bench's SLO-search answer: the highest load seen to meet the targets."""
    search = (bench.search or {}) if bench is not None else {}
    if search.get("best") is None:
        return None
    by_rate = search.get("dimension") == "rate"
    return next((s for s in bench.levels if s.slo and s.slo.get("passed") and is_measured(s)
                 and (s.rate if by_rate else s.concurrency) == search["best"]), None)


def _trial_search(run: RunData, trial: int):
    found, step = run.trial(trial), step_of_mode(run, "slo-search")
    if step is None:
        return None
    if found is None:
        return step.result if len(run.counted) == 1 else None
    return found.step(step.name)


def _slo_figure(key: str) -> Callable[[RunData], Figure | None]:
    def figure(run: RunData) -> Figure | None:
        step = step_of_mode(run, "slo-search")
        return step.result.headline.get(key) if step is not None else run.headline.get(key)
    return figure


def _search_best(dimension: str) -> Callable[[RunData], Resampler | None]:
    """The highest load meeting the targets, one value per trial (its own search's answer): the trials are the
    units, so the interval is as wide as the trials disagree; one trial has none."""
    def resampler(run: RunData) -> Resampler | None:
        parts, ids = [], []
        for trial in run.counted:
            bench = _trial_search(run, trial)
            search = (bench.search or {}) if bench is not None else {}
            if search.get("dimension") == dimension and search.get("best") is not None:
                parts.append(MeanOf([float(search["best"])]))
                ids.append(run.round_of(trial))
        return Trials(parts, ids=ids) if parts else None
    return resampler


def _slos_of(level: Summary) -> list:
    from servelab.bench.slo import parse_slos

    targets = (level.slo or {}).get("targets", {})
    return parse_slos(",".join(f"{k}={t['limit_ms']:g}" for k, t in targets.items() if t.get("limit_ms")))


def _goodput(run: RunData) -> Resampler | None:
    """Goodput at the SLO search's answer: within each trial, the answer level's window cut into time bins of the
    requests that met every target and ended in it (docs/metrics.md#goodput); trials first, then bins."""
    from servelab.bench.slo import request_meets

    parts, ids = [], []
    for trial in run.counted:
        level = _search_answer(_trial_search(run, trial))
        fig = level.figures.get("goodput_req_s") if level is not None else None
        if level is None or fig is None or not fig.value or level.window_s <= 0:
            continue
        records = [r for r in _level_records(run, level.tag, trial) if not r.warmup]
        if not records:
            continue
        slos = _slos_of(level)
        start = min(r.scheduled_ns if r.scheduled_ns is not None else r.t_send_ns for r in records)
        counts, bin_s = time_bins([(r.t_end_ns, 1) for r in records if r.t_end_ns is not None
                                   and request_meets(r, slos)], start, level.window_s)
        observed = sum(counts) / level.window_s
        if not observed:
            continue
        parts.append(BinnedRate(counts, bin_s, scale=fig.value / observed))
        ids.append(run.round_of(trial))
    return Trials(parts, ids=ids) if parts else None


def _level_records(run: RunData, tag: str, trial: int) -> list[RequestRecord]:
    """Every measured request of one trial's level, failed ones too (goodput and client lag count them)."""
    return [r for r in run.records if r.tag == tag and r.trial == trial]


# ---- a replayed trace (docs/workloads.md, replay): its level, tagged `trace` ----

def replay_level(run: RunData) -> Summary | None:
    step = step_of_mode(run, "replay")
    return next((s for s in step.result.levels if s.tag == "trace"), None) if step is not None else None


def _replay_lag(run: RunData) -> Resampler | None:
    """Replay lag: the p99 over the trace's requests of how late each was sent against the trace's schedule
    (client lag); requests are resampled within trials."""
    def part(run: RunData, level: Summary, trial: int) -> Resampler | None:
        lags = [(r.t_send_ns - r.scheduled_ns) / m.NS_PER_MS for r in _level_records(run, level.tag, trial)
                if not r.warmup and r.scheduled_ns is not None and r.error_kind != "cancelled"]
        return PercentileOf(lags, 99) if lags else None
    return _over_trials(run, replay_level(run), part)


def _replay_figure(name: str) -> Callable[[RunData], Figure | None]:
    def figure(run: RunData) -> Figure | None:
        level = replay_level(run)
        return level.figures.get(name) if level is not None else None
    return figure


def _replay_ttft_figure(run: RunData) -> Figure | None:
    level = replay_level(run)
    fig = level.figures.get("ttft_ms") if level is not None else None
    if fig is None or fig.dist is None:
        return None
    return Figure(value=fig.dist.p50, unit="ms", definition="ttft", note="p50 over the trace's requests")


# ---- non-streamed requests (embeddings, rerank; docs/metrics.md#compare-non-streamed) ----

def unary_level(run: RunData) -> Summary | None:
    """The run's non-streamed level with the highest items/s (a measured one, else any that has the figure)."""
    levels = [s for s in run.levels if "items_s" in s.figures]
    measured = [s for s in levels if s.figures["items_s"].value is not None]
    levels = measured or levels
    return max(levels, key=lambda s: s.figures["items_s"].value or 0.0) if levels else None


def _unary_figure(name: str) -> Callable[[RunData], Figure | None]:
    def figure(run: RunData) -> Figure | None:
        level = unary_level(run)
        return level.figures.get(name) if level is not None else None
    return figure


def _latency_p99_figure(run: RunData) -> Figure | None:
    level = unary_level(run)
    fig = level.figures.get("e2e_ms") if level is not None else None
    if fig is None or fig.dist is None:
        return None
    return Figure(value=fig.dist.p99, unit="ms", definition="request-latency", note="p99")


def _items_throughput(run: RunData) -> Resampler | None:
    """Items/s at the run's non-streamed level: each trial's window cut into time bins of the items of the requests
    that ended in it (as items/s counts them), trials first, then bins."""
    def part(run: RunData, pooled: Summary, trial: int) -> Resampler | None:
        level = _trial_level(run, pooled.tag, trial) or (pooled if len(run.counted) == 1 else None)
        records = run.records_of(pooled.tag, trial)
        fig = level.figures.get("items_s") if level is not None else None
        if fig is None or not fig.value or not records or level.window_s <= 0:
            return None
        start = min(r.t_send_ns for r in records)
        counts, bin_s = time_bins([(r.t_end_ns, r.items or 0) for r in records if r.t_end_ns is not None], start,
                                  level.window_s)
        observed = sum(counts) / level.window_s
        return BinnedRate(counts, bin_s, scale=fig.value / observed) if observed else None
    return _over_trials(run, unary_level(run), part)


def _request_latency_p99(run: RunData) -> Resampler | None:
    def part(run: RunData, level: Summary, trial: int) -> Resampler | None:
        values = [v for r in run.records_of(level.tag, trial) if (v := _ms(m.e2e_ns(r))) is not None]
        return PercentileOf(values, 99) if values else None
    return _over_trials(run, unary_level(run), part)


# ---- what the GPUs did (docs/metrics.md#gpu): energy per token and tokens per joule, at peak and single-stream ----

def _gpu_figure(name: str, level_of: Callable[[RunData], Summary | None]) -> Callable[[RunData], Figure | None]:
    def figure(run: RunData) -> Figure | None:
        level = level_of(run)
        return level.figures.get(name) if level is not None else None
    return figure


def _gpu_why_none(name: str, level_of: Callable[[RunData], Summary | None]) -> Callable[[RunData], str | None]:
    """"not measured: why" for a run without the figure: the level's own note, or that it has no such level."""
    def why(run: RunData) -> str | None:
        if run.literal:
            return None
        level = level_of(run)
        if level is None:
            return "not measured: no such level"
        fig = level.figures.get(name)
        if fig is None or level.gpu is None:
            return "not measured: no GPU telemetry in this run"
        return fig.note if fig.value is None else None
    return why


def _bin_energies(run: RunData, level: Summary, start: int, n_bins: int, bin_s: float) -> list[float] | None:
    """The energy of the level's engine GPUs in each time bin, from the run directory's GPU series (the readings of
    the level's window, each bin's energy by the pair rule as the level's own); None without a series."""
    from servelab.bench.gpu_figures import summarize_gpu
    from servelab.host.gpu_telemetry.sampler import iter_readings
    from servelab.store.export_layout import series_of

    gpu = level.gpu
    files = series_of(run.run_dir)
    if gpu is None or not files:
        return None
    engine = {d.gpu for d in gpu.gpus if d.engine}
    margin = int(2 * (gpu.interval_s or 1.0) * 1e9)
    end = start + int(n_bins * bin_s * 1e9)
    readings = [r for path in files for r in iter_readings(path, start - margin, end + margin) if r.gpu in engine]
    if not readings:
        return None
    energies = []
    for k in range(n_bins):
        a = start + int(k * bin_s * 1e9)
        part = summarize_gpu(readings, window=(a, a + int(bin_s * 1e9)), output_tokens=None, answer_tokens=None,
                             source=gpu.source or "", interval_s=gpu.interval_s or 0.25)
        if not part.measured or part.energy_j is None:
            return None
        energies.append(part.energy_j)
    return energies


def _energy_per_token(inverse: bool, level_of: Callable[[RunData], Summary | None]
                      ) -> Callable[[RunData], Resampler | None]:
    """J/token (tokens per joule, `inverse`) of a level, trials first, then time bins within each trial's window
    (docs/metrics.md#gpu-compare): each bin holds the output tokens received in it and the energy the engine's
    GPUs drew in it (from the run's GPU series; without one, the trial's energy spread evenly over its window, so
    only the token count varies between bins), both scaled so the bins add up to the trial's own figure."""
    def part(run: RunData, pooled: Summary, trial: int) -> Resampler | None:
        level = _trial_level(run, pooled.tag, trial) or (pooled if len(run.counted) == 1 else None)
        records = run.records_of(pooled.tag, trial)
        gpu = level.gpu if level is not None else None
        if gpu is None or not gpu.measured or not gpu.energy_j or not gpu.output_tokens or not records \
                or level.window_s <= 0:
            return None
        start = min(r.t_send_ns for r in records)
        counts, bin_s = time_bins([(e.t_ns, e.tokens) for r in records for e in r.events], start, level.window_s)
        if not sum(counts):
            return None
        energies = _bin_energies(run, level, start, len(counts), bin_s) or [bin_s / level.window_s] * len(counts)
        e_scale, t_scale = gpu.energy_j / sum(energies), gpu.output_tokens / sum(counts)
        return EnergyPerToken([(j * e_scale, c * t_scale) for j, c in zip(energies, counts)], inverse=inverse)
    return lambda run: _over_trials(run, level_of(run), part)


def _gpu_metrics() -> list[KeyMetric]:
    out = []
    for scope, level_of, words in (("peak", peak_level, "at peak"), ("single", single_level, "single-stream")):
        for key, label, unit, higher, anchor, inverse in (
                ("j_per_output_token", f"energy per output token {words} J/token", "J/token", False,
                 "gpu-j-per-token", False),
                ("output_tokens_per_j", f"output tokens per joule {words}", "tok/J", True, "gpu-tokens-per-j",
                 True)):
            out.append(KeyMetric(f"{scope}.{key}", label, unit, higher, anchor, _energy_per_token(inverse, level_of),
                                 figure=_gpu_figure(key, level_of), why_none=_gpu_why_none(key, level_of)))
    return out


_LIST = [
    KeyMetric("single.decode_tok_s", "single-stream decode tok/s (p50)", "tok/s", True, "decode-tok-s",
              _per_request(m.decode_tok_s)),
    KeyMetric("single.ttft_ms", "single-stream TTFT ms (p50)", "ms", False, "ttft",
              _per_request(lambda r: _ms(m.ttft_ns(r)))),
    KeyMetric("single.itl_ms", "single-stream ITL ms (p50)", "ms", False, "itl", _itl),
    KeyMetric("peak.output_tok_s", "peak output tok/s", "tok/s", True, "peak-output-tok-s", _peak_throughput),
    # Latency under the heaviest load of the sweep: where a server that queues requests (one slot) shows it, even
    # on a machine too small for batching to raise throughput.
    KeyMetric("load.ttft_ms", "TTFT ms (p50) at the top concurrency", "ms", False, "load-ttft",
              _per_request(lambda r: _ms(m.ttft_ns(r)), top_level),
              figure=lambda run: (lambda lv: lv.figures.get("ttft_ms") if lv else None)(top_level(run)),
              where=lambda run: (lambda lv: lv.tag if lv else None)(top_level(run))),
    # An SLO search's answer (the highest load meeting every target) and the goodput at it: the figures an engine
    # is chosen by when its latency must stay within a limit.
    KeyMetric("slo.goodput_req_s", "goodput req/s at the SLO search's answer", "req/s", True, "goodput", _goodput,
              figure=_slo_figure("slo.goodput_req_s")),
    KeyMetric("slo.max_rate", "highest rate meeting the SLO req/s", "req/s", True, "slo-search",
              _search_best("rate"), figure=_slo_figure("slo.max_rate")),
    KeyMetric("slo.max_concurrency", "highest concurrency meeting the SLO", "streams", True, "slo-search",
              _search_best("concurrency"), figure=_slo_figure("slo.max_concurrency")),
    # A replayed trace: whether the schedule was kept (with a --max-concurrency cap the lag includes waiting for a
    # slot, so a server that falls behind the trace shows it), and what the server gave at the trace's load.
    KeyMetric("replay.lag_ms", "replay lag ms (client lag p99)", "ms", False, "client-lag", _replay_lag,
              figure=_replay_figure("client_lag_ms")),
    KeyMetric("replay.output_tok_s", "replay output tok/s", "tok/s", True, "output-tok-s",
              lambda run: _peak_throughput(run, level_of=replay_level), figure=_replay_figure("output_tok_s")),
    KeyMetric("replay.ttft_ms", "replay TTFT ms (p50)", "ms", False, "ttft",
              _per_request(lambda r: _ms(m.ttft_ns(r)), replay_level), figure=_replay_ttft_figure),
    # Reasoning apart (docs/metrics.md#reasoning), when some run thought: the answer-only figures mean the same
    # whether or not an engine thinks (or was launched without its reasoning parser); the share says how much
    # of each run's output was thinking.
    KeyMetric("single.ttfo_ms", "single-stream TTFO ms (p50)", "ms", False, "ttfo",
              _per_request(lambda r: _ms(m.ttfo_ns(r))), reasoning_only=True),
    KeyMetric("peak.answer_tok_s", "answer tok/s at peak", "tok/s", True, "answer-tok-s", _peak_answer_throughput,
              reasoning_only=True),
    KeyMetric("reasoning_share", "reasoning share of output tokens %", "%", False, "reasoning-share",
              figure=_share_figure, reasoning_only=True, neutral=True),
    # Multi-turn levels (issue 16): where a prefix cache decides TTFT, the late turns show it (their history is
    # long); the engine's cache hit ratio says why (no direction: it explains, it is not the goal).
    KeyMetric("multiturn.late_ttft_ms", "late-turn TTFT ms (p50)", "ms", False, "late-turn-ttft", _late_ttft,
              figure=_late_ttft_figure, where=_late_turns),
    KeyMetric("multiturn.cache_hit_ratio", "prefix cache hit ratio %", "%", True, "cache-hit-ratio",
              figure=_hit_ratio_figure, neutral=True),
]
_LIST += [
    # Non-streamed requests (embeddings, rerank): what their users choose an engine by, at the run's level with the
    # most items/s; these runs have none of the token figures above.
    KeyMetric("unary.items_s", "items/s (embeddings inputs, rerank documents)", "items/s", True, "items-s",
              _items_throughput, figure=_unary_figure("items_s"), where=lambda run: (lambda lv: lv.tag if lv else
                                                                                      None)(unary_level(run))),
    KeyMetric("unary.latency_ms", "request latency ms (p50)", "ms", False, "request-latency",
              _per_request(lambda r: _ms(m.e2e_ns(r)), unary_level), figure=_unary_figure("e2e_ms")),
    KeyMetric("unary.latency_p99_ms", "request latency ms (p99)", "ms", False, "request-latency",
              _request_latency_p99, figure=_latency_p99_figure),
]
# Tool calls and structured output (docs/metrics.md#tool-calls, #structured-output), at the single-stream level:
# how soon a call starts, and how many calls and answers a client could use.
_LIST += [
    KeyMetric("single.tool_first_ms", "single-stream time to first tool-call token ms (p50)", "ms", False,
              "tool-first", _per_request(lambda r: _ms(tool_first_ns(r)) if r.ok else None),
              figure=_single_level_figure("tool_first_ms"), why_none=lambda run: _no_answers(run, "tool_first_ms")),
    KeyMetric("single.tool_valid_share", "single-stream valid tool calls %", "%", True, "tool-valid-share",
              _per_request_share(lambda r: r.tool_calls_valid if r.ok and r.tool_calls else None),
              figure=_single_level_share("tool_valid_share"),
              why_none=lambda run: _no_answers(run, "tool_valid_share")),
    KeyMetric("single.schema_valid_share", "single-stream answers valid against the schema %", "%", True,
              "schema-valid-share", _per_request_share(lambda r: r.schema_valid if r.ok else None),
              figure=_single_level_share("schema_valid_share"),
              why_none=lambda run: _no_answers(run, "schema_valid_share")),
]
# Chat with images (docs/metrics.md#images), at the single-stream level: the prefill the images cost, apart from
# text-only requests.
_LIST += [
    KeyMetric("single.ttft_image_ms", "single-stream TTFT of requests with images ms (p50)", "ms", False,
              "ttft-by-images", _per_request(lambda r: _ms(m.ttft_ns(r)) if r.ok and r.images else None),
              figure=_single_level_figure("ttft_image_ms"),
              why_none=lambda run: None if _single_level_figure("ttft_image_ms")(run) is not None
              else "not measured: its requests carried no images"),
]
_LIST += _gpu_metrics()
KEY_METRICS: dict[str, KeyMetric] = {k.key: k for k in _LIST}
