"""The readiness probe: GET one path, in a thread of its own, and read the answer through the adapter."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from servelab.engines.base import EngineAdapter

POLL_S = 0.05  # probe cadence: ready is seen within ~2 polls of the server answering 200
PROBE_TIMEOUT_S = 2.0  # a probe that takes longer reads "unknown" (port accepted, nobody answers)


def http_get(url: str, path: str, timeout_s: float, max_bytes: int | None = None) -> tuple[int, bytes]:
    """One GET. http.client rather than urllib: urllib honours HTTP_PROXY, and a proxy must never see loopback
    probes. Raises OSError (refused, reset, timeout) or http.client.HTTPException."""
    parts = urlsplit(url)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = connection_type(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        body = response.read() if max_bytes is None else response.read(max_bytes)
        return response.status, body
    finally:
        conn.close()


@dataclass(frozen=True)
class ProbeReading:
    state: str
    http_status: int | None
    at_s: float  # seconds since launch when the answer (or the refusal) came


class Prober:
    """Probes in a thread of its own, so a server that accepts and never answers cannot stall the start-up loop."""

    def __init__(self, url: str, path: str, adapter: EngineAdapter, clock: Callable[[], float],
                 interval_s: float = POLL_S, timeout_s: float = PROBE_TIMEOUT_S):
        self._url, self._path, self._adapter, self._clock = url, path, adapter, clock
        self._interval_s, self._timeout_s = interval_s, timeout_s
        self.latest: ProbeReading | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servelab-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._timeout_s + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.latest = self.probe_once()
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - began)))

    def probe_once(self) -> ProbeReading:
        try:
            status, body = http_get(self._url, self._path, self._timeout_s, max_bytes=4096)
        except TimeoutError:
            return ProbeReading("unknown", None, self._clock())
        except (OSError, http.client.HTTPException):  # refused, reset, closed early: nobody is serving yet
            return ProbeReading(self._adapter.probe_state(None, ""), None, self._clock())
        state = self._adapter.probe_state(status, body.decode("utf-8", errors="replace"))
        return ProbeReading(state, status, self._clock())
