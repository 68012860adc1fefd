"""Token counting from server running counts, with the chunk-count fallback labelled."""

from __future__ import annotations

from servelab.protocol.chunks import read_chunk
from servelab.bench.tokens import RawChunk, count_tokens
from servelab.records import Usage


def test_running_counts_give_exact_per_event_tokens_and_keep_the_eos_token() -> None:
    # llama.cpp with timings_per_token: predicted_n on every chunk; the finish chunk counts the EOS token.
    chunks = [RawChunk(1, "The", "", 1), RawChunk(2, " answer", "", 2), RawChunk(3, "", "", 3)]
    events, method = count_tokens(chunks, Usage(completion_tokens=3))
    assert method == "server_per_chunk"
    assert [(e.t_ns, e.tokens, e.text) for e in events] == [(1, 1, "The"), (2, 1, " answer"), (3, 1, "")]


def test_a_chunk_carrying_several_tokens_counts_all_of_them() -> None:
    chunks = [RawChunk(1, " a0 a1 a2 a3", "", 4), RawChunk(2, " a4 a5", "", 6)]
    events, method = count_tokens(chunks, Usage(completion_tokens=6))
    assert method == "server_per_chunk" and [e.tokens for e in events] == [4, 2]


def test_residual_usage_becomes_a_final_event() -> None:
    # continuous usage on content chunks, final usage-only chunk reports one more token (no running count there)
    chunks = [RawChunk(1, "x", "", 1), RawChunk(2, "y", "", 2)]
    events, _ = count_tokens(chunks, Usage(completion_tokens=3))
    assert sum(e.tokens for e in events) == 3 and events[-1].text == "" and events[-1].t_ns == 2


def test_missing_counts_fall_back_to_one_per_chunk_and_say_so() -> None:
    # transformers serve: usage only in the last chunk, so chunks before it carry no running count.
    chunks = [RawChunk(1, "a", "", None), RawChunk(2, "b", "", None), RawChunk(3, "c", "", 7)]
    events, method = count_tokens(chunks, Usage(completion_tokens=7))
    assert method == "chunk_count" and [e.tokens for e in events] == [1, 1, 1]


def test_counts_that_go_backwards_are_not_trusted() -> None:
    chunks = [RawChunk(1, "a", "", 5), RawChunk(2, "b", "", 3)]
    _, method = count_tokens(chunks, None)
    assert method == "chunk_count"


def test_reasoning_is_kept_apart_in_both_field_names() -> None:
    for field in ("reasoning_content", "reasoning"):
        view = read_chunk({"choices": [{"index": 0, "delta": {field: "think"}, "finish_reason": None}]})
        assert view.reasoning == "think" and view.answer == ""
    chunks = [RawChunk(1, "", "think", 1), RawChunk(2, "ok", "", 2)]
    events, _ = count_tokens(chunks, None)
    assert [e.kind for e in events] == ["reasoning", "answer"]


def test_read_chunk_shapes() -> None:
    # completions text, in-band error, usage with SGLang's top-level reasoning_tokens, llama.cpp timings
    assert read_chunk({"choices": [{"text": " hi", "index": 0, "finish_reason": None}]}).answer == " hi"
    assert read_chunk({"error": {"message": "boom", "code": 500}}).error == "boom (500)"
    u = read_chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                                            "reasoning_tokens": 2}})
    assert u.usage.reasoning_tokens == 2 and u.running_count is None
    v = read_chunk({"choices": [], "usage": {"completion_tokens_details": {"reasoning_tokens": 4}}})
    assert v.usage.reasoning_tokens == 4
    t = read_chunk({"choices": [{"delta": {"content": "x"}, "index": 0}], "timings": {"predicted_n": 9}})
    assert t.running_count == 9


def test_a_tokenize_probe_that_never_answers_means_no_tokenizer_within_its_timeout() -> None:
    # A server that accepts and never answers (a stalled engine): before, the probe waited aiohttp's default
    # 300 s, so a `run` cell without `tokenizer: none` hung five minutes before its first request.
    import asyncio
    import time

    import aiohttp

    from servelab.bench.tokenizer import PROBE_TIMEOUT_S, probe_server_tokenizer

    async def main() -> tuple[bool, float]:
        async def silent(reader, writer):
            await reader.read(65536)
            await asyncio.sleep(30)
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, aiohttp.ClientSession() as session:
            started = time.monotonic()
            found = await probe_server_tokenizer(session, f"http://127.0.0.1:{port}", timeout_s=0.5)
            return found, time.monotonic() - started

    found, took = asyncio.run(main())
    assert found is False and took < 3, took
    assert PROBE_TIMEOUT_S <= 10
