"""The DCGM source on the wire and in the exporter's edge values: DCGM's blank sentinels and non-finite values are
absent fields, never numbers, and one of them never loses the scrape; a scrape goes straight to the URL (no proxy
from the environment, no redirect followed) and ends by one deadline however the server trickles its answer.
Every server here is a real one on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from gpu_doubles import ScrapeServer, dcgm_bodies
from servelab.host.gpu_telemetry.dcgm import DcgmSource, parse

LABELS = '{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="h"}'


def body(**values: str) -> str:
    return "".join(f"DCGM_FI_{name}{LABELS} {value}\n" for name, value in values.items())


def test_a_scrape_ignores_the_proxy_of_the_environment(monkeypatch) -> None:
    proxy = Listener(lambda c: c.sendall(b"HTTP/1.0 502 Bad Gateway\r\n\r\n"))
    exporter = ScrapeServer(dcgm_bodies())
    try:
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        source = DcgmSource(exporter.url, timeout_s=1.0)
        assert len(source.read()) == 8 and source.last_error is None
        assert exporter.hits == 1 and proxy.hits == []
    finally:
        proxy.close()
        exporter.close()


@pytest.mark.parametrize("blank", ["2147483632", "2147483647", "9223372036854775792", "9223372036854775794",
                                   "140737488355328", "140737488355329.5"])
def test_dcgm_blank_sentinels_are_absent_fields(blank: str) -> None:
    fields = ("DEV_POWER_USAGE", "DEV_TOTAL_ENERGY_CONSUMPTION", "DEV_GPU_TEMP", "PROF_SM_ACTIVE", "DEV_FB_USED",
              "DEV_MEM_CLOCK")
    (r,) = parse(body(**{f: blank for f in fields}, DEV_SM_CLOCK="1980"), 0)
    assert (r.power_w, r.energy_mj, r.temp_c, r.sm_active_pct, r.mem_used_bytes, r.mem_clock_mhz) == (None,) * 6
    assert r.sm_clock_mhz == 1980


def test_values_near_the_sentinels_are_kept() -> None:
    # an energy counter past 2^31 mJ (2.1 MJ: under an hour at 700 W) is a real reading
    (r,) = parse(body(DEV_TOTAL_ENERGY_CONSUMPTION="2147483648", DEV_FB_USED="2147483000"), 0)
    assert r.energy_mj == 2147483648.0 and r.mem_used_bytes == 2147483000 * 2**20


@pytest.mark.parametrize("odd", ["NaN", "+Inf", "-Inf"])
def test_a_non_finite_value_drops_its_field_only(odd: str) -> None:
    text = body(DEV_FB_USED=odd, DEV_XID_ERRORS=odd, DEV_POWER_USAGE="312.5", DEV_GPU_TEMP="61")
    (r,) = parse(text, 0)  # int(NaN) and int(inf) used to escape read()
    assert r.mem_used_bytes is None and r.xid_last is None and r.power_w == 312.5 and r.temp_c == 61.0


class Listener:
    """A raw TCP server on 127.0.0.1 that runs `answer(connection)` for each connection, and counts them."""

    def __init__(self, answer) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.hits: list[bytes] = []
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits.append(conn.recv(4096).split(b"\r\n")[0])
            try:
                self.answer(conn)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.sock.close()


def trickle(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    for _ in range(20):
        conn.sendall(b"#")
        time.sleep(0.1)


def test_a_trickling_server_cannot_stretch_the_scrape_past_its_deadline() -> None:
    server = Listener(trickle)
    try:
        source = DcgmSource(server.url, timeout_s=0.5)
        started = time.monotonic()
        assert source.read() == []
        took = time.monotonic() - started
        assert took < 1.0, took  # each byte came within the per-recv timeout: before, ~2 s
        assert source.last_error == f"{server.url} did not answer within 0.5 s"
    finally:
        server.close()


def test_a_redirect_is_refused_not_followed() -> None:
    exporter = ScrapeServer(dcgm_bodies())
    redirect = Listener(lambda c: c.sendall(f"HTTP/1.0 302 Found\r\nLocation: {exporter.url}\r\n\r\n".encode()))
    try:
        source = DcgmSource(redirect.url, timeout_s=1.0)
        assert source.read() == []
        assert exporter.hits == 0
        assert source.last_error == (f"{redirect.url} answered HTTP 302 (a redirect, not followed: give the "
                                     f"exporter's own URL)")
    finally:
        redirect.close()
        exporter.close()
