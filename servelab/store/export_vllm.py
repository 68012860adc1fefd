"""`servelab export RUN --format vllm`: each load level as a `vllm bench serve --save-result --save-detailed` JSON,
the shape vLLM's dashboards, its CI's result converters and tools that read those files take (and
servelab's own importer, compare/peers/vllm_bench.py, reads back).

Written: `date`, `endpoint_type`/`backend`, `label`, `model_id`, `tokenizer_id`, `num_prompts`, `request_rate`
("inf" for closed loop), `burstiness`, `max_concurrency`, `duration`, `completed`, `failed`, `total_input_tokens`,
`total_output_tokens`, `request_throughput`, `request_goodput`, `output_throughput`, `total_token_throughput`,
the per-request lists `input_lens`, `output_lens`, `ttfts`, `itls`, `latencies`, `start_times`, `errors`,
`generated_texts`, and for ttft, tpot, itl and e2el `mean_*_ms`, `median_*_ms`, `std_*_ms`, `p99_*_ms` — every
figure computed from the level's RequestRecords by servelab's definitions (bench/metrics.py), so it is *servelab's*
figure under vLLM's name. What does not map (docs/output.md#vllm-export):

- `ttfts` end at the first token (servelab's TTFT), not at the role chunk vLLM times;
- `itls` are the gaps between token-bearing events (`metrics.chunk_gaps_ms`): per chunk like vLLM's, but without
  vLLM's role→first-token and last-token→finish-chunk gaps;
- `tpot` is servelab's TPOT (first to last token event ÷ tokens after the first), vLLM's ends at the finish chunk;
- `duration` is the level's measurement window and `output_throughput`/`request_throughput` are servelab's
  windowed figures (tokens and requests inside the window ÷ its length), where vLLM divides every token by the
  whole run; `total_output_tokens` counts every successful request's tokens;
- `request_goodput`, `max_output_tokens_per_s`, `max_concurrent_requests` and vLLM's spec-decode fields are not
  written (null or absent); `start_times` are servelab's monotonic send times in seconds, like vLLM's
  `perf_counter` ones: only their differences mean anything.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servelab.bench import metrics
from servelab.records import RequestRecord, Summary
from servelab.store.files import ensure_output_dir, write_output

NS = 1e9


def _stats(name: str, values_ms: Sequence[float]) -> dict[str, float]:
    v = sorted(values_ms)
    if not v:
        return {f"mean_{name}_ms": 0.0, f"median_{name}_ms": 0.0, f"std_{name}_ms": 0.0, f"p99_{name}_ms": 0.0}
    return {f"mean_{name}_ms": statistics.fmean(v), f"median_{name}_ms": metrics.percentile(v, 50),
            f"std_{name}_ms": statistics.pstdev(v), f"p99_{name}_ms": metrics.percentile(v, 99)}


def level_document(level: Summary, records: Sequence[RequestRecord], model: str = "", started_at: str = "",
                   endpoint: str = "chat") -> dict[str, Any]:
    """One level as vLLM's result JSON: its measured requests (warm-up and cancelled ones left out) in order."""
    measured = [r for r in records if not r.warmup and not metrics.is_cancelled(r)]
    ok = [r for r in measured if r.ok]
    ttfts = [metrics.ttft_ns(r) / NS if r.ok and metrics.ttft_ns(r) is not None else 0.0 for r in measured]
    figure = (lambda key: level.figures[key].value if key in level.figures else None)
    output_tok_s, request_s = figure("output_tok_s"), figure("request_s")
    doc: dict[str, Any] = {
        "date": started_at, "endpoint_type": f"openai-{endpoint}" if endpoint == "chat" else "openai",
        "backend": f"openai-{endpoint}" if endpoint == "chat" else "openai", "label": "servelab",
        "model_id": model, "tokenizer_id": model, "num_prompts": len(measured),
        "request_rate": level.rate if level.mode == "rate" and level.rate else "inf", "burstiness": 1.0,
        "max_concurrency": level.concurrency or None,
        "duration": level.window_s, "completed": len(ok), "failed": level.failed,
        "total_input_tokens": sum(r.input_tokens or (r.usage.prompt_tokens if r.usage and r.usage.prompt_tokens
                                                     else 0) for r in ok),
        "total_output_tokens": sum(r.output_tokens for r in ok),
        "request_throughput": request_s, "request_goodput": None, "output_throughput": output_tok_s,
        "total_token_throughput": None,
        "input_lens": [r.input_tokens or (r.usage.prompt_tokens if r.usage else None) or 0 for r in measured],
        "output_lens": [r.output_tokens if r.ok else 0 for r in measured],
        "ttfts": ttfts,
        "itls": [[g / 1e3 for g in metrics.chunk_gaps_ms(r)] if r.ok else [] for r in measured],
        "latencies": [(metrics.e2e_ns(r) or 0) / NS if r.ok else 0.0 for r in measured],
        "start_times": [r.t_send_ns / NS for r in measured],
        "errors": ["" if r.ok else f"{r.error_kind}: {r.error_detail or ''}".strip() for r in measured],
        "generated_texts": [r.text if r.ok else "" for r in measured],
    }
    if output_tok_s is not None and level.window_s:
        inputs = doc["total_input_tokens"] / level.window_s
        doc["total_token_throughput"] = output_tok_s + inputs
    doc.update(_stats("ttft", [t * 1e3 for t, r in zip(ttfts, measured) if r.ok]))
    doc.update(_stats("tpot", [v for v in (metrics.tpot_ms(r) for r in ok) if v is not None]))
    doc.update(_stats("itl", [g for r in ok for g in metrics.chunk_gaps_ms(r)]))
    doc.update(_stats("e2el", [(metrics.e2e_ns(r) or 0) / 1e6 for r in ok]))
    return doc


def export_vllm(records: Sequence[RequestRecord], levels: Sequence[Summary], out_dir: Path, model: str = "",
                started_at: str = "") -> list[Path]:
    """One `vllm-<tag>.json` per level (`vllm-<tag>-trial<N>.json` when the run has several trials)."""
    ensure_output_dir(out_dir, "export directory")
    trials = {lv.trial for lv in levels}
    paths = []
    for level in levels:
        mine = [r for r in records if r.tag == level.tag and r.trial == level.trial]
        endpoint = "completions" if mine and mine[0].endpoint.endswith("/completions") and "chat" not in \
            mine[0].endpoint else "chat"
        name = f"vllm-{level.tag}" + (f"-trial{level.trial + 1}" if len(trials) > 1 else "") + ".json"
        paths.append(write_output(out_dir / name, json.dumps(level_document(level, mine, model, started_at,
                                                                            endpoint), indent=1) + "\n",
                                  "export file"))
    return paths
