"""The GPU sampler: reads one telemetry source on a daemon thread (4 Hz by default) and appends what it reads to
the run directory as a compact, column-oriented time series (docs/output.md#gpu-series).

The file is gzip-compressed JSON lines, each followed by a sync flush (as the records file is), so it is readable
up to its last whole line at any moment and after a crash:

    {"kind": "header", "format": 1, "source": "nvml", "interval_s": 0.25, "clock": "perf_counter_ns", ...}
    {"kind": "devices", "gpus": [{"gpu": 0, "uuid": "GPU-…", "name": "NVIDIA H200", "mem_total_bytes": …}, …]}
    {"kind": "chunk", "gpus": [0, 1, …], "ticks": 40, "t_min": …, "t_max": …, "overruns": 0,
     "t": [[t0, dt, dt, …], …], "read_ns": [...], "cols": {"power_w": [[…40 values…], {"c": 71.5}, …], …}}
    {"kind": "note", "t_ns": …, "text": "GPU 3 (GPU-…) is lost …"}
    {"kind": "end", "ticks": …, "overruns": …}

A chunk holds `chunk_ticks` ticks (10 s at 4 Hz) of every device: per field, one entry per device, either the
list of its values tick by tick or {"c": value} when it did not change; a field no device had is left out (read
back as None). Times are integer nanoseconds of time.perf_counter_ns(), the clock of every time inside a run, as
the first time and the gaps after it. Fixed facts (UUID, name, memory size) go in a "devices" line, written again
only when they change. Memory stays flat: at most one chunk is held.

A tick that overruns its interval (a slow source) is counted in "overruns" and the missed ticks are skipped,
never queued. `iter_readings` streams a time window back as GpuReading objects.
"""

from __future__ import annotations

import gzip
import json
import math
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servelab.records import GpuReading

SERIES_FILE = "gpu_series.jsonl.gz"
FORMAT = 1
_FIXED = ("uuid", "name", "mem_total_bytes")
_COLUMNS = tuple(f for f in GpuReading.model_fields if f not in ("t_ns", "gpu") + _FIXED)


class GpuSampler:
    """`start()` samples `source` every `interval_s` into `series_path`; `stop()` joins, flushes and closes (the
    sampler owns the source and closes it too). `tick()` is one sample, for callers that drive the clock."""

    def __init__(self, source: Any, series_path: Path | str, interval_s: float = 0.25,
                 chunk_ticks: int = 40) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.source = source
        self.source_name: str = source.name
        self.path = Path(series_path)
        self.interval_s = interval_s
        self.chunk_ticks = max(1, chunk_ticks)
        self.ticks = 0
        self.overruns = 0
        self.write_error: str | None = None
        self.read_error: str | None = None
        self.last_t_ns: int | None = None  # the time of the latest reading (what a level's end waits to pass)
        self.empty_reads = 0  # ticks the source gave nothing (a DCGM scrape that failed)
        self.source_error: str | None = None  # the source's last failure in one line (its `last_error`)
        self._chunk: list[tuple[list[GpuReading], int]] = []  # (readings, read duration ns) per tick
        self._chunk_overruns = 0
        self._devices: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._raw = None
        self._gz: gzip.GzipFile | None = None
        self._open()

    @property
    def buffered(self) -> int:
        """Readings held in memory now (at most one chunk's worth)."""
        return sum(len(readings) for readings, _ in self._chunk)

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._raw = open(self.path, "wb")
            self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6)
        except OSError as exc:
            self.write_error = f"{self.path}: {exc.strerror or exc}"
            self._gz = None
            return
        self._write({"kind": "header", "format": FORMAT, "source": self.source_name,
                     "interval_s": self.interval_s, "clock": "perf_counter_ns",
                     "started_ns": time.perf_counter_ns(), "chunk_ticks": self.chunk_ticks})

    def _write(self, doc: dict[str, Any]) -> None:
        if self._gz is None:
            return
        try:
            self._gz.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")
            self._gz.flush(zlib.Z_SYNC_FLUSH)  # readable up to here, whatever happens next
        except (OSError, ValueError) as exc:
            self.write_error = f"{self.path}: {getattr(exc, 'strerror', None) or exc}"
            self._gz = None

    def start(self) -> GpuSampler:
        if self._thread is None and not self._closed:
            thread = threading.Thread(target=self._run, name="servelab-gpu-sampler", daemon=True)
            thread.start()  # may raise (no thread to be had): then there is none to join, and stop() closes
            self._thread = thread
        return self

    def _run(self) -> None:
        interval_ns = int(self.interval_s * 1e9)
        next_ns = time.monotonic_ns()
        while not self._stop.is_set():
            self.tick()
            next_ns += interval_ns
            now = time.monotonic_ns()
            if now > next_ns:  # the read took longer than the interval: skip the ticks it covered
                missed = math.ceil((now - next_ns) / interval_ns)
                with self._lock:
                    self.overruns += missed
                    self._chunk_overruns += missed
                next_ns += missed * interval_ns
            self._stop.wait(max(0.0, (next_ns - now) / 1e9))

    def tick(self) -> list[GpuReading]:
        """Read the source once and keep the readings (written with their chunk)."""
        started = time.perf_counter_ns()
        try:
            readings = list(self.source.read())
        except Exception as exc:  # a source bug must not end the sampling; said once
            readings = []
            if self.read_error is None:
                self.read_error = f"{self.source_name}: {' '.join(str(exc).split())[:160] or type(exc).__name__}"
                self._note(self.read_error)
        read_ns = time.perf_counter_ns() - started
        with self._lock:
            if self._closed:
                return readings
            for text in _notes_of(self.source):
                self._note(text)
            self.ticks += 1
            if not readings:
                self.empty_reads += 1
                error = getattr(self.source, "last_error", None) or self.read_error
                if error:
                    self.source_error = str(error)
            if readings:
                self.last_t_ns = max(self.last_t_ns or readings[0].t_ns, *(r.t_ns for r in readings))
                gpus = [r.gpu for r in readings]
                if self._chunk and gpus != [r.gpu for r in self._chunk[0][0]]:
                    self._flush_chunk()  # the set of devices changed (a GPU lost): a chunk has one set
                devices = [{"gpu": r.gpu, **{f: getattr(r, f) for f in _FIXED}} for r in readings]
                if devices != self._devices:
                    self._flush_chunk()
                    self._devices = devices
                    self._write({"kind": "devices", "gpus": devices})
                self._chunk.append((readings, read_ns))
            if len(self._chunk) >= self.chunk_ticks:
                self._flush_chunk()
        return readings

    def failures(self) -> dict[str, Any]:
        """What went wrong while sampling, for the bench's provenance: only what did (an empty dict when all
        went well)."""
        with self._lock:
            found = {"write_error": self.write_error, "read_error": self.read_error,
                     "source_error": self.source_error,
                     "empty_reads": self.empty_reads or None, "overruns": self.overruns or None}
        return {k: v for k, v in found.items() if v is not None}

    def flush(self) -> None:
        """Write the readings held (the chunk in progress) now, so that a reader of the file sees them: a level's
        figures are read from the file as the level ends."""
        with self._lock:
            if not self._closed:
                self._flush_chunk()

    def _note(self, text: str) -> None:
        self._write({"kind": "note", "t_ns": time.perf_counter_ns(), "text": text})

    def _flush_chunk(self) -> None:
        if not self._chunk:
            return
        ticks = self._chunk
        self._chunk = []
        gpus = [r.gpu for r in ticks[0][0]]
        per_gpu = [[readings[k] for readings, _ in ticks] for k in range(len(gpus))]
        times = []
        for series in per_gpu:
            t = [r.t_ns for r in series]
            times.append([t[0]] + [b - a for a, b in zip(t, t[1:])])
        cols: dict[str, list[Any]] = {}
        for field in _COLUMNS:
            entries = []
            present = False
            for series in per_gpu:
                values = [_plain(getattr(r, field)) for r in series]
                first = values[0]
                if any(v is not None for v in values):
                    present = True
                entries.append({"c": first} if values.count(first) == len(values) else values)
            if present:
                cols[field] = entries
        all_t = [r.t_ns for series in per_gpu for r in series]
        self._write({"kind": "chunk", "gpus": gpus, "ticks": len(ticks), "t_min": min(all_t), "t_max": max(all_t),
                     "overruns": self._chunk_overruns, "t": times, "read_ns": [ns for _, ns in ticks],
                     "cols": cols})
        self._chunk_overruns = 0

    def stop(self) -> None:
        """Join the thread, write what is held, close the file and the source. Idempotent; safe on Ctrl-C."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, 4 * self.interval_s))
        with self._lock:
            if self._closed:
                return
            self._flush_chunk()
            for text in _notes_of(self.source):
                self._note(text)
            self._write({"kind": "end", "ticks": self.ticks, "overruns": self.overruns,
                         "stopped_ns": time.perf_counter_ns()})
            self._closed = True
            gz, raw = self._gz, self._raw
            self._gz = None
            for closable in (gz, raw):
                try:
                    if closable is not None:
                        closable.close()
                except OSError as exc:
                    self.write_error = self.write_error or f"{self.path}: {exc.strerror or exc}"
        try:
            self.source.close()
        except Exception:
            pass

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _notes_of(source: Any) -> list[str]:
    take = getattr(source, "take_notes", None)
    try:
        return list(take()) if take is not None else []
    except Exception:
        return []


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def iter_lines(path: Path | str) -> Iterator[dict[str, Any]]:
    """The series file's lines as dicts; a torn end (a crash, a writer still at work) ends the stream."""
    with gzip.open(path, "rb") as fh:
        while True:
            try:
                line = fh.readline()
            except (EOFError, zlib.error, gzip.BadGzipFile):
                return
            if not line:
                return
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except ValueError:
                return  # a half-written line: what came before stands


def read_header(path: Path | str) -> dict[str, Any] | None:
    for doc in iter_lines(path):
        return doc if doc.get("kind") == "header" else None
    return None


def iter_notes(path: Path | str) -> Iterator[tuple[int, str]]:
    for doc in iter_lines(path):
        if doc.get("kind") == "note":
            yield int(doc["t_ns"]), str(doc["text"])


def iter_readings(path: Path | str, t0_ns: int | None = None, t1_ns: int | None = None) -> Iterator[GpuReading]:
    """The readings with t0_ns <= t_ns <= t1_ns (either bound may be None), tick by tick, devices in order.
    Chunks outside the window are skipped without being decoded."""
    fixed: dict[int, dict[str, Any]] = {}
    for doc in iter_lines(path):
        kind = doc.get("kind")
        if kind == "devices":
            fixed = {d["gpu"]: {f: d.get(f) for f in _FIXED} for d in doc["gpus"]}
            continue
        if kind != "chunk":
            continue
        if (t1_ns is not None and doc["t_min"] > t1_ns) or (t0_ns is not None and doc["t_max"] < t0_ns):
            continue
        yield from _decode_chunk(doc, fixed, t0_ns, t1_ns)


def _decode_chunk(doc: dict[str, Any], fixed: dict[int, dict[str, Any]], t0_ns: int | None,
                  t1_ns: int | None) -> Iterator[GpuReading]:
    gpus = doc["gpus"]
    n = doc["ticks"]
    times = []
    for deltas in doc["t"]:
        t, out = 0, []
        for d in deltas:
            t += d
            out.append(t)
        times.append(out)
    cols = doc["cols"]
    columns: dict[str, list[list[Any]]] = {}
    for field, entries in cols.items():
        columns[field] = [[entry["c"]] * n if isinstance(entry, dict) else entry for entry in entries]
    for tick in range(n):
        for k, gpu in enumerate(gpus):
            t = times[k][tick]
            if (t0_ns is not None and t < t0_ns) or (t1_ns is not None and t > t1_ns):
                continue
            values: dict[str, Any] = {field: columns[field][k][tick] for field in columns}
            if "processes" in values:
                values["processes"] = tuple(values["processes"] or ())
            yield GpuReading(t_ns=t, gpu=gpu, **fixed.get(gpu, {}), **values)
