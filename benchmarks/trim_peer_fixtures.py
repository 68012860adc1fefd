"""Small copies of the peers' real result files for tests/fixtures/peers (issue 17).

Each keeps its file's shape (every key servelab reads, nested as the tool wrote it) and drops what servelab does
not read and what makes the files large: generated texts are cut to 40 characters, per-request lists keep their
first KEEP requests (the summaries still describe every request, as the tool wrote them), floats keep 6
significant digits (timestamps: microseconds), AIPerf's HTTP-trace and telemetry metrics and GuideLLM's media,
text and scheduler statistics are left out. `python benchmarks/trim_peer_fixtures.py SRC_FILE NAME OUT_DIR`
trims one file; peer_agreement.py --fixtures trims the files of its last round.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

KEEP = 4


def _round(x: Any) -> Any:
    if isinstance(x, float):  # timestamps (epoch or perf_counter seconds) keep microseconds
        return round(x, 6) if abs(x) >= 1000 else float(f"{x:.6g}")
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def trim_vllm(doc: dict) -> dict:
    out = dict(doc)
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
                "generated_texts", "errors"):
        if isinstance(out.get(key), list):
            out[key] = out[key][:KEEP]
    out["generated_texts"] = [t[:40] for t in out.get("generated_texts", [])]
    return out


AIPERF_DROP = ("http_req_", "effective_", "active_", "telemetry_data", "server_metrics", "credit_", "tokens_in_flight",
               "prefill_throughput", "usage_prompt_cache", "total_usage_prompt_cache", "overall_usage")


def trim_aiperf(doc: dict) -> dict:
    out = {k: v for k, v in doc.items() if not k.startswith(AIPERF_DROP)}
    cfg = dict(out.get("input_config") or {})
    for key in ("artifacts", "gpu_telemetry", "server_metrics", "otel", "mlflow", "wandb", "network_latency"):
        cfg.pop(key, None)
    out["input_config"] = cfg
    return out


def trim_aiperf_records(lines: list[str]) -> list[str]:
    out = []
    for line in lines[:KEEP]:
        rec = json.loads(line)
        rec["metrics"] = {k: v for k, v in rec.get("metrics", {}).items() if not k.startswith(AIPERF_DROP)}
        out.append(json.dumps(_round(rec)))
    return out


GUIDELLM_METRICS = ("request_totals", "requests_per_second", "request_latency", "time_to_first_token_ms",
                    "inter_token_latency_ms", "output_tokens_per_second")


def trim_guidellm(doc: dict) -> dict:
    out = dict(doc)
    spec = ((out.get("config") or {}).get("spec") or {})
    if spec:
        backend = {k: v for k, v in (spec.get("backend") or {}).items() if k != "api_routes"}
        out["config"] = {**out["config"], "spec": {"backend": backend, "profile": spec.get("profile"),
                                                   "data": spec.get("data"), "constraints": spec.get("constraints")}}
    benches = []
    for b in out.get("benchmarks", []):
        b = dict(b)
        b["config"] = {k: v for k, v in b["config"].items() if k not in ("warnings", "environment", "backend")}
        b["metrics"] = {k: v for k, v in b["metrics"].items() if k in GUIDELLM_METRICS}
        for name, dist in b["metrics"].items():
            if isinstance(dist, dict) and isinstance(dist.get("successful"), dict):  # the successful requests' distribution only
                b["metrics"][name] = {"successful": {k: v for k, v in dist["successful"].items()
                                                     if k not in ("pdf", "mean_ci", "percentile_cis")}}
        reqs = dict(b.get("requests") or {})
        for status in ("successful", "errored", "incomplete"):
            items = reqs.get(status) or []
            reqs[status] = [{**{k: v for k, v in r.items() if k not in ("input_metrics", "output_metrics", "info")},
                             "request_args": None, "output": (r.get("output") or "")[:40],
                             "info": {"status": (r.get("info") or {}).get("status"),
                                      "timings": (r.get("info") or {}).get("timings")},
                             "input_metrics": {"total_tokens": (r.get("input_metrics") or {}).get("total_tokens")},
                             "output_metrics": {"total_tokens": (r.get("output_metrics") or {}).get("total_tokens")}}
                            for r in items[:KEEP]]
        b["requests"] = reqs
        b.pop("scheduler_state", None)
        benches.append(b)
    out["benchmarks"] = benches
    return out


def trim_file(src: Path, name: str, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = json.loads(src.read_text())
    written = []
    if name.startswith("vllm"):
        dst = out_dir / f"{name}.json"
        dst.write_text(json.dumps(_round(trim_vllm(doc)), indent=1) + "\n")
        written.append(dst)
    elif name.startswith("aiperf"):
        d = out_dir / name
        d.mkdir(exist_ok=True)
        dst = d / "profile_export_aiperf.json"
        dst.write_text(json.dumps(_round(trim_aiperf(doc)), indent=1) + "\n")
        written.append(dst)
        records = src.with_name(src.name.replace("_aiperf.json", ".jsonl"))
        if records.is_file():
            (d / "profile_export.jsonl").write_text("\n".join(trim_aiperf_records(records.read_text().splitlines()))
                                                     + "\n")
            written.append(d / "profile_export.jsonl")
    elif name.startswith("guidellm"):
        dst = out_dir / f"{name}.json"
        dst.write_text(json.dumps(_round(trim_guidellm(doc)), separators=(",", ":")) + "\n")
        written.append(dst)
    else:
        raise SystemExit(f"unknown peer in {name}")
    return written


def trim_all(files: dict[str, Path], out_dir: Path) -> None:
    for name, src in files.items():
        for path in trim_file(src, name, out_dir):
            print(f"fixture {path} ({path.stat().st_size / 1024:.1f} KB)")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    trim_file(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
