"""GuideLLM (`guidellm run --output kind=json`): `benchmarks.json`.

The file (`metadata.guidellm_version`, `benchmarks[]`) holds one benchmark per load: `config.strategy`
(`type_` synchronous, concurrent with `streams`, throughput with `max_concurrency`, constant/poisson with `rate`),
`metrics` (each a distribution per request status: `successful.{mean, median, percentiles.p50, …}`), `duration`,
and `requests.successful[]`, each with `info.timings` (`request_start`, `first_token_iteration`,
`last_token_iteration`, `request_end`, wall-clock seconds) and `output_metrics.total_tokens`.

Definitions, from guidellm 0.8.1's source (guidellm/schemas/request_stats.py):
- TTFT (`time_to_first_token_ms`): first token iteration − request start; a token iteration is a streamed event
  that carried output, reasoning included (`time_to_first_output_token_ms` is the answer-only one). Same as
  servelab's TTFT.
- ITL (`inter_token_latency_ms`): per request, (last token iteration − first) ÷ (output tokens − 1): a
  per-request average, the inverse of servelab's decode tok/s; its distribution is token-weighted, not over each
  gap. So the single-stream decode figure is read from it (1000 ÷ its median) and the ITL row is marked as defined
  differently.
- Output tokens: the server's usage (it asks `stream_options.include_usage` and `continuous_usage_stats`), reasoning
  included; without usage, one per token iteration.
- TPOT (`time_per_output_token_ms`): (last token iteration − request start) ÷ output tokens, TTFT included: not
  servelab's TPOT and not used.
- Output tokens per second: all successful output tokens ÷ the benchmark's duration (first request start to the
  end), ramp-up and tail included, which servelab leaves out of a level's window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.compare.peers.common import Definition, PeerFileError, PeerFormat, PeerInfo, need, number
from servelab.compare.peers.build import PeerLevel, PeerRequest, peer_run
from servelab.records import Distribution

TOOL = "guidellm"


def detect(path: Path, doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list) and (
        "guidellm_version" in (doc.get("metadata") or {}) or any(
            isinstance(b, dict) and b.get("type_") == "generative_benchmark" for b in doc["benchmarks"]))


def _stat(metrics: dict, key: str, path: Path, where: str, stat: str = "median") -> float | None:
    m = metrics.get(key)
    if m is None:
        return None
    m = need(metrics, key, dict, path, where)
    ok = m.get("successful")
    if ok is None:
        return None
    ok = need(m, "successful", dict, path, f"{where}: '{key}'")
    if stat == "median":
        return number(ok, "median", path, f"{where}: '{key}.successful'", optional=True)
    return number(ok, stat, path, f"{where}: '{key}.successful'", optional=True)


def _dist(metrics: dict, key: str, factor: float) -> Distribution | None:
    """GuideLLM's own distribution of a metric over successful requests, when it has every statistic."""
    ok = (metrics.get(key) or {}).get("successful") if isinstance(metrics.get(key), dict) else None
    pct = (ok or {}).get("percentiles") if isinstance(ok, dict) else None
    if not isinstance(pct, dict) or not all(isinstance(ok.get(k), (int, float)) for k in ("count", "mean", "min",
                                                                                          "max")) \
            or not all(isinstance(pct.get(k), (int, float)) for k in ("p50", "p90", "p95", "p99")) or not ok["count"]:
        return None
    return Distribution(n=int(ok["count"]), mean=ok["mean"] * factor, min=ok["min"] * factor,
                        p50=pct["p50"] * factor, p90=pct["p90"] * factor, p95=pct["p95"] * factor,
                        p99=pct["p99"] * factor, max=ok["max"] * factor)


def _strategy(b: dict, path: Path, where: str) -> tuple[int | None, float | None, str]:
    config = need(b, "config", dict, path, where)
    strategy = need(config, "strategy", dict, path, f"{where}: 'config'")
    kind = need(strategy, "type_", str, path, f"{where}: 'config.strategy'")
    if kind == "synchronous":
        return 1, None, kind
    if kind == "concurrent":
        return int(number(strategy, "streams", path, f"{where}: 'config.strategy'")), None, kind
    if kind == "throughput":
        conc = number(strategy, "max_concurrency", path, f"{where}: 'config.strategy'", optional=True)
        return (int(conc) if conc else None), None, kind
    rate = number(strategy, "rate", path, f"{where}: 'config.strategy'", optional=True)
    return None, rate, kind


def _requests(b: dict, path: Path, where: str) -> list[PeerRequest]:
    reqs = b.get("requests") or {}
    out: list[PeerRequest] = []
    for status in ("successful", "errored"):
        items = reqs.get(status) or []
        if not isinstance(items, list):
            raise PeerFileError(f"{path}: {where}: 'requests.{status}' should be a list")
        for i, r in enumerate(items):
            here = f"{where}: requests.{status}[{i}]"
            timings = need(need(r, "info", dict, path, here), "timings", dict, path, f"{here}.info")
            start = number(timings, "request_start", path, f"{here}.info.timings", optional=True)
            first = number(timings, "first_token_iteration", path, f"{here}.info.timings", optional=True)
            last = number(timings, "last_token_iteration", path, f"{here}.info.timings", optional=True)
            end = number(timings, "request_end", path, f"{here}.info.timings", optional=True)
            tokens = number(r.get("output_metrics") or {}, "total_tokens", path, f"{here}.output_metrics",
                            optional=True)
            ok = status == "successful" and start is not None and first is not None
            gaps = [(last - first) * 1e3] if ok and last is not None and last > first else []
            out.append(PeerRequest(ok=ok, ttft_ms=(first - start) * 1e3 if ok else None, gaps_ms=gaps,
                                   output_tokens=int(tokens) if tokens is not None else None,
                                   start_ns=round(start * 1e9) if start is not None else None,
                                   e2e_ms=(end - start) * 1e3 if end is not None and start is not None else None))
    return out


DEFINITIONS = [
    Definition(key="single.ttft_ms", theirs="time_to_first_token_ms.successful.median", matches=True,
               why="first streamed event that carried tokens (reasoning included) minus the request start: "
                   "servelab's TTFT"),
    Definition(key="load.ttft_ms", theirs="time_to_first_token_ms.successful.median", matches=True,
               why="the same TTFT, at guidellm's concurrency"),
    Definition(key="single.decode_tok_s", theirs="1000 / inter_token_latency_ms.successful.median", matches=True,
               why="per request, (output tokens − 1) ÷ (last token event − first), output tokens from the "
                   "server's usage: servelab's decode tok/s (guidellm's ITL is its inverse; its median is "
                   "token-weighted, which a single stream of equal lengths does not change)"),
    Definition(key="single.itl_ms", theirs="inter_token_latency_ms.successful.median", matches=False,
               why="a per-request average gap, (last − first token event) ÷ (tokens − 1), token-weighted: "
                   "servelab's ITL is every gap per token, so a stall shows in its tail and not in guidellm's"),
    Definition(key="peak.output_tok_s", theirs="output_tokens_per_second.successful.mean", matches=False,
               why="all successful output tokens ÷ the benchmark's whole duration, ramp-up and tail included, "
                   "which servelab leaves out of a level's window"),
]


def load(path: Path, doc: Any):
    benchmarks = need(doc, "benchmarks", list, path, "the file")
    if not benchmarks:
        raise PeerFileError(f"{path}: 'benchmarks' is empty: guidellm ran no benchmark")
    levels: list[PeerLevel] = []
    kinds = []
    for n, b in enumerate(benchmarks):
        where = f"benchmarks[{n}]"
        if not isinstance(b, dict):
            raise PeerFileError(f"{path}: {where} should be an object")
        conc, rate, kind = _strategy(b, path, where)
        kinds.append(kind)
        metrics = need(b, "metrics", dict, path, where)
        totals = metrics.get("request_totals") or {}
        itl = _stat(metrics, "inter_token_latency_ms", path, where)
        latency_s = _stat(metrics, "request_latency", path, where)  # seconds
        level = PeerLevel(
            concurrency=conc, rate=rate, ok=int(totals.get("successful") or 0),
            failed=int(totals.get("errored") or 0), requests=int(totals.get("total") or 0),
            duration_s=number(b, "duration", path, where, optional=True) or 0.0,
            ttft_ms=_stat(metrics, "time_to_first_token_ms", path, where),
            decode_tok_s=1000.0 / itl if itl else None, itl_ms=itl,
            e2e_ms=latency_s * 1e3 if latency_s is not None else None,
            output_tok_s=_stat(metrics, "output_tokens_per_second", path, where, "mean"),
            request_s=_stat(metrics, "requests_per_second", path, where, "mean"))
        for name, key, factor in (("ttft_ms", "time_to_first_token_ms", 1.0), ("e2e_ms", "request_latency", 1e3),
                                  ("itl_ms", "inter_token_latency_ms", 1.0)):
            dist = _dist(metrics, key, factor)
            if dist is not None:
                level.dists[name] = dist
        level.requests_data = _requests(b, path, where)
        level.timeline = bool(level.requests_data)
        levels.append(level)
    meta = doc.get("metadata") or {}
    backend = (((doc.get("config") or {}).get("spec") or {}).get("backend") or {})
    data = ((((doc.get("config") or {}).get("spec") or {}).get("data") or [{}])[0]) or {}
    notes = [f"workload: {data.get('kind')}" + (f", input {data.get('prompt_tokens')} tokens" if
                                                data.get("prompt_tokens") else "")
             + (f", output {data.get('output_tokens')} tokens" if data.get("output_tokens") else "")
             + (f", {backend.get('request_format')}" if backend.get("request_format") else "")] if data else []
    notes.append("per-request timings: first and last token event of each request (no per-chunk gaps)")
    info = PeerInfo(tool=TOOL, version=meta.get("guidellm_version"), path=str(path), per_request=True,
                    concurrency=max((lv.concurrency or 0 for lv in levels), default=None) or None,
                    definitions=DEFINITIONS, notes=notes)
    label = kinds[0] if len(kinds) == 1 else f"{len(kinds)} benchmarks"
    return peer_run(f"guidellm {label}", info, levels, model=backend.get("model") or "",
                    url=backend.get("target") or "", endpoint=backend.get("request_format") or "/v1/chat/completions")


FORMAT = PeerFormat(name="a GuideLLM benchmarks file", detect=detect, load=load)
