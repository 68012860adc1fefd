"""What the GPU telemetry tests share: the NVML double imported as `pynvml` (exactly as the code under test
imports the real library), a clock the test moves, and a real HTTP server on 127.0.0.1 serving DCGM scrapes."""

from __future__ import annotations

import http.server
import importlib
import json
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DOUBLES = HERE / "doubles"
NVML_SERIES = HERE / "fixtures" / "nvml" / "h200x8.json"
DCGM_SCRAPES = [HERE / "fixtures" / "dcgm" / f"h200x8_scrape{k}.txt" for k in (1, 2)]


class Clock:
    """Nanoseconds the test sets; the double's series starts at its value when loaded."""

    def __init__(self, t_ns: int = 10**12) -> None:
        self.t_ns = t_ns
        self.start = t_ns

    def __call__(self) -> int:
        return self.t_ns

    def at(self, seconds: float) -> int:
        """Move to `seconds` into the series."""
        self.t_ns = self.start + int(round(seconds * 1e9))
        return self.t_ns


def import_double(monkeypatch: Any) -> Any:
    """tests/doubles first on sys.path and `import pynvml`; the caller's fixture pops it again."""
    monkeypatch.syspath_prepend(str(DOUBLES))
    sys.modules.pop("pynvml", None)
    module = importlib.import_module("pynvml")
    assert Path(module.__file__).parent.parent == DOUBLES
    return module


def series() -> dict[str, Any]:
    return json.loads(NVML_SERIES.read_text())


def frame_at(doc: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The keyframe in force at `seconds`, as the double replays it."""
    chosen = doc["series"][0]
    for frame in doc["series"]:
        if frame["t_s"] <= seconds:
            chosen = frame
    return chosen


class ScrapeServer:
    """A real HTTP server on 127.0.0.1 (ephemeral port): GET /metrics answers the next body in turn."""

    def __init__(self, bodies: list[bytes], status: int = 200) -> None:
        self.bodies = bodies
        self.status = status
        self.hits = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                body = owner.bodies[min(owner.hits, len(owner.bodies) - 1)]
                owner.hits += 1
                self.send_response(owner.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def dcgm_bodies() -> list[bytes]:
    return [p.read_bytes() for p in DCGM_SCRAPES]


def fresh_dcgm_bodies(scrapes: int = 400) -> list[bytes]:
    """An exporter run with -c 250 and read at 4 Hz: the second fixture scrape, with every GPU's energy counter
    advancing by its power x 0.25 s at each scrape and its power a little different each time (an exporter at
    its 30 s default serves one sample, which the figures refuse: tests/test_gpu_stale.py)."""
    lines = DCGM_SCRAPES[1].read_text().splitlines()
    power = {}
    for line in lines:
        if line.startswith("DCGM_FI_DEV_POWER_USAGE{"):
            power[line[line.index('gpu="') + 5:].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    bodies = []
    for k in range(scrapes):
        out = []
        for line in lines:
            if line.startswith(("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{", "DCGM_FI_DEV_POWER_USAGE{")):
                head, value = line.rsplit(" ", 1)
                gpu = line[line.index('gpu="') + 5:].split('"')[0]
                if line.startswith("DCGM_FI_DEV_POWER_USAGE"):
                    line = f"{head} {power[gpu] + (k % 2) * 0.5:.6f}"
                else:
                    line = f"{head} {int(float(value) + k * power[gpu] * 250)}"
            out.append(line)
        bodies.append(("\n".join(out) + "\n").encode())
    return bodies
