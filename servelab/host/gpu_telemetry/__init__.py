"""GPU telemetry: one sampler (`sampler.GpuSampler`) over the first source that answers, recorded by name.

Sources, each one class with `name`, `read() -> list[GpuReading]`, `take_notes() -> list[str]` and `close()`:
NVML through nvidia-ml-py when the engine runs on this host (`nvml`), a DCGM exporter's /metrics (`dcgm`), AMD's
amdsmi (`amd`). `open_source` tries them in that order and, when none answers, says why in one line.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Callable, Protocol
from urllib.parse import urlsplit

from servelab.records import GpuReading

DEFAULT_DCGM_URL = "http://127.0.0.1:9400/metrics"  # dcgm-exporter's default listen address
_CONNECT_TIMEOUT_S = 0.2


class GpuSource(Protocol):
    name: str

    def read(self) -> list[GpuReading]: ...

    def take_notes(self) -> list[str]: ...

    def close(self) -> None: ...


def open_source(urls: list[str] | tuple[str, ...] = (), local: bool = True,
                clock: Callable[[], int] = time.perf_counter_ns,
                default_dcgm_url: str = DEFAULT_DCGM_URL) -> tuple[GpuSource | None, str]:
    """The first source that answers, and "" ; or None and why none did, one line beginning "not measured:"."""
    from servelab.host.gpu_telemetry.amd import open_amdsmi
    from servelab.host.gpu_telemetry.dcgm import DcgmSource
    from servelab.host.gpu_telemetry.nvml import open_nvml

    why: list[str] = []
    if local:
        source, reason = open_nvml(clock=clock)
        if source is not None:
            return source, ""
        why.append(_nvml_words(reason))
    for url in urls:
        dcgm = DcgmSource(url, clock=clock)
        if dcgm.read():
            return dcgm, ""
        why.append(f"no DCGM exporter at {url}: {dcgm.last_error}" if dcgm.last_error
                   else f"no GPU at {url}")
    if default_dcgm_url not in urls:
        if _listening(default_dcgm_url):
            dcgm = DcgmSource(default_dcgm_url, clock=clock)
            if dcgm.read():
                return dcgm, ""
            why.append(f"no DCGM exporter at {default_dcgm_url}: {dcgm.last_error}")
        else:
            why.append(f"no DCGM exporter at {default_dcgm_url}")
    amd, reason = open_amdsmi()
    if amd is not None:
        return amd, ""
    why.append(reason)
    return None, f"not measured: no GPU telemetry source ({', '.join(why)})"


def _nvml_words(reason: str) -> str:
    if reason == "no nvidia-ml-py":
        if os.path.exists("/proc/driver/nvidia/version"):
            return "an NVIDIA driver but no nvidia-ml-py (pip install 'servelab[gpu]')"
        return "no NVIDIA driver"
    return reason


def _listening(url: str) -> bool:
    """Something accepts connections at the URL's port, on loopback only (never a name to resolve)."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "::1"):
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False
