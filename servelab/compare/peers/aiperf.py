"""AIPerf (`aiperf profile`): `profile_export_aiperf.json`, and `profile_export.jsonl` beside it when present.

The summary holds one load level: each metric an object `{unit, avg, p50, p90, …}` (`schema_version` "1.4",
`aiperf_version`), the load in `input_config.phases[]` (`type` concurrency or request_rate, with `concurrency`
or `request_rate`). The JSONL holds one record per request: `metadata` (`request_start_ns`, wall clock;
`benchmark_phase`: "warmup" or "profiling"), `metrics` (`time_to_first_token`, `inter_chunk_latency` as a list,
`output_sequence_length`, `request_latency`, each `{value, unit}`) and `error` when it failed.

Definitions, from aiperf 0.13.0's source (aiperf/metrics/types/):
- TTFT (`ttft_metric.py`): the first *content response* minus the request start. A content response is an SSE
  event whose parsed data is not empty (`record_models.py` `content_responses`): answer text, reasoning
  (`reasoning_content` or `reasoning`, `endpoints/openai_chat.py`) or tool calls; the role-only chunk and the
  usage chunk carry none. Same as servelab's TTFT.
- ITL (`inter_token_latency_metric.py`): per request, (last content response − first) ÷ (output sequence length −
  the first chunk's tokens): a per-request average, whose inverse is `output_token_throughput_per_user`. That
  is servelab's per-request decode tok/s, so the single-stream decode figure is read from its p50.
- Inter-chunk latency (`inter_chunk_latency_metric.py`): every gap between consecutive content responses, one
  sample per chunk: servelab's ITL per chunk, which equals per-token ITL only when every chunk carries one token.
- Output sequence length (`output_sequence_length_metric.py`): output + reasoning tokens, counted by the server's
  `usage` with `--use-server-token-count`, else by aiperf's client tokenizer.
- Output token throughput (`output_token_throughput_metrics.py`, `benchmark_duration_metric.py`): all output
  tokens ÷ (last response − first request start): the ramp-up and the tail in which fewer streams run are in its
  window, which servelab leaves out of a level's throughput.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.compare.peers.common import (Definition, PeerFileError, PeerFormat, PeerInfo, need, number,
                                           numbers, read_json)
from servelab.compare.peers.build import PeerLevel, PeerRequest, peer_run
from servelab.records import Distribution

TOOL = "aiperf"
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1e3, "s": 1e3}
TO_S = {k: v / 1e3 for k, v in TO_MS.items()}


def detect(path: Path, doc: Any) -> bool:
    return isinstance(doc, dict) and ("aiperf_version" in doc or (
        "input_config" in doc and "request_throughput" in doc and "benchmark_duration" in doc))


def _metric(doc: dict, key: str, stat: str, path: Path, to: dict[str, float] | None = None,
            optional: bool = True) -> float | None:
    m = doc.get(key)
    if m is None and optional:
        return None
    m = need(doc, key, dict, path, "the summary")
    value = number(m, stat, path, f"'{key}'", optional=optional)
    if value is None or to is None:
        return value
    unit = m.get("unit", "ms")
    if unit not in to:
        raise PeerFileError(f"{path}: '{key}' is in '{unit}', a unit servelab does not know")
    return value * to[unit]


def _dist(doc: dict, key: str, path: Path, to: dict[str, float] | None) -> Distribution | None:
    """AIPerf's own statistics of a metric as a Distribution, when it has all of them."""
    m = doc.get(key)
    if not isinstance(m, dict) or not all(isinstance(m.get(k), (int, float)) for k in
                                          ("count", "avg", "min", "p50", "p90", "p95", "p99", "max")):
        return None
    f = to.get(m.get("unit", "ms"), 1.0) if to else 1.0
    return Distribution(n=int(m["count"]), mean=m["avg"] * f, min=m["min"] * f, p50=m["p50"] * f, p90=m["p90"] * f,
                        p95=m["p95"] * f, p99=m["p99"] * f, max=m["max"] * f)


def _load_phase(doc: dict) -> tuple[int | None, float | None]:
    config = doc.get("input_config") or {}
    phases = config.get("phases") or []
    for phase in phases:
        if isinstance(phase, dict) and phase.get("kind", "profiling") == "profiling":
            conc = phase.get("concurrency")
            rate = phase.get("request_rate") or phase.get("rate")
            return (int(conc) if isinstance(conc, int) and not isinstance(conc, bool) else None,
                    float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and
                    phase.get("type") != "concurrency" else None)
    loadgen = config.get("loadgen") or {}
    conc = loadgen.get("concurrency")
    return (int(conc) if isinstance(conc, int) else None), None


def _records(path: Path) -> list[PeerRequest]:
    import json

    out: list[PeerRequest] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise PeerFileError(f"{path}:{n}: not valid JSON ({exc})") from None
            if not isinstance(rec, dict):
                raise PeerFileError(f"{path}:{n}: a record should be an object")
            meta = rec.get("metadata") or {}
            if meta.get("benchmark_phase", "profiling") != "profiling" or meta.get("was_cancelled"):
                continue  # warm-up, or cancelled at the end of a timed run
            metrics = rec.get("metrics") or {}
            where = f"{path.name} line {n}"
            ttft = _value(metrics, "time_to_first_token", path, where)
            gaps = metrics.get("inter_chunk_latency")
            gap_list = []
            if gaps is not None:
                unit = TO_MS.get(gaps.get("unit", "ms")) if isinstance(gaps, dict) else None
                if unit is None:
                    raise PeerFileError(f"{path}: {where}: 'inter_chunk_latency' should be {{value: [...], unit}}")
                gap_list = [g * unit for g in numbers(gaps.get("value"), path, f"{where}: inter_chunk_latency")]
            osl = _value(metrics, "output_sequence_length", path, where, to=None)
            start = meta.get("request_start_ns")
            out.append(PeerRequest(ok=not rec.get("error") and ttft is not None, ttft_ms=ttft, gaps_ms=gap_list,
                                   output_tokens=int(osl) if osl is not None else None,
                                   input_tokens=_int(_value(metrics, "input_sequence_length", path, where, None)),
                                   start_ns=start if isinstance(start, int) else None,
                                   e2e_ms=_value(metrics, "request_latency", path, where)))
    return out


def _int(v: float | None) -> int | None:
    return int(v) if v is not None else None


def _value(metrics: dict, key: str, path: Path, where: str, to: dict[str, float] | None = TO_MS) -> float | None:
    m = metrics.get(key)
    if m is None:
        return None
    if not isinstance(m, dict) or "value" not in m:
        raise PeerFileError(f"{path}: {where}: '{key}' should be {{value, unit}}")
    value = number(m, "value", path, f"{where}: '{key}'")
    if to is None:
        return value
    factor = to.get(m.get("unit", "ms"))
    if factor is None:
        raise PeerFileError(f"{path}: {where}: '{key}' is in '{m.get('unit')}', a unit servelab does not know")
    return value * factor


def definitions(server_counted: bool) -> list[Definition]:
    counted = ("output tokens from the server's usage (--use-server-token-count)" if server_counted else
               "output tokens counted by aiperf's client tokenizer, not the server's usage (no "
               "--use-server-token-count)")
    return [
        Definition(key="single.ttft_ms", theirs="time_to_first_token.p50", matches=True,
                   why="first response carrying content (answer, reasoning or tool call; the role-only chunk "
                       "carries none) minus the request start: servelab's TTFT"),
        Definition(key="load.ttft_ms", theirs="time_to_first_token.p50", matches=True,
                   why="the same TTFT, at aiperf's concurrency"),
        Definition(key="single.decode_tok_s", theirs="output_token_throughput_per_user.p50",
                   matches=server_counted,
                   why="per request, (output tokens − the first chunk's) ÷ (last content chunk − first), the "
                       f"inverse of aiperf's ITL: servelab's decode tok/s; {counted}"),
        Definition(key="single.itl_ms", theirs="inter_chunk_latency.p50", matches=False,
                   why="one sample per content chunk (aiperf's inter-chunk latency), where servelab's ITL has one "
                       "per token; they agree only when every chunk carries one token (aiperf's own ITL is a "
                       "per-request average)"),
        Definition(key="peak.output_tok_s", theirs="output_token_throughput", matches=False,
                   why="all output tokens ÷ (last response − first request start): its window includes the "
                       "ramp-up and the tail in which fewer streams run, which servelab leaves out"),
    ]


def load(path: Path, doc: Any):
    if not isinstance(doc, dict):
        raise PeerFileError(f"{path}: an AIPerf export should be a JSON object")
    duration = _metric(doc, "benchmark_duration", "avg", path, TO_S, optional=False)
    conc, rate = _load_phase(doc)
    config = doc.get("input_config") or {}
    endpoint_cfg = config.get("endpoint") or {}
    server_counted = bool(endpoint_cfg.get("use_server_token_count"))
    completed = _metric(doc, "completed_request_count", "avg", path) or _metric(doc, "request_count", "avg", path)
    errors = _metric(doc, "error_request_count", "avg", path) or 0.0
    level = PeerLevel(
        concurrency=conc, rate=rate, ok=int(completed or 0), failed=int(errors),
        requests=int((completed or 0) + errors), duration_s=duration or 0.0,
        ttft_ms=_metric(doc, "time_to_first_token", "p50", path, TO_MS),
        decode_tok_s=_metric(doc, "output_token_throughput_per_user", "p50", path),
        itl_ms=_metric(doc, "inter_chunk_latency", "p50", path, TO_MS),
        e2e_ms=_metric(doc, "request_latency", "p50", path, TO_MS),
        output_tok_s=_metric(doc, "output_token_throughput", "avg", path),
        request_s=_metric(doc, "request_throughput", "avg", path))
    for name, key, to in (("ttft_ms", "time_to_first_token", TO_MS), ("itl_ms", "inter_chunk_latency", TO_MS),
                          ("e2e_ms", "request_latency", TO_MS), ("decode_tok_s", "output_token_throughput_per_user",
                                                                 None)):
        dist = _dist(doc, key, path, to)
        if dist is not None:
            level.dists[name] = dist
    notes = []
    jsonl = path.with_name(path.name.replace("_aiperf.json", ".jsonl")) if path.name.endswith("_aiperf.json") \
        else path.with_name("profile_export.jsonl")
    if jsonl.is_file():
        level.requests_data = _records(jsonl)
        level.timeline = all(r.start_ns is not None for r in level.requests_data)
        notes.append(f"per-request records from {jsonl.name}")
    else:
        notes.append(f"no {jsonl.name} beside it: summary figures only, no interval on its side")
    models = [m.get("name") for m in ((config.get("models") or {}).get("items") or []) if isinstance(m, dict)]
    prompts = ((config.get("datasets") or [{}])[0] or {}).get("prompts") or {}
    workload = ", ".join(x for x in (
        f"endpoint {endpoint_cfg.get('type')}" if endpoint_cfg.get("type") else "",
        f"input ~{prompts['isl'].get('mean'):g} tokens" if isinstance(prompts.get("isl"), dict) else "",
        f"output ~{prompts['osl'].get('mean'):g} tokens" if isinstance(prompts.get("osl"), dict) else "",
        f"extra {endpoint_cfg.get('extra')}" if endpoint_cfg.get("extra") else "") if x)
    if workload:
        notes.append(f"workload: {workload}")
    info = PeerInfo(tool=TOOL, version=doc.get("aiperf_version"), path=str(path), per_request=False,
                    concurrency=conc, definitions=definitions(server_counted), notes=notes)
    where = f"c{conc}" if conc else f"{rate:g} req/s" if rate else "?"
    return peer_run(f"aiperf {where}", info, [level], model=models[0] if models else "",
                    url=(endpoint_cfg.get("urls") or [""])[0] or "")


FORMAT = PeerFormat(name="an AIPerf export (profile_export_aiperf.json)", detect=detect, load=load)
