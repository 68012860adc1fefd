"""`servelab bench --endpoint responses` and `--endpoint messages` against the real embedded llama.cpp (xllamacpp
with SmolLM2), which serves both (verify's responses_api and messages_api checks pass on it): the records are
complete, their token counts are the server's usage, and the same prompt at temperature 0 gives the chat
endpoint's prompt and answer, since llama.cpp renders one user message through the same chat template on all three
routes (measured: the same prompt_tokens, the same text)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servelab.bench.runner import BenchOptions, bench
from servelab.bench.workload import Workload
from servelab.records import RequestRecord
from servelab.store.rundir import read_records, records_file

# the real engine on two more APIs: the slow tier (CI runs it), so the default suite stays near 15 min; the
# captured streams of tests/test_dialects.py replay the same formats there
pytestmark = [pytest.mark.engine, pytest.mark.slow]

MAX_TOKENS = 16
REQUESTS = 2


def cli_records(url: str, endpoint: str, out: Path) -> list[RequestRecord]:
    done = subprocess.run([sys.executable, "-m", "servelab.cli", "bench", url, "--endpoint", endpoint, "--requests",
                           str(REQUESTS), "--warmup", "0", "--max-tokens", str(MAX_TOKENS), "--out", str(out),
                           "--keep-events-text"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    path = records_file(run_dir)
    assert path is not None
    return read_records(path)


@pytest.fixture(scope="module")
def runs(embedded_server, tmp_path_factory) -> dict[str, list[RequestRecord]]:
    url = embedded_server["url"]
    chat: list[RequestRecord] = []
    bench(url, BenchOptions(mode="single", single_requests=REQUESTS, warmup=0,
                            workload=Workload(max_tokens=MAX_TOKENS)), on_record=chat.append)
    return {"chat": chat, **{name: cli_records(url, name, tmp_path_factory.mktemp(name))
                             for name in ("responses", "messages")}}


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_every_record_is_complete_and_counts_the_servers_usage(runs, endpoint):
    records = runs[endpoint]
    assert len(records) == REQUESTS
    for r in records:
        assert r.ok and r.endpoint == f"/v1/{endpoint}" and r.saw_done, r.error_detail
        assert r.output_tokens == r.usage.completion_tokens == MAX_TOKENS
        assert r.usage.prompt_tokens > 0
        ttft = r.events[0].t_ns - r.t_send_ns
        assert 0 < ttft < r.t_end_ns - r.t_send_ns
        assert all(e.kind == "answer" for e in r.events)  # SmolLM2 does not reason


def test_responses_count_per_event_from_llama_cpps_running_counts(runs):
    # servelab asks llama.cpp for timings_per_token, which it adds to Responses deltas as to chat chunks
    records = runs["responses"]
    assert {r.count_method for r in records} == {"server_per_chunk"}
    assert all(r.finish_reason == "completed" for r in records)  # llama.cpp says completed at the limit too
    assert all(r.sampling.get("ignore_eos") is True for r in records)


def test_messages_are_recounted_by_the_servers_tokenizer(runs):
    # llama.cpp's Messages events carry no running count, and its converter drops ignore_eos: not sent
    records = runs["messages"]
    assert {r.count_method for r in records} == {"client_tokenizer"}
    assert all(r.finish_reason == "max_tokens" for r in records)
    assert all("ignore_eos" not in r.sampling for r in records)


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_the_same_prompt_gives_the_chat_endpoints_tokens_and_text(runs, endpoint):
    chat = {r.index: r for r in runs["chat"]}
    for r in runs[endpoint]:
        same = chat[r.index]
        # one user message, one chat template: the prompts are the same tokens on every route
        assert r.usage.prompt_tokens == same.usage.prompt_tokens
        assert r.output_tokens == same.output_tokens
        assert "".join(e.text for e in r.events) == "".join(e.text for e in same.events)
