"""GPU telemetry from a DCGM exporter's /metrics (Prometheus text exposition), parsed with prometheus_client.

Field names and units as dcgm-exporter publishes them (its etc/default-counters.csv, plus the profiling and
violation fields a counters file may add):

    DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK          MHz
    DCGM_FI_DEV_GPU_TEMP                                 C
    DCGM_FI_DEV_POWER_USAGE                              W
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION                 mJ since the driver loaded (a counter)
    DCGM_FI_DEV_GPU_UTIL                                 %
    DCGM_FI_PROF_SM_ACTIVE                               ratio 0-1 (profiling; preferred over GPU_UTIL)
    DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE             MiB
    DCGM_FI_DEV_XID_ERRORS                               the last XID code (0: none)
    DCGM_FI_DEV_POWER_VIOLATION, _THERMAL_VIOLATION      us (cumulative)
    DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / _CLOCKS_EVENT_REASONS   NVML's bitmask
    DCGM_FI_PROF_PCIE_TX_BYTES, _RX_BYTES, DCGM_FI_PROF_NVLINK_TX_BYTES, _RX_BYTES   bytes/s
    DCGM_FI_DEV_RETIRED_SBE, DCGM_FI_DEV_RETIRED_DBE     pages

Each sample is labelled gpu (index), UUID, modelName, device, Hostname. One GET per tick, over http.client (no
proxy from the environment, no redirect followed: the default loopback probe never leaves the machine), bounded
by one deadline for the whole exchange (a server trickling bytes cannot stretch it) and a bounded body; a failure
is one line (`last_error`) and an empty read, never an exception.

DCGM marks a value it does not have with a blank sentinel (dcgm_structs.h): DCGM_INT32_BLANK 0x7ffffff0 (and the
NOT_FOUND/NOT_SUPPORTED/NOT_PERMISSIONED values just above it, up to 0x7fffffff), DCGM_INT64_BLANK
0x7ffffffffffffff0 and up, DCGM_FP64_BLANK 140737488355328.0 (2^47) and up. dcgm-exporter prints them as
numbers; they are read as absent (None), as are NaN and infinities, field by field (`_value`).

prometheus_client's parser spends ~70 us on each sample's labels (14 ms a scrape of 8 GPUs x 25 fields: 5 % of
a core at 4 Hz); the label sets repeat for every field and every scrape, so each distinct set is parsed by it
once and the lines, all `NAME{LABELS} VALUE` from an exporter, are split at their braces (`_values_by_gpu`).
"""

from __future__ import annotations

import functools
import http.client
import math
import socket
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from servelab.records import GpuReading

MAX_BODY_BYTES = 4 * 2**20  # an exporter with every field on 8 GPUs answers ~100 KB
_MIB = 2**20
_INT32_BLANK = 0x7FFFFFF0  # DCGM_INT32_BLANK; up to 0x7fffffff the other 32-bit sentinels
_INT32_MAX = 0x7FFFFFFF
_FP64_BLANK = 140737488355328.0  # DCGM_FP64_BLANK (2^47); DCGM_INT64_BLANK (~9.2e18) is above it too

# field -> (GpuReading field, scale to its unit)
_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", _MIB),
    "DCGM_FI_DEV_XID_ERRORS": ("xid_last", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_s", 1.0),
}
_INT_FIELDS = {"mem_used_bytes", "xid_last", "throttle_reasons", "retired_pages"}


class DcgmSource:
    """One DCGM exporter endpoint: `read()` scrapes it once and gives one GpuReading per GPU it lists."""

    def __init__(self, url: str, timeout_s: float = 1.0, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.url = url
        self.name = f"dcgm {url}"
        self.timeout_s = timeout_s
        self._clock = clock
        self.last_error: str | None = None
        self._notes: list[str] = []
        self._xid_seen: dict[int, int] = {}

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes

    def scrape(self) -> str | None:
        """The body of one GET, or None with `last_error` saying why in one line. The whole exchange (connect,
        headers, body) ends by one deadline, `timeout_s` from now: the socket is shut at it."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.last_error = f"{self.url} is not an http:// URL"
            return None
        connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        try:
            connection = connection_class(parts.hostname, parts.port, timeout=self.timeout_s)
        except (ValueError, OSError) as exc:
            self.last_error = f"{self.url} did not answer ({' '.join(str(exc).split())[:120]})"
            return None
        expired = threading.Event()
        opened: list[socket.socket] = []  # the connection hands its socket to the response: kept here to shut it

        def shut() -> None:
            expired.set()
            for sock in opened:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(self.timeout_s, shut)
        timer.daemon = True
        timer.start()
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.connect()
            opened.append(connection.sock)
            if expired.is_set():
                shut()
            connection.request("GET", path, headers={"Accept": "text/plain"})
            response = connection.getresponse()
            if response.status != 200:
                redirect = " (a redirect, not followed: give the exporter's own URL)" if 300 <= response.status < 400 \
                    else ""
                self.last_error = f"{self.url} answered HTTP {response.status}{redirect}"
                return None
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_BODY_BYTES:
                chunk = response.read1(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if expired.is_set():
                raise TimeoutError
        except (http.client.HTTPException, OSError, ValueError) as exc:
            if expired.is_set():
                self.last_error = f"{self.url} did not answer within {self.timeout_s:g} s"
            else:
                why = " ".join(str(exc).split())[:120] or type(exc).__name__
                self.last_error = f"{self.url} did not answer ({why})"
            return None
        finally:
            timer.cancel()
            connection.close()
        if size > MAX_BODY_BYTES:
            self.last_error = f"{self.url} answered more than {MAX_BODY_BYTES // 2**20} MiB: not a DCGM exporter?"
            return None
        self.last_error = None
        return b"".join(chunks).decode("utf-8", errors="replace")

    def read(self) -> list[GpuReading]:
        t_ns = self._clock()
        body = self.scrape()
        if body is None:
            return []
        try:
            readings = parse(body, t_ns)
        except ValueError as exc:
            self.last_error = f"{self.url}: not Prometheus text ({' '.join(str(exc).split())[:120]})"
            return []
        if not readings:
            self.last_error = f"{self.url} lists no DCGM_FI_* GPU field"
        for reading in readings:
            last = reading.xid_last or 0
            seen = self._xid_seen.get(reading.gpu)
            device = f"GPU {reading.gpu}{f' ({reading.uuid})' if reading.uuid else ''}"
            if last and seen is None:  # DCGM keeps only the last XID: the first scrape may show an old one
                self._notes.append(f"{device} reports XID {last} as its last error (it may predate this run)")
            elif last and seen != last:
                self._notes.append(f"XID {last} on {device}: the driver reported a GPU error")
            self._xid_seen[reading.gpu] = last
        return readings

    def close(self) -> None:
        pass


def parse(body: str, t_ns: int) -> list[GpuReading]:
    """The GPUs of one /metrics body, by `gpu` label, in index order. Raises ValueError on text that is not
    the exposition format."""
    per_gpu = _values_by_gpu(body)
    readings = []
    for gpu in sorted(per_gpu):
        values = per_gpu[gpu]
        fields: dict[str, Any] = {"t_ns": t_ns, "gpu": gpu, "uuid": values.get("uuid"), "name": values.get("name")}
        for dcgm_field, (ours, scale) in _FIELDS.items():
            if dcgm_field in values:
                fields[ours] = values[dcgm_field] * scale
        if "DCGM_FI_PROF_SM_ACTIVE" in values:
            fields["sm_active_pct"], fields["sm_source"] = values["DCGM_FI_PROF_SM_ACTIVE"] * 100.0, "dcgm_prof"
        elif "DCGM_FI_DEV_GPU_UTIL" in values:
            fields["sm_active_pct"], fields["sm_source"] = values["DCGM_FI_DEV_GPU_UTIL"], "dcgm_util"
        if "DCGM_FI_DEV_FB_USED" in values and "DCGM_FI_DEV_FB_FREE" in values:
            # FB_USED + FB_FREE leaves out the driver's reserve: close to, not exactly, the card's memory
            fields["mem_total_bytes"] = int((values["DCGM_FI_DEV_FB_USED"] + values["DCGM_FI_DEV_FB_FREE"]) * _MIB)
        violations = [values[f] for f in ("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION")
                      if f in values]
        if violations:
            fields["throttle_ns"] = int(sum(violations) * 1000)  # us -> ns
        for reasons in ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"):
            if reasons in values:
                fields["throttle_reasons"] = values[reasons]
                break
        retired = [values[f] for f in ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE") if f in values]
        if retired:
            fields["retired_pages"] = sum(retired)
        for key in _INT_FIELDS:
            if fields.get(key) is not None:
                fields[key] = int(fields[key])
        readings.append(GpuReading(**fields))
    return readings


def _values_by_gpu(body: str) -> dict[int, dict[str, Any]]:
    """{gpu: {field: value, "uuid": .., "name": ..}}. prometheus_client's parser reads every label set; as one
    set repeats for every field of a GPU and every scrape, each distinct one is parsed once (`_labels`), and
    the exporter's lines, all `NAME{LABELS} VALUE`, are split at their braces. A line of any other shape
    sends the whole body through prometheus_client's full parser (`_values_by_gpu_slow`)."""
    per_gpu: dict[int, dict[str, Any]] = {}
    for line in body.splitlines():
        if not line.startswith("DCGM_FI_"):
            if line and not line.startswith("#") and not line.isspace():
                return _values_by_gpu_slow(body)
            continue
        brace = line.find("{")
        close = line.rfind("}")
        if brace < 0 or close < brace:
            return _values_by_gpu_slow(body)
        parts = line[close + 1:].split()
        if not parts:
            raise ValueError(f"no value: {line[:80]}")
        labels = _labels(line[brace:close + 1])
        _keep(per_gpu, line[:brace], labels, _value(float(parts[0])))
    return per_gpu


def _values_by_gpu_slow(body: str) -> dict[int, dict[str, Any]]:
    from prometheus_client.parser import text_string_to_metric_families

    per_gpu: dict[int, dict[str, Any]] = {}
    for family in text_string_to_metric_families(body):
        if family.name.startswith("DCGM_FI_"):  # a counter's family name drops the "_total" its samples get
            for sample in family.samples:
                _keep(per_gpu, family.name, sample.labels, _value(float(sample.value)))
    return per_gpu


def _value(value: float) -> float | None:
    """The value, or None for a DCGM blank sentinel (module docstring), NaN or an infinity."""
    if not math.isfinite(value) or value >= _FP64_BLANK or _INT32_BLANK <= value <= _INT32_MAX:
        return None
    return value


def _keep(per_gpu: dict[int, dict[str, Any]], field: str, labels: dict[str, str], value: float | None) -> None:
    try:
        gpu = int(labels.get("gpu", ""))
    except ValueError:
        return
    values = per_gpu.setdefault(gpu, {})
    if "uuid" not in values and labels.get("UUID"):
        values["uuid"] = labels["UUID"]
    if "name" not in values and labels.get("modelName"):
        values["name"] = labels["modelName"]
    if value is not None:  # a blank is a field the exporter has no value for: left out, as one it does not list
        values[field] = value


@functools.lru_cache(maxsize=1024)
def _labels(block: str) -> dict[str, str]:
    """One `{a="b",...}` label set, parsed by prometheus_client (cached: the same sets come every scrape)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(f"x{block} 0\n"):
        for sample in family.samples:
            return dict(sample.labels)
    raise ValueError(f"no labels in {block[:80]}")
