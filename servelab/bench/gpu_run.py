"""What the GPUs did during a bench: its one telemetry source and sampler, and each level's GPU figures
(docs/metrics.md#gpu).

`GpuRun.open` opens the source once per bench (host/gpu_telemetry `open_source`: NVML, then the DCGM exporters
named by --gpu-metrics and the default local one, then amdsmi). NVML is tried only when the engine runs on this
host: servelab launched it (its pids are known), or the URL is this machine's. The sampler writes the series into
the run directory (or a temporary directory when there is none, removed when the bench ends) and is stopped on
every way out of the bench, Ctrl-C included (`stop` as the levels end, `close` once the result is made; both
idempotent).

`level` makes a level's GpuSummary from the series over the level's window, with the tokens output tok/s counts
in it: without a source every level says why in one line ("not measured: no GPU telemetry source (…)").
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.bench.gpu_figures import gpu_level_figures, not_measured, reading_span, summarize_gpu
from servelab.records import GpuSummary, Summary

if TYPE_CHECKING:
    from servelab.host.gpu_telemetry.sampler import GpuSampler

GPU_INTERVAL_S = 0.25  # 4 Hz: a 10 s level holds 40 readings per GPU
TURNED_OFF = "turned off (--no-gpu)"


@dataclass
class GpuRun:
    """One bench's GPU telemetry: a running sampler, or why there is none."""

    sampler: GpuSampler | None = None
    why_none: str = "no GPU telemetry source"
    engine_pids: frozenset[int] = frozenset()
    series: Path | None = None
    _temp_dir: Path | None = None
    _stopped: bool = False
    _closed: bool = False

    @classmethod
    def open(cls, *, enabled: bool, urls: list[str], local: bool, series: Path | None,
             engine_pids: list[int] | tuple[int, ...] = (), interval_s: float = GPU_INTERVAL_S) -> GpuRun:
        """The bench's source and a started sampler, or a GpuRun that says why there is none (never raises: the
        GPUs are evidence beside the figures, never a reason to lose them)."""
        if not enabled:
            return cls(why_none=TURNED_OFF)
        from servelab.host.gpu_telemetry import open_source
        from servelab.host.gpu_telemetry.sampler import SERIES_FILE, GpuSampler

        try:
            source, why = open_source(urls=tuple(urls), local=local)
        except Exception as exc:  # a source's bug: said, never a lost bench
            return cls(why_none=f"no GPU telemetry source (opening one failed: {' '.join(str(exc).split())[:120]})")
        if source is None:
            return cls(why_none=_words(why) or "no GPU telemetry source")
        temp_dir = None
        if series is None:
            temp_dir = Path(tempfile.mkdtemp(prefix="servelab-gpu-"))
            series = temp_dir / SERIES_FILE
        sampler = None
        try:
            sampler = GpuSampler(source, series, interval_s=interval_s)
            sampler.start()
        except Exception as exc:
            try:
                if sampler is not None:
                    sampler.stop()  # its series file is open: closed, with the source
                else:
                    source.close()
            except Exception:
                pass
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
            return cls(why_none=f"the GPU sampler could not start ({' '.join(str(exc).split())[:120]})")
        return cls(sampler=sampler, engine_pids=frozenset(engine_pids), series=series, _temp_dir=temp_dir)

    @property
    def source_name(self) -> str | None:
        return self.sampler.source_name if self.sampler is not None else None

    def add_engine_pids(self, pids: list[int] | set[int]) -> None:
        self.engine_pids = self.engine_pids | frozenset(pids)

    def engine_tree(self) -> frozenset[int]:
        """The engine's processes now: its roots and their descendants (the ranks and workers that hold the GPUs
        are children of the process servelab launched or found listening)."""
        import psutil

        tree = set(self.engine_pids)
        for pid in self.engine_pids:
            try:
                tree.update(child.pid for child in psutil.Process(pid).children(recursive=True))
            except (psutil.Error, OSError):
                continue
        return frozenset(tree)

    def mark_end(self, window_end_ns: int | None = None) -> None:
        """Wait for a reading taken after the level's window ended (`window_end_ns`, perf_counter ns; now when not
        given) and write what the sampler holds, so the series has the reading just after the window that its
        counters need (docs/metrics.md#gpu). A tick in progress when the window ended was stamped before its end:
        it does not do. The sampler's own thread reads: a source is never read from two threads at once. Waits
        until such a reading, or two more ticks (a source that gives nothing), or 3 intervals + 1 s. Blocking:
        call it off the event loop."""
        sampler = self.sampler
        if sampler is None or self._stopped:
            return
        end = time.perf_counter_ns() if window_end_ns is None else window_end_ns
        ticks = sampler.ticks
        deadline = time.monotonic() + 3 * sampler.interval_s + 1.0

        def taken_after() -> bool:
            last = sampler.last_t_ns
            return last is not None and last > end

        while not taken_after() and sampler.ticks < ticks + 2 and time.monotonic() < deadline \
                and not self._stopped:
            time.sleep(min(0.02, sampler.interval_s / 4))
        sampler.flush()  # it keeps one chunk in memory; its readings must reach the file before they are read

    def level(self, summary: Summary, window: tuple[int, int], output_tokens: int | None,
              answer_tokens: int | None) -> GpuSummary:
        """The level's GPU summary over `window` (docs/metrics.md#gpu), from the series written so far. Once the
        sampler stopped (a level interrupted by Ctrl-C is summarised after it), the window ends at its last
        reading: past it there is nothing to measure, and the tokens of the level came before."""
        if self.sampler is None or self.series is None:
            return not_measured(self.why_none)
        last = self.sampler.last_t_ns
        if self._stopped and last is not None and window[0] < last < window[1]:
            window = (window[0], last)
        from servelab.host.gpu_telemetry.sampler import iter_readings

        write_error = self.sampler.write_error
        if write_error:
            return not_measured(f"the GPU series could not be written ({_one_line(write_error)})")
        interval = self.sampler.interval_s
        try:
            readings = iter_readings(self.series, *reading_span(window, interval))  # the readings either side too
            found = summarize_gpu(readings, window=window, output_tokens=output_tokens,
                                  answer_tokens=answer_tokens, source=self.source_name or "?",
                                  interval_s=interval, engine_pids=self.engine_tree())
        except Exception as exc:  # a torn series file, a bug: the level keeps its other figures
            return not_measured(f"the GPU series could not be read ({_one_line(exc)})")
        source_error = self.sampler.source_error
        if not found.measured and source_error:
            found.reason = f"{found.reason}; the source's last failure: {_one_line(source_error)}"
        return found

    def stop(self) -> None:
        """Stop the sampler (which closes the source); the series stays readable. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception:
                pass

    def close(self) -> None:
        """Stop, and remove a temporary series (once the levels were summarised). Idempotent."""
        self.stop()
        if self._closed:
            return
        self._closed = True
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self.series = None

    def provenance(self) -> dict[str, object]:
        """What the bench's GPU figures came from, for its workload description."""
        if self.sampler is None:
            return {"source": None, "why_none": self.why_none}
        return {"source": self.source_name, "interval_s": self.sampler.interval_s,
                "series": self.series.name if self.series is not None and self._temp_dir is None else None,
                **self.sampler.failures()}


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:160]


def _words(why: str) -> str:
    return why.removeprefix("not measured: ")


def attach_gpu(summary: Summary, gpu: GpuSummary, findings=()) -> None:
    """Put the level's GPU summary and figures on it, with its warnings: another process on the engine's GPUs
    (contended, as a busy machine is), throttling and XID errors said loudly, and hints from the telemetry
    (bench/gpu_lint.py) tied to the engine's own lint `findings`."""
    from servelab.bench.gpu_lint import gpu_hints

    summary.gpu = gpu
    output = summary.figures.get("output_tok_s")
    summary.figures.update(gpu_level_figures(gpu, counted_by=output.counted_by if output else None,
                                             unary="items_s" in summary.figures))
    if gpu.contended:
        summary.warnings.append("GPU contended: " + "; ".join(gpu.reasons) + ": its figures may not show what the "
                                                                              "engine can do")
    summary.warnings.extend(gpu.warnings)
    closed_loop = summary.mode in ("single", "concurrency")
    try:
        hints = gpu_hints(gpu, summary.concurrency if closed_loop else None, findings)
    except Exception:
        hints = []
    summary.warnings.extend(f"hint: {h}" for h in hints)
