"""A worker: a process (or a Ray actor) that owns sockets and a clock, and sends what its coordinator tells it.

    python -m servelab.bench.workers.worker --connect HOST:PORT --id N --token T

It connects to its coordinator, says hello, answers clock pings, and for every request it is given sends it with
the ordinary StreamClient (at once, or at its scheduled time on this worker's clock) and streams the record back
as soon as it ends. It decides nothing: which requests, when, and what the figures are belong to the coordinator
(coordinator.py). A request the coordinator cancels ends as the client records any cancelled request, and that
record goes back too. When the coordinator goes away (its connection ends) the worker cancels what it had in
flight and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import time
from typing import Any

from servelab import __version__, aio
from servelab.bench.client import ClientOptions, Deadlines, StreamClient
from servelab.bench.unary_client import EndpointClient
from servelab.bench.workers.clock import boot_id, host_name
from servelab.bench.workers.protocol import decode_spec, encode_record, frame, read_frame

NS_PER_S = 1_000_000_000


def client_options(data: dict[str, Any]) -> ClientOptions:
    return ClientOptions(deadlines=Deadlines(**data.get("deadlines", {})), api_key=data.get("api_key"),
                         stream_extras=dict(data.get("stream_extras") or {}),
                         include_usage=bool(data.get("include_usage", True)))


def hello(worker_id: int, token: str) -> dict[str, Any]:
    return {"id": worker_id, "token": token, "host": host_name(), "pid": os.getpid(), "boot_id": boot_id(),
            "python": platform.python_version(), "servelab": __version__, "event_loop": aio.loop_name()}


async def serve(host: str, port: int, worker_id: int, token: str, about: dict[str, Any] | None = None) -> int:
    """Work for the coordinator at host:port until it says quit or goes away. Returns the requests it sent.
    `about`: more to say in the hello (a Ray actor's node)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(frame(["hello", {**(about or {}), **hello(worker_id, token)}]))
    client: StreamClient | None = None
    tasks: dict[int, asyncio.Task] = {}
    sent = 0

    def reply(header: list[Any], payload: bytes | None = None) -> None:
        if not writer.is_closing():
            writer.write(frame(header, payload))

    async def one(rid: int, spec, scheduled_ns: int | None) -> None:
        nonlocal sent
        assert client is not None
        try:
            if scheduled_ns is not None:  # held until its time, on this worker's clock, never sent early
                # (the event loop's timers are millisecond-grained and may fire a little before the time asked)
                while (delay := scheduled_ns - time.perf_counter_ns()) > 0:
                    await asyncio.sleep(delay / NS_PER_S)
        except asyncio.CancelledError:
            tasks.pop(rid, None)
            reply(["unsent", rid])
            return
        sent += 1
        try:
            record = await client.send(spec, scheduled_ns=scheduled_ns)
        except asyncio.CancelledError:
            # StreamClient.send recorded it as cancelled, with what it had received: send that back.
            record = next((r for r in reversed(client.cancelled) if r.index == spec.index), None)
            if record is not None:
                client.cancelled.remove(record)
        tasks.pop(rid, None)
        if record is not None:
            reply(["rec", rid], encode_record(record))

    try:
        while True:
            try:
                header, _ = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the coordinator is gone
            kind = header[0]
            if kind == "ping":
                reply(["pong", header[1], time.perf_counter_ns()])
            elif kind == "req":
                rid, spec, scheduled_ns = header[1], decode_spec(header[2]), header[3]
                tasks[rid] = asyncio.create_task(one(rid, spec, scheduled_ns))
            elif kind == "cancel":
                task = tasks.get(header[1])
                if task is not None:
                    task.cancel()
            elif kind == "config":
                if client is not None:
                    await client.__aexit__(None, None, None)
                config = header[1]
                client = EndpointClient(config["url"], client_options(config.get("client") or {}))
                await client.__aenter__()
            elif kind == "quit":
                break
    finally:
        for task in list(tasks.values()):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        if client is not None:
            await client.__aexit__(None, None, None)
        try:
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass
    return sent


def run(host: str, port: int, worker_id: int, token: str, about: dict[str, Any] | None = None) -> int:
    """Blocking: serve the coordinator on this process's own event loop (what a Ray actor calls)."""
    return aio.run(serve(host, port, worker_id, token, about))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servelab.bench.workers.worker")
    p.add_argument("--connect", required=True, help="HOST:PORT of the coordinator")
    p.add_argument("--id", type=int, required=True)
    p.add_argument("--token", default=os.environ.get("SERVELAB_WORKER_TOKEN", ""))
    args = p.parse_args(argv)
    # Ctrl-C at a terminal reaches the whole process group: the coordinator cancels this worker's requests and
    # takes their records (what each had received), then says quit; dying here would lose them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host, _, port = args.connect.rpartition(":")
    try:
        run(host.strip("[]"), int(port), args.id, args.token)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
