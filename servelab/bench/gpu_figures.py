"""What the GPUs did during a level, from the GPU sampler's readings (docs/metrics.md#gpu).

`summarize_gpu` folds a level's readings into a GpuSummary in one pass, holding a few numbers per GPU and never
the series: a soak's hours of readings at 4 Hz on eight GPUs stay out of memory. Counters (energy, violation time)
become deltas over exactly the level's window by the pair rule (docs/metrics.md#gpu): between two consecutive
readings a counter grows linearly, so each pair contributes its growth times the share of its span inside the
window; the readings just before and just after the window are needed for that, so callers pass the readings
of `reading_span(window, interval_s)`, the window with a margin of two sampling intervals.

`pool_gpu` pools the trials of one level (docs/metrics.md#gpu-trials), and `gpu_level_figures` gives the level
figures of bench/figures.py `GPU_FIGURES` from a summary. Nothing here reads a clock or a device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from servelab.bench.figures import GPU_FIGURES
from servelab.records import Figure, GpuDeviceSummary, GpuReading, GpuSummary

NS_PER_S = 1_000_000_000

# A reading whose SM activity is under this is idle (docs/metrics.md#gpu-idle-share): an idle GPU reads 0 %
# (utilisation) or under 1 % (GPM); the margin is for monitoring kernels.
IDLE_SM_PCT = 5.0
# Throttling for power or heat for at least this share of the window is said with the level's figures.
THROTTLE_SHARE_LIMIT = 0.01
# A counter's delta is extrapolated over the part of the window its readings do not cover (docs/metrics.md#gpu)
# only while they cover at least this share of it.
MIN_COVERED_SHARE = 0.5

# NVML clocks-event reasons (nvidia-ml-py 13.615 pynvml.py, nvmlClocksEventReason*) that mean power or heat held
# the clocks down. GpuIdle (0x1) and ApplicationsClocksSetting (0x2) are not throttling; neither are SyncBoost
# (0x10) and DisplayClockSetting (0x100).
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
POWER_OR_THERMAL = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN


def reading_span(window: tuple[int, int], interval_s: float) -> tuple[int, int]:
    """The span of readings a level's figures need: its window with two sampling intervals either side, so the
    readings just beyond each edge are there even when a tick came late (for the sampler's `iter_readings`)."""
    margin = int(2 * interval_s * NS_PER_S)
    return window[0] - margin, window[1] + margin


def not_measured(reason: str) -> GpuSummary:
    """A level without GPU figures, and why, in one line."""
    return GpuSummary(measured=False, reason=reason)


# ---------------------------------------------------------------------------------------------------------------
# Counters over the window
# ---------------------------------------------------------------------------------------------------------------


class _PairSum:
    """A quantity over the window by the pair rule: the delta of a cumulative counter (`integral=False`), or the
    trapezoid integral of a rate (`integral=True`), with the time its pairs covered. A counter that goes backwards
    between two readings (a reset, a wrap) adds nothing for that pair; a `bridge_rate` at both of its readings
    gives the pair's amount another way (the energy from the two readings' power), else its time stays
    uncovered."""

    bridge_scale = 1.0  # a bridge rate times this is the counter's units per ns

    def __init__(self, window: tuple[int, int], *, integral: bool) -> None:
        self.ws, self.we = window
        self.integral = integral
        self.amount = 0.0
        self.covered_ns = 0
        self.backwards = 0
        self.bridged = 0
        self.pairs = 0
        self.seen = False  # a reading had a value
        self._t = 0  # the previous reading with a value: its time, value and bridge rate
        self._v = 0.0
        self._r: float | None = None

    def add(self, t: int, value: float | None, bridge_rate: float | None = None) -> None:
        if value is None:
            return
        t0, v0, r0 = self._t, self._v, self._r
        if self.seen and t <= t0:
            return  # out of order or repeated: the pair it would make has no span
        self._t, self._v, self._r = t, value, bridge_rate
        if not self.seen:
            self.seen = True
            return
        if t0 >= self.we or t <= self.ws:
            return
        a, b = max(t0, self.ws), min(t, self.we)
        if b <= a:
            return
        span = t - t0
        if self.integral:
            va = v0 + (value - v0) * (a - t0) / span
            vb = v0 + (value - v0) * (b - t0) / span
            self.amount += (va + vb) / 2 * (b - a)
        elif value >= v0:
            self.amount += (value - v0) * (b - a) / span
        else:
            self.backwards += 1
            if r0 is None or bridge_rate is None:
                return  # the pair across the reset stays uncovered: extrapolated at the covered part's mean
            ra = r0 + (bridge_rate - r0) * (a - t0) / span
            rb = r0 + (bridge_rate - r0) * (b - t0) / span
            self.amount += (ra + rb) / 2 * (b - a) * self.bridge_scale
            self.bridged += 1
        self.pairs += 1
        self.covered_ns += b - a

    def over_window(self) -> tuple[float | None, float]:
        """(the amount over the whole window, the seconds of it extrapolated); None when the pairs covered less than
        MIN_COVERED_SHARE of it."""
        window_ns = self.we - self.ws
        if window_ns <= 0 or self.covered_ns < MIN_COVERED_SHARE * window_ns:
            return None, 0.0
        uncovered = window_ns - self.covered_ns
        if uncovered <= 0:
            return self.amount, 0.0
        return self.amount * window_ns / self.covered_ns, uncovered / NS_PER_S


class _EnergyCounter(_PairSum):
    """The energy counter, whose value is stamped at the first reading that showed it: a source that serves a
    cached sample (a DCGM exporter refreshes its values every collect interval, 30 s by default) repeats one value
    over several readings, and pairing the repeats would put a whole step of energy into the one pair that sees
    the value change. `held_ns` is the longest time one value was shown (first to last reading with it): about the
    source's refresh period less one sampling interval; 0 for a source that is read fresh."""

    bridge_scale = 1000.0 / NS_PER_S  # W x ns -> mJ

    def __init__(self, window: tuple[int, int], *, integral: bool) -> None:
        super().__init__(window, integral=integral)
        self.held_ns = 0
        self.changes = 0  # readings whose value differed from the one before
        self.refresh_ns = 0  # the longest time between two changes: a refresh period seen whole

    def add(self, t: int, value: float | None, bridge_rate: float | None = None) -> None:
        if value is None:
            return
        if self.seen and value == self._v:
            if t > self._t:
                self.held_ns = max(self.held_ns, t - self._t)
            return  # the same sample again: its time stays the first reading's
        if self.seen and t > self._t:
            if self.changes:
                self.refresh_ns = max(self.refresh_ns, t - self._t)
            self.changes += 1
        super().add(t, value, bridge_rate)


class _Held:
    """The longest time one value of a gauge was shown unchanged (first to last reading with it)."""

    def __init__(self) -> None:
        self.held_ns = 0
        self._t: int | None = None
        self._v: float | None = None

    def add(self, t: int, value: float | None) -> None:
        if value is None:
            return
        if self._t is not None and value == self._v:
            self.held_ns = max(self.held_ns, t - self._t)
            return
        self._t, self._v = t, value


# ---------------------------------------------------------------------------------------------------------------
# One GPU
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Device:
    """What one GPU's readings fold into: a few numbers, whatever the number of readings."""

    gpu: int
    window: tuple[int, int]
    interval_s: float = 0.25
    source: str = ""
    uuid: str | None = None
    name: str | None = None
    energy: _EnergyCounter = field(init=False)
    power: _PairSum = field(init=False)
    violation: _PairSum = field(init=False)
    power_held: _Held = field(default_factory=lambda: _Held())
    samples: int = 0
    sm_sum: float = 0.0
    sm_n: int = 0
    idle_n: int = 0
    sm_sources: set[str] = field(default_factory=set)
    mem_sum: float = 0.0
    mem_n: int = 0
    mem_max: int | None = None
    power_max: float | None = None
    temp_max: float | None = None
    reasons_n: int = 0
    throttled_n: int = 0
    xid_count: _Increments = field(default_factory=lambda: _Increments())
    xid_changes: _Increments = field(default_factory=lambda: _Increments(changes=True))
    xid_code: int | None = None
    retired: _Increments = field(default_factory=lambda: _Increments())
    engine_seen: bool = False
    pids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.energy = _EnergyCounter(self.window, integral=False)
        self.power = _PairSum(self.window, integral=True)
        self.violation = _PairSum(self.window, integral=False)

    def add(self, r: GpuReading, engine_pids: frozenset[int]) -> bool:
        """Fold one reading; True when it lies inside the window."""
        self.uuid = r.uuid or self.uuid
        self.name = r.name or self.name
        self.energy.add(r.t_ns, r.energy_mj, r.power_w)
        self.power.add(r.t_ns, r.power_w)
        self.power_held.add(r.t_ns, r.power_w)
        self.violation.add(r.t_ns, None if r.throttle_ns is None else float(r.throttle_ns))
        ws, we = self.window
        inside = ws <= r.t_ns <= we
        self.xid_count.add(r.xid_errors, inside)
        self.xid_changes.add(r.xid_last, inside)
        self.retired.add(r.retired_pages, inside)
        if inside and r.xid_last:
            self.xid_code = r.xid_last
        if not inside:
            return False
        self.samples += 1
        if r.sm_active_pct is not None:
            self.sm_sum += r.sm_active_pct
            self.sm_n += 1
            self.idle_n += r.sm_active_pct < IDLE_SM_PCT
            if r.sm_source:
                self.sm_sources.add(r.sm_source)
        mem, power, temp = r.mem_used_bytes, r.power_w, r.temp_c
        if mem is not None:
            self.mem_sum += mem
            self.mem_n += 1
            if self.mem_max is None or mem > self.mem_max:
                self.mem_max = mem
        if power is not None and (self.power_max is None or power > self.power_max):
            self.power_max = power
        if temp is not None and (self.temp_max is None or temp > self.temp_max):
            self.temp_max = temp
        if r.throttle_reasons is not None:
            self.reasons_n += 1
            self.throttled_n += bool(r.throttle_reasons & POWER_OR_THERMAL)
        for pid in r.processes:
            if pid in engine_pids:
                self.engine_seen = True
            else:
                self.pids.add(pid)
        return True

    @property
    def xid_new(self) -> int | None:
        """New XID events in the window: the count's increments where the source counts them (NVML), else each
        change of the last XID code to a nonzero one (DCGM holds only the last code); None when neither is read."""
        if self.xid_count.seen:
            return self.xid_count.new
        return self.xid_changes.new if self.xid_changes.seen else None

    def summary(self, window_s: float, engine: bool, notes: _Notes) -> GpuDeviceSummary:
        energy_j, energy_from = self._energy(notes)
        if self.retired.new:
            notes.add(self.gpu, f"{self.retired.new} memory page{'s' if self.retired.new > 1 else ''} retired "
                                f"during the level (ECC errors)")
        throttle_s = self._throttle(window_s, notes)
        if self.sm_n == 0:
            notes.add(self.gpu, "SM activity not measured: the source gives none")
        elif self.sm_sources & {"utilization", "dcgm_util", "amdsmi"}:
            notes.add(self.gpu, "SM activity is the share of time a kernel ran (no profiling counters): it "
                                "overstates how busy the SMs were")
        return GpuDeviceSummary(
            gpu=self.gpu, uuid=self.uuid, name=self.name, engine=engine, samples=self.samples,
            sm_samples=self.sm_n, mem_samples=self.mem_n, energy_j=energy_j, energy_from=energy_from,
            power_w_mean=energy_j / window_s if energy_j is not None and window_s > 0 else None,
            power_w_max=self.power_max,
            sm_active_pct_mean=self.sm_sum / self.sm_n if self.sm_n else None,
            sm_source=",".join(sorted(self.sm_sources)) or None,
            mem_used_bytes_mean=self.mem_sum / self.mem_n if self.mem_n else None, mem_used_bytes_max=self.mem_max,
            idle_share=self.idle_n / self.sm_n if self.sm_n else None, throttle_s=throttle_s,
            temp_c_max=self.temp_max, xid_errors=self.xid_new,
            other_pids=sorted(self.pids))

    def stale(self) -> str | None:
        """Why the energy is not measured when the source served the same sample for longer than a tenth of the
        window (docs/metrics.md#gpu-stale): its energy and power then move in steps the window cannot resolve.
        None when it refreshed often enough, or when only the counter stood still while power readings moved
        (a counter that is not kept: the energy comes from the power readings)."""
        window_ns = self.window[1] - self.window[0]
        limit = max(window_ns / 10, 2 * self.interval_s * NS_PER_S)
        if self.energy.held_ns <= limit:
            return None
        if self.power.seen and self.power_held.held_ns <= limit:
            return None
        held_s = (self.energy.held_ns + self.interval_s * NS_PER_S) / NS_PER_S
        whole_s = self.energy.refresh_ns / NS_PER_S
        every = f"~{whole_s:.2g} s" if whole_s >= held_s else f"{held_s:.2g} s or more"
        window = f"{window_ns / NS_PER_S:.3g} s"
        if self.source.startswith("dcgm"):
            return (f"energy not measured: the DCGM exporter refreshes its values every {every}, more than a "
                    f"tenth of the {window} window (run it with -c 250)")
        return (f"energy not measured: the source refreshes its readings every {every}, more than a tenth of the "
                f"{window} window")

    def _energy(self, notes: _Notes) -> tuple[float | None, str | None]:
        stale = self.stale()
        if stale:
            notes.add(self.gpu, stale)
            return None, None
        window_ns = self.window[1] - self.window[0]
        limit = max(window_ns / 10, 2 * self.interval_s * NS_PER_S)
        # the counter stood still: for longer than the limit, or through every reading around the window
        frozen = self.energy.seen and (self.energy.held_ns > limit or (not self.energy.pairs and
                                                                       self.energy.held_ns > 0))
        if self.energy.pairs and not frozen:
            mj, extrapolated = self.energy.over_window()
            if self.energy.backwards:
                across = ("the span across it from the power readings (trapezoid)" if self.energy.bridged
                          == self.energy.backwards else "the span across it extrapolated at the others' mean power")
                notes.add(self.gpu, f"the energy counter went backwards {_times(self.energy.backwards)} (reset or "
                                    f"wrap): the energy is the sum of the monotonic pieces, {across}")
            if mj is None:
                notes.add(self.gpu, self._thin(self.energy))
                return None, None
            if mj > 0:
                if extrapolated:
                    notes.add(self.gpu, f"energy extrapolated over {extrapolated:.2f} s of the window with no "
                                        f"reading beyond it, at the covered part's mean power")
                return mj / 1000.0, "counter"
            frozen = True  # a powered GPU draws energy: a counter that did not advance is not read
        if self.power.pairs:
            w_ns, extrapolated = self.power.over_window()
            if w_ns is None:
                notes.add(self.gpu, self._thin(self.power))
                return None, None
            if w_ns <= 0:
                notes.add(self.gpu, "energy not measured: neither the energy counter nor the power readings "
                                    "advanced in the window")
                return None, None
            notes.add(self.gpu, "energy from power readings (trapezoid): " + (
                "the energy counter did not advance in the window while the GPU drew power" if frozen
                else "no energy counter"))
            if extrapolated:
                notes.add(self.gpu, f"energy extrapolated over {extrapolated:.2f} s of the window with no reading "
                                    f"beyond it, at the covered part's mean power")
            return w_ns / NS_PER_S, "power"
        if frozen:
            notes.add(self.gpu, "energy not measured: the energy counter did not advance in the window and the "
                                "source gives no power")
        elif self._no_counter_readings():
            notes.add(self.gpu, "energy not measured: the source gives neither an energy counter nor power")
        else:
            notes.add(self.gpu, "energy not measured: fewer than two readings around the window")
        return None, None

    def _thin(self, part: _PairSum) -> str:
        share = part.covered_ns / (part.we - part.ws)
        return (f"energy not measured: the readings cover {share:.0%} of the window (at least "
                f"{MIN_COVERED_SHARE:.0%} needed)")

    def _no_counter_readings(self) -> bool:
        return not self.energy.seen and not self.power.seen

    def _throttle(self, window_s: float, notes: _Notes) -> float | None:
        if self.violation.pairs:
            ns, _ = self.violation.over_window()
            if ns is None:
                notes.add(self.gpu, self._thin(self.violation).replace("energy", "throttle time", 1))
            if self.violation.backwards:
                notes.add(self.gpu, f"the violation-time counter went backwards {_times(self.violation.backwards)}"
                                    f" (reset or wrap): the throttle time is the sum of the monotonic pieces")
            if ns is None:
                return None
            if ns > self.violation.we - self.violation.ws:
                # power and thermal violation time are summed by the sources, and can count one moment twice
                notes.add(self.gpu, "the power and thermal violation times add up to more than the window (both "
                                    "held at once): throttle time capped at the window")
                return window_s
            return ns / NS_PER_S
        if self.reasons_n:
            notes.add(self.gpu, "throttle time from the clocks-event reasons (share of readings x window): no "
                                "violation counter")
            return self.throttled_n / self.reasons_n * window_s
        notes.add(self.gpu, "throttle time not measured: the source gives neither a violation counter nor "
                            "clocks-event reasons")
        return None


class _Increments:
    """New events in the window from a cumulative count (its increments, a drop being a reset), or from a value
    that holds the last event (`changes`: each change to a nonzero value), counted from the last reading before
    the window; the first reading, when none came before, is the baseline: what it holds happened earlier."""

    def __init__(self, *, changes: bool = False) -> None:
        self.changes = changes
        self.prev: int | None = None
        self.new = 0
        self.seen = False  # a reading inside the window had the field

    def add(self, value: int | None, inside: bool) -> None:
        if value is None:
            return
        prev, self.prev = self.prev, value
        if not inside:
            return
        self.seen = True
        if prev is None:
            return
        if self.changes:
            self.new += value != prev and value != 0
        elif value > prev:
            self.new += value - prev


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


class _Notes:
    """Notes said once for every GPU they hold for ("GPUs 0-7: energy from power readings …")."""

    def __init__(self) -> None:
        self._by_text: dict[str, list[int]] = {}

    def add(self, gpu: int, text: str) -> None:
        self._by_text.setdefault(text, []).append(gpu)

    def lines(self) -> list[str]:
        return [f"{gpu_list(gpus)}: {text}" for text, gpus in self._by_text.items()]


def gpu_list(gpus: Iterable[int]) -> str:
    """"GPU 3", "GPUs 0-7", "GPUs 0, 2, 5-7"."""
    ids = sorted(set(gpus))
    runs: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        runs.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ("GPU " if len(ids) == 1 else "GPUs ") + ", ".join(runs)


# ---------------------------------------------------------------------------------------------------------------
# A level
# ---------------------------------------------------------------------------------------------------------------


def summarize_gpu(readings: Iterable[GpuReading], *, window: tuple[int, int], output_tokens: int | None,
                  answer_tokens: int | None, source: str, interval_s: float,
                  engine_pids: set[int] | frozenset[int] = frozenset()) -> GpuSummary:
    """The level's GpuSummary from its readings (docs/metrics.md#gpu), read once, one at a time. `window` is the
    level's measurement window (perf_counter ns), `output_tokens` (`answer_tokens`) the tokens its output tok/s
    (answer tok/s) counts in it, None when it counts none (a level not measured, no reasoning counted apart);
    `engine_pids` the engine's process tree. Give the readings of `reading_span(window, interval_s)`: the
    counters need a reading beyond each edge. Readings come in time order (the sampler's, tick by tick)."""
    ws, we = window
    if we <= ws:
        return not_measured("the level has no measurement window")
    engine = frozenset(engine_pids)
    devices: dict[int, _Device] = {}
    peak = _SummedPeak()
    for r in readings:
        device = devices.get(r.gpu)
        if device is None:
            device = devices[r.gpu] = _Device(r.gpu, window, interval_s, source)
        was_engine = device.engine_seen
        inside = device.add(r, engine)
        peak.add(device, r.power_w, inside, joined=device.engine_seen and not was_engine)
    window_s = (we - ws) / NS_PER_S
    if not any(d.samples for d in devices.values()):
        return not_measured(f"no GPU reading inside the level's {window_s:.3g} s window "
                            f"(sampling every {interval_s:g} s)")

    notes = _Notes()
    lines: list[str] = []
    by_engine = bool(engine) and any(d.engine_seen for d in devices.values())
    if not engine:
        lines.append("the engine's processes are not known: every GPU counts, and other processes on them were "
                     "not checked")
    elif not by_engine:
        lines.append("no reading showed the engine's processes on a GPU: every GPU counts, and other processes on "
                     "them were not checked")
    gpus = [d.summary(window_s, d.engine_seen or not by_engine, notes)
            for d in sorted(devices.values(), key=lambda d: d.gpu)]
    mine = [g for g in gpus if g.engine]
    summary = _totals(GpuSummary(
        measured=True, source=source, interval_s=interval_s, window_s=window_s, gpus=gpus,
        output_tokens=output_tokens, answer_tokens=answer_tokens,
        power_w_max=peak.engine_max if by_engine else peak.all_max, notes=lines + notes.lines()))
    summary.reasons = _contention(mine, by_engine)
    summary.contended = bool(summary.reasons)
    summary.warnings = _warnings(mine, window_s, devices)
    elsewhere = _compute_elsewhere(gpus) if by_engine else None
    if elsewhere:
        summary.warnings.append(elsewhere)
        summary.notes.append(elsewhere)
    return summary


def _compute_elsewhere(gpus: Sequence[GpuDeviceSummary]) -> str | None:
    """The GPUs that ran compute processes outside the engine's tree while the engine ran on others
    (docs/metrics.md#gpu-engine): the engine's own ranks when an executor starts them outside its tree (vLLM's
    Ray workers, an MPI launcher), or another job. Either way its energy and J/token leave them out: said loudly."""
    mine = [g.gpu for g in gpus if g.engine]
    others = [g for g in gpus if not g.engine and g.other_pids]
    if not mine or not others:
        return None
    pids = sorted({p for g in others for p in g.other_pids})
    shown = ", ".join(str(p) for p in pids[:8]) + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")
    return (f"{gpu_list(g.gpu for g in others)} ran compute processes outside the engine's tree "
            f"(pid{'s' if len(pids) > 1 else ''} {shown}) while the engine ran on {gpu_list(mine)}: if they are its "
            f"ranks (a Ray executor, an MPI launcher), its energy and J/token leave them out")


class _SummedPeak:
    """The largest sum, over the readings inside the window, of every GPU's latest power reading: over all GPUs,
    and over those known so far to hold the engine's processes (their totals kept as readings come, in O(1))."""

    def __init__(self) -> None:
        self.held: dict[int, float] = {}
        self.all_total = 0.0
        self.engine_total = 0.0
        self.all_max: float | None = None
        self.engine_max: float | None = None

    def add(self, device: _Device, power: float | None, inside: bool, *, joined: bool) -> None:
        gpu = device.gpu
        old = self.held.get(gpu)
        if joined and old is not None:
            self.engine_total += old  # its power so far now counts with the engine's
        if power is None:
            return
        self.held[gpu] = power
        change = power - (old or 0.0)
        self.all_total += change
        if device.engine_seen:
            self.engine_total += change
        if not inside:
            return
        if self.all_max is None or self.all_total > self.all_max:
            self.all_max = self.all_total
        if device.engine_seen and (self.engine_max is None or self.engine_total > self.engine_max):
            self.engine_max = self.engine_total


def _totals(summary: GpuSummary) -> GpuSummary:
    """The summed figures and those per token, from the engine's GPUs' own and the token counts."""
    mine = [g for g in summary.gpus if g.engine]
    window_s = summary.window_s or 0.0
    energies = [g.energy_j for g in mine]
    energy = sum(e for e in energies if e is not None) if mine and None not in energies else None
    summary.energy_j = energy
    summary.power_w_mean = energy / window_s if energy is not None and window_s > 0 else None
    sms = [g.sm_active_pct_mean for g in mine if g.sm_active_pct_mean is not None]
    summary.sm_active_pct_mean = sum(sms) / len(sms) if sms else None
    sm_n = sum(g.sm_samples for g in mine if g.idle_share is not None)
    idle_n = sum(_idle_count(g) for g in mine if g.idle_share is not None)
    summary.idle_share = idle_n / sm_n if sm_n else None
    has_energy = energy is not None and energy > 0
    out, answer = summary.output_tokens, summary.answer_tokens
    summary.j_per_output_token = energy / out if has_energy and out else None  # type: ignore[operator]
    summary.output_tokens_per_j = out / energy if has_energy and out else None  # type: ignore[operator]
    summary.j_per_answer_token = energy / answer if has_energy and answer else None  # type: ignore[operator]
    return summary


def _idle_count(g: GpuDeviceSummary) -> int:
    return round((g.idle_share or 0.0) * g.sm_samples)


def _contention(mine: Sequence[GpuDeviceSummary], by_engine: bool) -> list[str]:
    """One sentence per process outside the engine that held the engine's GPUs (docs/metrics.md#gpu-contended)."""
    reasons: list[str] = []
    if by_engine:
        held: dict[tuple[int, ...], list[int]] = {}
        for g in mine:
            if g.other_pids:
                held.setdefault(tuple(g.other_pids), []).append(g.gpu)
        for pids, on in held.items():
            who = ("pid " if len(pids) == 1 else "pids ") + ", ".join(str(p) for p in pids)
            reasons.append(f"{who} held {gpu_list(on)} (the engine's) during the level")
    return reasons


def _warnings(mine: Sequence[GpuDeviceSummary], window_s: float, devices: dict[int, _Device]) -> list[str]:
    """What the level's figures are said with, loudly: the engine's GPUs throttled for power or heat, or reported
    XID errors (docs/metrics.md#gpu-contended). Neither contends the level: at full load a GPU sits at its power
    cap by design, and a driver or hardware fault does not go away on a rerun."""
    warnings: list[str] = []
    throttled = [g for g in mine if g.throttle_s is not None and g.throttle_s >= THROTTLE_SHARE_LIMIT * window_s]
    if throttled:
        each = (f"{throttled[0].throttle_s:.1f} s" if len(throttled) == 1 else
                ", ".join(f"{g.throttle_s:.1f} s (GPU {g.gpu})" for g in throttled))
        warnings.append(f"{gpu_list(g.gpu for g in throttled)} throttled for power or heat for {each} of "
                        f"{window_s:.1f} s: the clocks, not only the engine, set the pace")
    stale: dict[str, list[int]] = {}
    for g in mine:
        why = devices[g.gpu].stale()
        if why:
            stale.setdefault(why.removeprefix("energy not measured: "), []).append(g.gpu)
    for why, on in stale.items():
        warnings.append(f"{gpu_list(on)}: energy, J/token and power not measured: {why}")
    for g in mine:
        if g.xid_errors:
            code = devices[g.gpu].xid_code
            warnings.append(f"XID ERROR: GPU {g.gpu} reported {g.xid_errors} new XID "
                            f"error{'s' if g.xid_errors > 1 else ''} during the level"
                            + (f" (last code {code})" if code else "")
                            + ": a driver or hardware fault; the level's figures may not describe the engine")
    return warnings


# ---------------------------------------------------------------------------------------------------------------
# Trials
# ---------------------------------------------------------------------------------------------------------------


def pool_gpu(summaries: Sequence[GpuSummary]) -> GpuSummary:
    """One level's GPU figures over several trials (docs/metrics.md#gpu-trials): the measured trials' sums, the
    figures recomputed as if their windows were one. With one measured trial, that trial (and a note of the
    others)."""
    measured = [s for s in summaries if s.measured]
    if not measured:
        first = summaries[0].reason if summaries else None
        return not_measured(f"{first or 'no GPU telemetry'} (in every trial)" if len(summaries) > 1
                            else first or "no GPU telemetry source")
    left_out = (f"{len(summaries) - len(measured)} of {len(summaries)} trials had no GPU figures: pooled over the "
                f"other {len(measured)}")
    if len(measured) == 1:
        only = measured[0]
        return only if len(summaries) == 1 else only.model_copy(update={"notes": [*only.notes, left_out]})
    by_gpu: dict[int, list[tuple[GpuDeviceSummary, float]]] = {}
    for s in measured:
        for g in s.gpus:
            by_gpu.setdefault(g.gpu, []).append((g, s.window_s or 0.0))
    gpus = []
    for _, parts in sorted(by_gpu.items()):
        # a GPU is pooled over the trials in which it was the engine's (where it was, it counted in their sums)
        engine_parts = [(g, w) for g, w in parts if g.engine] or parts
        gpus.append(_pool_device([g for g, _ in engine_parts], sum(w for _, w in engine_parts)))
    sources = list(dict.fromkeys(s.source for s in measured if s.source))
    summary = GpuSummary(
        measured=True, source=" + ".join(sources) or None,
        interval_s=max((s.interval_s for s in measured if s.interval_s is not None), default=None),
        window_s=sum(s.window_s or 0.0 for s in measured), gpus=gpus,
        output_tokens=_sum_or_none(s.output_tokens for s in measured),
        answer_tokens=_sum_or_none(s.answer_tokens for s in measured),
        power_w_max=max((s.power_w_max for s in measured if s.power_w_max is not None), default=None),
        contended=any(s.contended for s in measured),
        reasons=list(dict.fromkeys(r for s in measured for r in s.reasons)),
        warnings=list(dict.fromkeys(w for s in measured for w in s.warnings)),
        notes=list(dict.fromkeys(n for s in measured for n in s.notes)))
    if len(measured) < len(summaries):
        summary.notes.append(left_out)
    return _pooled_totals(_totals(summary), measured)


def _pooled_totals(summary: GpuSummary, measured: Sequence[GpuSummary]) -> GpuSummary:
    """The pooled sums from the trials' own (docs/metrics.md#gpu-trials): energy is the sum of the trials'
    energies over the engine's GPUs of each (None if one has none), and each figure per token is over the trials
    that have both the energy and that token count: a trial whose level was not measured counts no tokens, and
    its energy is left out of the division with it (a note says which)."""
    energy = _sum_or_none(s.energy_j for s in measured)
    window_s = summary.window_s or 0.0
    summary.energy_j = energy
    summary.power_w_mean = energy / window_s if energy is not None and window_s > 0 else None
    summary.j_per_output_token = summary.output_tokens_per_j = summary.j_per_answer_token = None
    with_output = [s for s in measured if s.energy_j is not None and s.output_tokens is not None]
    with_answer = [s for s in measured if s.energy_j is not None and s.answer_tokens is not None]
    summary.output_tokens = sum(s.output_tokens for s in with_output) if with_output else None  # type: ignore[misc]
    summary.answer_tokens = sum(s.answer_tokens for s in with_answer) if with_answer else None  # type: ignore[misc]
    out_energy = sum(s.energy_j for s in with_output)  # type: ignore[misc]
    answer_energy = sum(s.energy_j for s in with_answer)  # type: ignore[misc]
    if with_output and out_energy > 0 and summary.output_tokens:
        summary.j_per_output_token = out_energy / summary.output_tokens
        summary.output_tokens_per_j = summary.output_tokens / out_energy
    if with_answer and answer_energy > 0 and summary.answer_tokens:
        summary.j_per_answer_token = answer_energy / summary.answer_tokens
    if with_output and len(with_output) < len(measured):
        summary.notes.append(f"energy per token over {len(with_output)} of the {len(measured)} trials: the others "
                             f"had no energy or no token count for the window (a level not measured counts none)")
    return summary


def _pool_device(parts: Sequence[GpuDeviceSummary], window_s: float) -> GpuDeviceSummary:
    first = parts[0]
    samples = sum(g.samples for g in parts)
    sm_n = sum(g.sm_samples for g in parts if g.sm_active_pct_mean is not None)
    mem_n = sum(g.mem_samples for g in parts if g.mem_used_bytes_mean is not None)
    energy = _sum_or_none(g.energy_j for g in parts)
    froms = {g.energy_from for g in parts}
    return GpuDeviceSummary(
        gpu=first.gpu, uuid=first.uuid, name=first.name, engine=any(g.engine for g in parts), samples=samples,
        sm_samples=sm_n, mem_samples=mem_n, energy_j=energy,
        energy_from=("power" if "power" in froms else "counter") if energy is not None else None,
        power_w_mean=energy / window_s if energy is not None and window_s > 0 else None,
        power_w_max=_max_or_none(g.power_w_max for g in parts),
        sm_active_pct_mean=sum(g.sm_active_pct_mean * g.sm_samples for g in parts  # type: ignore[operator]
                               if g.sm_active_pct_mean is not None) / sm_n if sm_n else None,
        sm_source=",".join(sorted({s for g in parts if g.sm_source for s in g.sm_source.split(",")})) or None,
        mem_used_bytes_mean=sum(g.mem_used_bytes_mean * g.mem_samples for g in parts  # type: ignore[operator]
                                if g.mem_used_bytes_mean is not None) / mem_n if mem_n else None,
        mem_used_bytes_max=_max_or_none(g.mem_used_bytes_max for g in parts),
        idle_share=sum(_idle_count(g) for g in parts if g.idle_share is not None) / sm_n if sm_n else None,
        throttle_s=_sum_or_none(g.throttle_s for g in parts),
        temp_c_max=_max_or_none(g.temp_c_max for g in parts),
        xid_errors=_sum_or_none(g.xid_errors for g in parts),
        other_pids=sorted({p for g in parts for p in g.other_pids}))


def _sum_or_none(values: Iterable[float | int | None]):
    vals = list(values)
    return None if not vals or any(v is None for v in vals) else sum(vals)  # type: ignore[arg-type]


def _max_or_none(values: Iterable[float | int | None]):
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


# ---------------------------------------------------------------------------------------------------------------
# Level figures
# ---------------------------------------------------------------------------------------------------------------


def _needs_energy(summary: GpuSummary) -> str | None:
    if summary.energy_j is None:
        for note in summary.notes:  # the engine GPUs' own reason, where one says it ("GPUs 0-7: energy not …")
            head, sep, why = note.partition(": energy not measured: ")
            if sep:
                return f"{why} ({head})"
        return "no energy for the engine's GPUs (gpu.notes says why)"
    if summary.energy_j <= 0:
        return "the energy of the engine's GPUs did not advance in the window"
    return None


def _per_token(count: Callable[[GpuSummary], int | None], what: str) -> Callable[[GpuSummary], str | None]:
    def why(summary: GpuSummary) -> str | None:
        missing = _needs_energy(summary)
        if missing:
            return missing
        n = count(summary)
        if n is None:
            return f"no {what} count for the window"
        return f"no {what}s in the window" if n == 0 else None
    return why


# Each GPU figure of bench/figures.py, by key: its value in a summary, and why it has none when it has none.
GPU_MEASURES: dict[str, tuple[Callable[[GpuSummary], float | None], Callable[[GpuSummary], str | None]]] = {
    "j_per_output_token": (lambda s: s.j_per_output_token, _per_token(lambda s: s.output_tokens, "output token")),
    "j_per_answer_token": (lambda s: s.j_per_answer_token, _per_token(lambda s: s.answer_tokens, "answer token")),
    "output_tokens_per_j": (lambda s: s.output_tokens_per_j, _per_token(lambda s: s.output_tokens,
                                                                        "output token")),
    "gpu_power_w_mean": (lambda s: s.power_w_mean, _needs_energy),
    "gpu_sm_active_pct_mean": (lambda s: s.sm_active_pct_mean, lambda s: "the source gives no SM activity"),
    "gpu_idle_share": (lambda s: s.idle_share, lambda s: "the source gives no SM activity"),
}


def gpu_level_figures(summary: GpuSummary, *, counted_by: str | None = None, unary: bool = False
                      ) -> dict[str, Figure]:
    """The level figures of `GPU_FIGURES` from a level's GpuSummary; a figure with no value has the note
    "not measured: why" (the summary's reason when it is not measured at all). `counted_by` is the level's (how
    its tokens were counted), carried by the figures per token. `unary`: a level of non-streamed requests
    (embeddings, rerank), which has no per-token figures at all (docs/metrics.md#non-streamed)."""
    out: dict[str, Figure] = {}
    for spec in GPU_FIGURES:
        if unary and spec.applies == "streamed":
            continue
        value_of, why = GPU_MEASURES[spec.key]
        value = value_of(summary) if summary.measured else None
        note = None
        if value is None:
            note = f"not measured: {summary.reason if not summary.measured else why(summary) or 'unknown'}"
        out[spec.key] = spec.make(value, note=note, counted_by=counted_by)
    return out
