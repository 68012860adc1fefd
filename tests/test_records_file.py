"""Issue 14: records on disk as gzip'd JSON lines with token events as columns; older files still read; a
record whose tokens wait for the tokenizer is written after its recount, not before."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest

from servelab.bench.loads.common import Recorder
from servelab.bench.metrics import summarize
from servelab.records import RequestRecord, TokenEvent
from servelab.store.rundir import RunDir, read_records, records_file


def record(i: int, n: int = 200, text: str = " the") -> RequestRecord:
    t = 10**12 + i * 10**9
    events = [TokenEvent(t_ns=t + 20_000_000 + k * 10_003_117 + (k * 7919) % 4001, kind="reasoning" if k < 5
                         else "answer", tokens=1 if k % 7 else 2, text=text) for k in range(n)]
    return RequestRecord(index=i, tag="c4", endpoint="/v1/chat/completions", t_send_ns=t, t_end_ns=events[-1].t_ns,
                         events=events, ok=True, count_method="server_per_chunk", max_tokens=n)


def old_form(r: RequestRecord) -> dict:
    """A record as records.jsonl held it before issue 14: each event an object with its text."""
    return r.model_dump() | {"events": [e._asdict() for e in r.events]}


def test_events_round_trip_as_columns_and_the_file_is_small(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    originals = [record(i) for i in range(50)]
    for r in originals:
        run.append_record(r)
    run.close()
    assert run.records_path.name == "records.jsonl.gz"
    back = read_records(run.path)
    assert [[(e.t_ns, e.kind, e.tokens) for e in r.events] for r in back] == \
        [[(e.t_ns, e.kind, e.tokens) for e in r.events] for r in originals]
    assert [(r.text, r.reasoning_text) for r in back] == [(r.text, r.reasoning_text) for r in originals]
    window = (10**12, 10**12 + 60 * 10**9)
    assert summarize(back, tag="c4", mode="concurrency", concurrency=4, window=window) == \
        summarize(originals, tag="c4", mode="concurrency", concurrency=4, window=window)
    tokens = sum(r.output_tokens for r in originals)
    old_style = sum(len(json.dumps(old_form(r))) + 1 for r in originals)  # one object per event
    assert run.records_path.stat().st_size * 5 < old_style
    assert run.records_path.stat().st_size / tokens < 66 / 5
    line = json.loads(gzip.decompress(run.records_path.read_bytes()).splitlines()[0])
    assert set(line["events"]) == {"t0", "dt", "tokens", "kinds", "text"}
    assert line["events"]["kinds"] == [["reasoning", 5], ["answer", 195]]


def test_per_event_text_is_kept_when_asked(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run", keep_events_text=True)
    run.append_record(record(0, n=3, text="x"))
    run.close()
    (back,) = read_records(run.records_path)
    assert [e.text for e in back.events] == ["x", "x", "x"] and back.kept_text is None


def test_an_older_run_directory_still_reads(tmp_path: Path) -> None:
    """records.jsonl, one object per event, as servelab wrote before issue 14."""
    run = tmp_path / "old"
    run.mkdir()
    r = record(0, n=4)
    (run / "records.jsonl").write_text(json.dumps(old_form(r)) + "\n" + '{"index": 1, "tor')
    assert records_file(run) == run / "records.jsonl"
    (back,) = read_records(run)
    assert back == r  # the older form carries each event's text: nothing is lost


def test_a_torn_gzip_stream_reads_up_to_its_last_whole_record(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    for i in range(3):
        run.append_record(record(i, n=5))
    data = run.records_path.read_bytes()  # still open: no gzip trailer, as after a kill -9
    assert [r.index for r in read_records(run.records_path)] == [0, 1, 2]
    run.records_path.write_bytes(data[:-7])
    assert [r.index for r in read_records(run.records_path)] == [0, 1]


class CountingTokenizer:
    """Tokens are whole words: what a real tokenizer does, simply enough to know the answer."""

    name = "words"

    def __init__(self) -> None:
        self.calls = 0

    async def token_ends(self, texts: list[str]) -> list[list[int]]:
        self.calls += 1
        out = []
        for text in texts:
            ends, pos = [], 0
            for word in text.split(" "):
                pos += len(word) + 1
                if word:
                    ends.append(min(pos - 1, len(text)))
            out.append(ends)
        return out


def chunk_counted(i: int) -> RequestRecord:
    t = 10**12 + i * 10**8
    events = [TokenEvent(t_ns=t + k * 10**6, kind="answer", tokens=1, text="two words ") for k in range(3)]
    return RequestRecord(index=i, tag="c1", endpoint="/v1/chat/completions", t_send_ns=t, t_end_ns=t + 10**7,
                         events=events, ok=True, count_method="chunk_count")


@pytest.mark.parametrize("batch", [None, 4])
def test_a_chunk_counted_record_is_written_after_its_recount(batch, monkeypatch) -> None:
    if batch:
        monkeypatch.setattr("servelab.bench.loads.common.RECOUNT_BATCH", batch)
    written: list[RequestRecord] = []
    tokenizer = CountingTokenizer()
    recorder = Recorder(on_record=lambda r: written.append(r.model_copy(deep=True)), keep=False,
                        tokenizer=tokenizer)

    async def level():
        tally = recorder.level(window_start_ns=10**12, floor=lambda: 2**62)
        for i in range(10):
            r = chunk_counted(i)
            recorder.add(r)
            tally.append(r)
            await asyncio.sleep(0)
        if batch:
            assert written  # batches went out while the level ran
        await recorder.settle()
        return tally

    tally = asyncio.run(level())
    assert len(written) == 10 and all(r.count_method == "client_tokenizer" for r in written)
    assert all(r.output_tokens == 6 for r in written)  # three chunks of two words, not three tokens
    s = summarize(tally, tag="c1", mode="concurrency", concurrency=1, window=(10**12, 10**12 + 10**10))
    assert s.ok == 10 and s.figures["output_tokens"].value == 6
    assert s.figures["output_tokens"].counted_by == "client_tokenizer"
    assert recorder.recounted_live == (8 if batch else 0)


def test_records_waiting_for_a_recount_are_written_when_the_run_is_interrupted() -> None:
    written: list[RequestRecord] = []
    recorder = Recorder(on_record=written.append, keep=False, tokenizer=CountingTokenizer())
    tally = recorder.level(floor=lambda: 2**62)
    r = chunk_counted(0)
    recorder.add(r)
    tally.append(r)
    assert written == [] and tally.ok == 0
    recorder.flush()  # Ctrl-C: nothing is lost, counted as it was
    assert written == [r] and tally.ok == 1
