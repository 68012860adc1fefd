"""What every load mode shares: the recorder that keeps records as they complete (and those cancelled in flight),
and the target's traits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.sender import Sender
from servelab.bench.tally import LevelTally
from servelab.records import RequestRecord
from servelab.redaction import redact_text


# Records waiting for the tokenizer's recount are recounted in batches of this many while a level runs, so a
# level of any length holds at most this many whole records (docs/metrics.md#bounded-memory).
RECOUNT_BATCH = 2000


@dataclass
class Recorder:
    """Passes each finished record on (`on_record`: records.jsonl) as it completes, so an interrupted run still has
    everything that finished, and opens each level's tally (`level`).

    A record whose tokens were counted one per chunk waits for the tokenizer (`tokenizer`, set by the runner when
    it has one) before it is passed on: records.jsonl and the figures then hold the same counts. Such records are
    recounted at the end of their level (`settle`), or in batches of RECOUNT_BATCH while it runs."""

    records: list[RequestRecord] = field(default_factory=list)
    on_record: Callable[[RequestRecord], None] | None = None
    next_index: int = 0
    # Values never to keep (the API key sent): a server that echoes one in an error body has it hidden from the
    # record's error_detail before anything reads it (records.jsonl, top errors, the terminal).
    secrets: tuple[str, ...] = ()
    # Keep every record in memory (`records`, and each level's tally keeps its own): what tests and callers that
    # read the records back want. A bench run keeps none: memory stays flat however long it runs.
    keep: bool = True
    slos: tuple = ()  # SLO targets each level's tally judges requests against (goodput)
    tokenizer: Any = None  # bench/tokenizer.py: recounts chunk-counted records before they are passed on
    current: LevelTally | None = None  # the tally of the level in progress (an interrupted run summarises it)
    recounted_live: int = 0  # records recounted by a batch while their level ran
    _waiting: dict[int, RequestRecord] = field(default_factory=dict)  # id -> record not passed on yet
    _held: list[RequestRecord] = field(default_factory=list)  # waiting, no batch started for them yet
    _batches: list[asyncio.Task] = field(default_factory=list)

    def take_index(self) -> int:
        i = self.next_index
        self.next_index += 1
        return i

    def add(self, record: RequestRecord) -> None:
        if record.error_detail:
            record.error_detail = redact_text(record.error_detail, self.secrets)
        if self.keep:
            self.records.append(record)
        if self._needs_recount(record):
            self._waiting[id(record)] = record
            self._held.append(record)
            if len(self._held) >= RECOUNT_BATCH:
                self.recounted_live += len(self._held)
                self._start_batch()
            return
        self._pass_on(record)

    def _pass_on(self, record: RequestRecord) -> None:
        if self.on_record is not None:
            self.on_record(record)

    # ---- levels ----
    def level(self, *, window_start_ns: int | None = None, floor: Callable[[], int] | None = None) -> LevelTally:
        """A new level's tally (what the load modes call `measured`)."""
        self.current = LevelTally(window_start_ns=window_start_ns, floor=floor, slos=self.slos, keep=self.keep,
                                  waiting=self.waiting)
        return self.current

    # ---- the recount ----
    def _needs_recount(self, r: RequestRecord) -> bool:
        return (self.tokenizer is not None and r.ok and not r.warmup and r.count_method == "chunk_count"
                and bool(r.events))

    def waiting(self, record: RequestRecord) -> bool:
        """The record waits for its recount (a tally folds it once it is done)."""
        return id(record) in self._waiting

    def _start_batch(self) -> None:
        batch, self._held = self._held, []
        self._batches.append(asyncio.get_running_loop().create_task(self._recount(batch)))

    async def _recount(self, batch: list[RequestRecord]) -> None:
        from servelab.bench.tokens import recount_with_tokenizer

        try:
            await recount_with_tokenizer(batch, self.tokenizer)
        finally:
            for r in batch:
                if self._waiting.pop(id(r), None) is not None:
                    self._pass_on(r)
            if self.current is not None:
                self.current.fold_waiting()

    async def settle(self) -> None:
        """Recount every record still waiting (the level's end), pass them on and fold them into their tally."""
        if self._held:
            self._start_batch()
        while self._batches:
            await self._batches.pop(0)

    def flush(self) -> None:
        """Pass on, as counted, every record still waiting (the run was interrupted before its recount)."""
        for record in list(self._waiting.values()):
            self._pass_on(record)
        self._waiting.clear()
        self._held.clear()
        if self.current is not None:
            self.current.fold_waiting()

    def add_cancelled(self, client: Sender, measured: list[RequestRecord] | None = None,
                      because: str | None = None) -> list[RequestRecord]:
        """Take the requests `client` had in flight when their tasks were cancelled (Ctrl-C, or a load mode
        stopping its own tasks) and keep them like any other record: here, through `on_record` (records.jsonl),
        and in `measured` (the level's records) unless they are warm-up. Each carries error_kind "cancelled"
        and what it had received (StreamClient.send records it there, since it cannot return it); `because`,
        when given, says in its error_detail who cancelled it (e.g. a level's cap).

        Takes them off the client's list, so calling this again (the runner does, after the event loop has
        finished every task) never records one twice."""
        client.abandoned()  # sends whose coroutine ended without recording themselves join `cancelled`
        pending = client.cancelled
        if not pending:
            return []
        taken = list(pending)
        del pending[:len(taken)]
        for record in taken:
            if because:
                record.error_detail = f"{because} ({record.error_detail})" if record.error_detail else because
            self.add(record)
            if measured is not None and not record.warmup:
                measured.append(record)
        return taken


@dataclass(frozen=True)
class Target:
    model: str
    accepts_ignore_eos: bool = False
    # Whether requests may carry `min_tokens` (vLLM, SGLang). Engines that ignore unknown fields (llama.cpp)
    # must say no, or the per-request length check would blame the server for a field it never read.
    accepts_min_tokens: bool = False


async def stop_in_flight(tasks, client: Sender, recorder: Recorder, measured) -> None:
    """A level interrupted (Ctrl-C): cancel its tasks and wait for them (a cancelled gather already did; a task
    cancelled while its sender slept did not), so each request in flight is on the client's list, then record
    those as cancelled, in the level's records too. The caller re-raises the cancellation."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    recorder.add_cancelled(client, measured)


def make_spec(workload, target: Target, recorder: Recorder, tag: str, warmup: bool = False) -> RequestSpec:
    """The next request of `workload`, numbered in the order requests are built."""
    return workload.request(recorder.take_index(), target.model, tag=tag, warmup=warmup,
                            accepts_ignore_eos=target.accepts_ignore_eos,
                            accepts_min_tokens=target.accepts_min_tokens)


@dataclass
class RunningLevel:
    """What a load mode holds while its level runs: the level's tally (`measured`: the records the figures are
    made of) and the tasks it started, whose requests are recorded as cancelled if the level is interrupted."""

    measured: LevelTally
    tasks: list[asyncio.Task] = field(default_factory=list)


@asynccontextmanager
async def level_running(control, recorder: Recorder, client: Sender, start_ns: int) -> AsyncIterator[RunningLevel]:
    """The frame every load level with a LevelControl runs in: the level begins at `start_ns`, its tally opens
    with the window's floor the control keeps, and the control's watcher ends it on time even when no request
    finishes. On Ctrl-C (the level's task cancelled) the requests in flight are recorded as cancelled before the
    cancellation goes on; whatever way the level stops, the watcher and any task still running are cancelled."""
    control.begin(start_ns)
    level = RunningLevel(recorder.level(window_start_ns=start_ns, floor=control.window_floor_ns))
    watcher = asyncio.create_task(control.watch())
    try:
        yield level
    except asyncio.CancelledError:
        await stop_in_flight(level.tasks, client, recorder, level.measured)  # in flight -> cancelled
        raise
    finally:
        watcher.cancel()
        for task in level.tasks:  # only when stopped by an exception: a finished level leaves nothing running
            task.cancel()
