"""What every load mode shares: the recorder that keeps records as they complete (and those cancelled in flight),
and the target's traits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from servelab.bench.client import RequestSpec
from servelab.records import RequestRecord
from servelab.redaction import redact_text


@dataclass
class Recorder:
    """Collects records as they complete, so an interrupted run still has everything that finished."""

    records: list[RequestRecord] = field(default_factory=list)
    on_record: Callable[[RequestRecord], None] | None = None
    next_index: int = 0
    # Values never to keep (the API key sent): a server that echoes one in an error body has it hidden from the
    # record's error_detail before anything reads it (records.jsonl, top errors, the terminal).
    secrets: tuple[str, ...] = ()

    def take_index(self) -> int:
        i = self.next_index
        self.next_index += 1
        return i

    def add(self, record: RequestRecord) -> None:
        if record.error_detail:
            record.error_detail = redact_text(record.error_detail, self.secrets)
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def add_cancelled(self, client, measured: list[RequestRecord] | None = None,
                      because: str | None = None) -> list[RequestRecord]:
        """Take the requests `client` had in flight when their tasks were cancelled (Ctrl-C, or a load mode
        stopping its own tasks) and keep them like any other record: here, through `on_record` (records.jsonl),
        and in `measured` (the level's records) unless they are warm-up. Each carries error_kind "cancelled"
        and what it had received (StreamClient.send records it there, since it cannot return it); `because`,
        when given, says in its error_detail who cancelled it (e.g. a level's cap).

        Takes them off the client's list, so calling this again (the runner does, after the event loop has
        finished every task) never records one twice."""
        abandoned = getattr(client, "abandoned", None)
        if abandoned is not None:
            abandoned()  # sends whose coroutine ended without recording themselves join `cancelled`
        pending = getattr(client, "cancelled", None)
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


def make_spec(workload, target: Target, recorder: Recorder, tag: str, warmup: bool = False) -> RequestSpec:
    """The next request of `workload`, numbered in the order requests are built."""
    return workload.request(recorder.take_index(), target.model, tag=tag, warmup=warmup,
                            accepts_ignore_eos=target.accepts_ignore_eos,
                            accepts_min_tokens=target.accepts_min_tokens)
