"""The coordinator's side: a pool of workers that the load modes use as they use one StreamClient.

`WorkerPool.send(spec, scheduled_ns)` is StreamClient.send at a distance: it hands the request to the worker with
the fewest requests in hand, and returns the record the worker streams back, its times moved onto this process's
clock. So the load modes (bench/loads/closed.py, open_loop.py), the LevelControl that decides when a level ends,
the Recorder and every figure run here, in one process, exactly as with one client:

- closed loop: the level's streams are this process's tasks; each request of a stream goes to the least busy
  worker, so c streams spread evenly over the workers and stay there;
- open loop: the arrival schedule is computed once, here; each request is handed to a worker
  `dispatch_lead_ns` before its time, with that time on the worker's clock, and the worker holds it until then
  (Poisson or gamma arrivals stay exact whichever worker sends them: the send times are the schedule's, not
  the coordinator's event loop's);
- for every record a worker streams back the load mode calls recorder.add, measured.append and
  control.finished, as it does for its own client; control.sending is called for every request handed out.

A worker that dies (its connection ends: killed, crashed, its host gone) is reported in the bench's warnings and
its provenance; every record it had streamed back is kept, and each request it had in hand is recorded as
cancelled, its detail naming the worker. The other workers take its share. With no worker left, a request cannot
be sent: it is recorded as a `connect` failure saying so, and 20 of those end the level and the bench like a server
that went away (docs/metrics.md#steady-state).

Backends: local worker processes (`python -m servelab.bench.workers.worker`), or Ray actors placed across a Ray
cluster (ray_backend.py). Both connect back over TCP with a per-run token, so the data path is the same.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from servelab.bench.client import ClientOptions, RequestSpec
from servelab.bench.workers.clock import ClockEstimate, Exchange, boot_id, estimate, host_name
from servelab.bench.workers.protocol import (ProtocolError, decode_record, encode_spec, frame, read_frame)
from servelab.errors import UserError
from servelab.records import RequestRecord, WorkerProvenance

NS_PER_S = 1_000_000_000
CONNECT_TIMEOUT_S = 60.0  # all workers connected and said hello
RAY_CONNECT_TIMEOUT_S = 180.0  # Ray may have to start worker processes on other hosts first
PING_TIMEOUT_S = 5.0
PINGS = 16  # clock exchanges per measurement; the one with the shortest round trip counts
CANCEL_WAIT_S = 2.0
INTERRUPT_READ_S = 5.0  # after Ctrl-C, workers' records are still read this long (see _read_loop)  # a cancelled request's record (what it received) is awaited this long from its worker
DISPATCH_LEAD_NS = 20_000_000  # open loop: hand a request to its worker this long before its scheduled time


@dataclass
class _Worker:
    id: int
    writer: asyncio.StreamWriter | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    alive: bool = False
    shared_clock: bool = False
    applied_offset_ns: int = 0
    clock_start: ClockEstimate | None = None
    clock_end: ClockEstimate | None = None
    pending: dict[int, tuple[asyncio.Future, RequestSpec, int | None, int]] = field(default_factory=dict)
    pongs: dict[int, asyncio.Future] = field(default_factory=dict)
    requests: int = 0
    died: str | None = None
    reader_task: asyncio.Task | None = None

    def write(self, data: bytes) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(data)


def _lost(spec: RequestSpec, scheduled_ns: int | None, handed_ns: int, now_ns: int, why: str) -> RequestRecord:
    """The record of a request whose worker's own record of it cannot come back: cancelled, saying why."""
    return RequestRecord(index=spec.index, tag=spec.tag, warmup=spec.warmup, endpoint=spec.endpoint,
                         input_tokens=spec.input_tokens, max_tokens=spec.body.get("max_tokens"),
                         scheduled_ns=scheduled_ns, t_send_ns=scheduled_ns if scheduled_ns is not None else handed_ns,
                         t_end_ns=now_ns, ok=False, error_kind="cancelled", error_detail=why)


class LocalProcesses:
    """Workers as child processes of this one, on this host."""

    name = "process"
    listen_host = "127.0.0.1"

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}

    def prepare(self) -> None:
        pass

    def start(self, count: int, host: str, port: int, token: str) -> None:
        env = {**os.environ, "SERVELAB_WORKER_TOKEN": token}
        for i in range(count):
            self.procs[i] = subprocess.Popen(
                [sys.executable, "-m", "servelab.bench.workers.worker", "--connect", f"{host}:{port}", "--id", str(i)],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def failed(self) -> str | None:
        for i, proc in self.procs.items():
            if proc.poll() is not None:
                return f"worker {i} exited with {proc.returncode} before it connected"
        return None

    def exit_status(self, worker_id: int) -> str | None:
        proc = self.procs.get(worker_id)
        if proc is None:
            return None
        try:
            code = proc.wait(0.5)
        except subprocess.TimeoutExpired:
            return None
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def stop(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.05))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


class WorkerPool:
    """N workers behind one `send`. Use as an async context manager (it starts, connects and measures the workers'
    clocks on entry; measures them again and stops them on exit)."""

    def __init__(self, url: str, options: ClientOptions | None = None, workers: int | str = 1, *, backend=None,
                 on_warning: Callable[[str], None] | None = None):
        self.backend = backend or LocalProcesses()
        if workers == "auto":  # Ray: one per CPU of the cluster but one (known once it is joined)
            self.backend.prepare()
            workers = self.backend.cluster_workers()
        if not isinstance(workers, int) or workers < 1:
            raise UserError(f"--workers must be at least 1 (got {workers})")
        self.url = url
        self.options = options or ClientOptions()
        self.count = workers
        self.on_warning = on_warning
        self.workers: list[_Worker] = [_Worker(id=i) for i in range(workers)]
        self.cancelled: list[RequestRecord] = []  # as StreamClient.cancelled: the Recorder takes them from here
        self.dispatch_lead_ns = DISPATCH_LEAD_NS
        self.warnings: list[str] = []
        self._ids = itertools.count()
        self._token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None
        self._connected: asyncio.Event | None = None
        self._turn = 0
        self._closing = False  # quit was said: a connection that ends now is a worker leaving, not dying
        self._my_boot = boot_id()
        self._my_host = host_name()

    # ---- start and stop ----
    async def __aenter__(self) -> WorkerPool:
        self._connected = asyncio.Event()
        await asyncio.get_running_loop().run_in_executor(None, self.backend.prepare)
        self._server = await asyncio.start_server(self._on_connect, self.backend.listen_host, 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.backend.start, self.count, host, port,
                                                             self._token)
            await self._wait_connected()
            estimates = await asyncio.gather(*(self._measure_clock(w) for w in self.workers))
            config = {"url": self.url, "client": asdict(self.options)}
            for w, est in zip(self.workers, estimates):
                w.clock_start = est
                w.shared_clock = bool(self._my_boot) and w.hello.get("boot_id") == self._my_boot
                w.applied_offset_ns = 0 if w.shared_clock else est.offset_ns
                w.write(frame(["config", config]))
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        alive = [w for w in self.workers if w.alive]
        try:
            ends = await asyncio.wait_for(asyncio.gather(*(self._measure_clock(w) for w in alive),
                                                         return_exceptions=True), PING_TIMEOUT_S * 2)
            for w, est in zip(alive, ends):
                if isinstance(est, ClockEstimate):
                    w.clock_end = est
        except (TimeoutError, asyncio.CancelledError):
            pass
        await self._shutdown()

    async def _shutdown(self) -> None:
        in_hand = [(w, rid) for w in self.workers if w.alive for rid in w.pending]
        for w, rid in in_hand:  # a run that ends with requests in flight (interrupted): their records first
            w.write(frame(["cancel", rid]))
        deadline = time.monotonic() + CANCEL_WAIT_S
        while any(w.pending for w in self.workers if w.alive) and time.monotonic() < deadline:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                break
        now = time.perf_counter_ns()
        for w in self.workers:
            for _, (fut, spec, scheduled_ns, handed_ns) in list(w.pending.items()):
                record = _lost(spec, scheduled_ns, handed_ns, now,
                               f"the bench ended with the request in flight at worker {w.id}, whose record of it "
                               f"did not come back")
                if not fut.done():
                    fut.set_result(record)
                else:
                    self.cancelled.append(record)
            w.pending.clear()
        self._closing = True
        for w in self.workers:
            w.write(frame(["quit"]))
            if w.writer is not None:
                try:
                    await asyncio.wait_for(w.writer.drain(), 2)
                except (TimeoutError, ConnectionError, OSError):
                    pass
        await asyncio.get_running_loop().run_in_executor(None, self.backend.stop)
        for w in self.workers:
            w.alive = False
            if w.reader_task is not None:
                w.reader_task.cancel()
            if w.writer is not None:
                w.writer.close()
        if self._server is not None:
            self._server.close()

    async def _wait_connected(self) -> None:
        limit = RAY_CONNECT_TIMEOUT_S if self.backend.name == "ray" else CONNECT_TIMEOUT_S
        deadline = time.monotonic() + limit
        assert self._connected is not None
        while not all(w.alive for w in self.workers):
            failed = self.backend.failed()
            if failed:
                raise UserError(f"a servelab worker did not start: {failed}")
            if time.monotonic() > deadline:
                missing = [w.id for w in self.workers if not w.alive]
                raise UserError(f"servelab workers {missing} did not connect within {limit:g} s")
            self._connected.clear()
            try:
                await asyncio.wait_for(self._connected.wait(), 0.2)
            except TimeoutError:
                pass

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            header, _ = await asyncio.wait_for(read_frame(reader), 10)
            info = header[1] if header[0] == "hello" and len(header) > 1 and isinstance(header[1], dict) else {}
            wid = info.get("id")
            if not secrets.compare_digest(str(info.get("token", "")), self._token) or not isinstance(wid, int) \
                    or not 0 <= wid < self.count or self.workers[wid].writer is not None:
                writer.close()
                return
        except (TimeoutError, asyncio.IncompleteReadError, ProtocolError, ConnectionError, IndexError):
            writer.close()
            return
        w = self.workers[wid]
        info.pop("token", None)
        w.hello, w.writer, w.alive = info, writer, True
        w.reader_task = asyncio.current_task()
        if self._connected is not None:
            self._connected.set()
        await self._read_loop(w, reader)

    # ---- what the workers say ----
    async def _read_loop(self, w: _Worker, reader: asyncio.StreamReader) -> None:
        why = "its connection ended"
        ahead: asyncio.Future | None = None  # the frame being read (shielded: a frame is never cut in two)
        interrupted_at: float | None = None
        try:
            while True:
                if ahead is None:
                    ahead = asyncio.ensure_future(read_frame(reader))
                try:
                    header, payload = await asyncio.shield(ahead)
                except asyncio.CancelledError:
                    # Ctrl-C cancels every task at once, this one too: keep reading (a few seconds at most) so the
                    # records of the requests being cancelled still come back, until the pool closes.
                    now = time.monotonic()
                    interrupted_at = interrupted_at or now
                    if self._closing or now - interrupted_at > INTERRUPT_READ_S:
                        ahead.cancel()
                        raise
                    continue
                ahead = None
                kind = header[0]
                if kind == "rec":
                    entry = w.pending.pop(header[1], None)
                    if entry is not None:
                        record = decode_record(payload or b"", w.applied_offset_ns)
                        if not entry[0].done():
                            entry[0].set_result(record)
                        else:  # nobody waits for it any more (its send gave up): kept as cancelled ones are
                            self.cancelled.append(record)
                elif kind == "unsent":
                    entry = w.pending.pop(header[1], None)
                    if entry is not None and not entry[0].done():
                        entry[0].set_result(None)
                elif kind == "pong":
                    fut = w.pongs.pop(header[1], None)
                    if fut is not None and not fut.done():
                        fut.set_result((header[2], time.perf_counter_ns()))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ProtocolError as exc:
            why = f"it sent something unreadable ({exc})"
        except asyncio.CancelledError:
            if w.alive:  # the pool is closing: nothing died
                w.alive = False
            raise
        if w.alive and not self._closing:
            await self._died(w, why)
        w.alive = False

    async def _died(self, w: _Worker, why: str) -> None:
        w.alive = False
        status = await asyncio.get_running_loop().run_in_executor(None, self.backend.exit_status, w.id)
        where = f"worker {w.id} ({w.hello.get('host', '?')} pid {w.hello.get('pid', '?')})"
        w.died = f"{why}" + (f", {status}" if status else "")
        now = time.perf_counter_ns()
        lost = list(w.pending.items())
        w.pending.clear()
        tags = sorted({spec.tag for _, (_, spec, _, _) in lost if spec.tag})
        for _, (fut, spec, scheduled_ns, handed_ns) in lost:
            record = _lost(spec, scheduled_ns, handed_ns, now,
                           f"{where} died with the request in flight ({w.died}): what it had received is lost")
            if not fut.done():
                fut.set_result(record)
            else:
                self.cancelled.append(record)
        for fut in w.pongs.values():
            if not fut.done():
                fut.set_exception(ConnectionError(why))
        survivors = sum(1 for x in self.workers if x.alive)
        message = (f"{where} died ({w.died})" + (f" during {', '.join(tags)}" if tags else "") +
                   f": its {w.requests - len(lost)} finished requests are kept, its {len(lost)} in flight are "
                   f"recorded as cancelled; " +
                   (f"the other {survivors} worker(s) took its share" if survivors else "no worker is left"))
        self.warnings.append(message)
        if self.on_warning is not None:
            self.on_warning(message)

    # ---- clocks ----
    async def _measure_clock(self, w: _Worker, pings: int = PINGS) -> ClockEstimate:
        loop = asyncio.get_running_loop()
        exchanges: list[Exchange] = []
        for _ in range(pings):
            seq = next(self._ids)
            fut = loop.create_future()
            w.pongs[seq] = fut
            sent = time.perf_counter_ns()
            w.write(frame(["ping", seq]))
            worker_ns, received = await asyncio.wait_for(fut, PING_TIMEOUT_S)
            exchanges.append(Exchange(sent, worker_ns, received))
        return estimate(exchanges)

    # ---- sending ----
    def _pick(self) -> _Worker | None:
        alive = [w for w in self.workers if w.alive]
        if not alive:
            return None
        self._turn += 1
        k = self._turn % len(alive)
        order = alive[k:] + alive[:k]  # ties go round
        return min(order, key=lambda w: len(w.pending))

    async def send(self, spec: RequestSpec, scheduled_ns: int | None = None) -> RequestRecord:
        """Send `spec` through a worker (at `scheduled_ns` on this process's clock, when given) and return its
        record, its times on this process's clock."""
        w = self._pick()
        if w is None:
            now = time.perf_counter_ns()
            return RequestRecord(index=spec.index, tag=spec.tag, warmup=spec.warmup, endpoint=spec.endpoint,
                                 input_tokens=spec.input_tokens, max_tokens=spec.body.get("max_tokens"),
                                 scheduled_ns=scheduled_ns, t_send_ns=now, t_end_ns=now, ok=False,
                                 error_kind="connect",
                                 error_detail="not sent: no servelab worker is left (every worker process died; "
                                              "see the bench's warnings)")
        rid = next(self._ids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        w.pending[rid] = (fut, spec, scheduled_ns, time.perf_counter_ns())
        w.requests += 1
        on_worker = None if scheduled_ns is None else scheduled_ns + w.applied_offset_ns
        w.write(frame(["req", rid, encode_spec(spec), on_worker]))
        try:
            record = await asyncio.shield(fut)  # cancelling this send must not cancel the worker's answer
        except asyncio.CancelledError:
            if not fut.done():
                w.write(frame(["cancel", rid]))
            try:
                record = await asyncio.wait_for(asyncio.shield(fut), CANCEL_WAIT_S)
            except (TimeoutError, asyncio.CancelledError):
                # Cancelled again (the load mode's stop_in_flight) or out of time. The record may have come in the
                # same loop turn: the read loop has then taken it off `pending` and only this future holds it.
                record = fut.result() if fut.done() and not fut.cancelled() else None
                # Not back yet: it stays in hand, and when it comes (or the pool closes without it) it joins
                # `cancelled`, where the runner takes the last records of an interrupted run from.
                fut.cancel()
            if record is not None:
                self.cancelled.append(record)
            raise
        if record is None:  # only a cancelled request comes back unsent
            raise asyncio.CancelledError
        return record

    def abandoned(self) -> list[RequestRecord]:
        return []  # every request in hand is a task of the load mode's, or recorded at a worker's death

    # ---- what the run records ----
    @property
    def processes(self) -> int:
        return self.count

    @property
    def local_pids(self) -> list[int]:
        """The workers' processes on this host (their CPU is the client's, not other load)."""
        return [int(w.hello["pid"]) for w in self.workers
                if w.hello.get("pid") and w.hello.get("boot_id") == self._my_boot]

    def provenance(self) -> list[WorkerProvenance]:
        out = []
        for w in self.workers:
            start, end = w.clock_start, w.clock_end
            out.append(WorkerProvenance(
                id=w.id, backend=self.backend.name, host=w.hello.get("host"), pid=w.hello.get("pid"),
                node=w.hello.get("node"), shared_clock=w.shared_clock, applied_offset_ns=w.applied_offset_ns,
                clock_offset_ns=start.offset_ns if start else None,
                clock_error_ns=start.error_ns if start else None,
                clock_offset_end_ns=end.offset_ns if end else None,
                clock_error_end_ns=end.error_ns if end else None,
                requests=w.requests, status="died" if w.died else "ok", died=w.died))
        return out
