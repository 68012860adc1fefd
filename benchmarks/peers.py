"""Drivers for the peer benchmark clients that benchmarks/client_ceiling.py measures servelab against.

Each driver runs one load level (a fixed concurrency, a fixed number of requests) with the peer's own CLI against
an OpenAI-compatible streaming server, then reads the peer's own per-request export and returns a PeerLevel:
its reported throughputs, and the per-gap inter-chunk latencies and per-request TTFTs exactly as it recorded them
(all in milliseconds), so that their distribution can be compared with the gaps the server actually wrote.

    aiperf          `aiperf profile ... --artifact-dir D` writes D/profile_export.jsonl, one record per request:
                    metrics.inter_chunk_latency {value: [gap, ...], unit: "ms"}: the time between consecutive
                    content-bearing responses, so n_tokens - 1 gaps at one token per chunk (the role chunk and
                    the finish/usage chunks are not counted); metrics.time_to_first_token {value, unit: "ms"}
                    (to the first content); `error` (null unless it failed); metadata.benchmark_phase.
                    Throughputs and duration come from D/profile_export_aiperf.json: output_token_throughput
                    (tokens/sec, server-counted with --use-server-token-count), request_throughput
                    (requests/sec), benchmark_duration (sec), error_request_count (present only when > 0).
                    aiperf exits 1 when every request failed.
    vllm bench      `vllm bench serve ... --save-result --save-detailed` writes one JSON with per-request lists
                    in request order: `itls` (gaps, seconds), `ttfts` (seconds), `errors` ("" when it
                    succeeded); and output_throughput (tok/s, usage completion_tokens), request_throughput
                    (req/s), duration (s), completed, failed. It times every chunk whose `choices` is non-empty
                    (vllm/benchmarks/lib/endpoint_request_func.py): its TTFT is the arrival of the chat role
                    chunk (no content), and the role -> first token and last token -> finish_reason chunk
                    intervals are gaps too, so against the calibration server's chat stream it records
                    n_tokens + 1 gaps per request, two of them near zero. They are returned as recorded. It exits 0
                    even when every request failed; the driver raises then.

Gaps and TTFTs of failed requests are left out; `failed` counts them. wall_s is the tool's own benchmark
duration, which leaves out its start-up (aiperf ~7 s, vllm ~15-20 s of imports on a 2-core VM).

Peers are optional and never servelab dependencies: benchmarks/install_peers.sh installs them under .peers/.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = Path(os.environ.get("PEERS_DIR", ROOT / ".peers"))
PEER_EXECUTABLES = {"aiperf": "aiperf", "vllm": "vllm"}
TAIL_LINES = 25
# Lines left out of the output tails in errors: triton's reference-leak report, printed by every vllm exit.
NOISE = ("nanobind:", " - leaked", " - ... skipped remainder", "See https://nanobind")
# The unit strings aiperf writes next to its values, as a factor to milliseconds.
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1e3, "s": 1e3}


@dataclass
class PeerLevel:
    tokens_s: float  # the tool's own reported output token throughput
    requests_s: float  # the tool's own reported request throughput
    gaps_ms: list[float]  # every inter-chunk gap the tool recorded, all requests pooled
    ttft_ms: list[float]  # per-request TTFT as the tool recorded it
    failed: int  # requests the tool reports as failed
    wall_s: float  # wall time of the tool's benchmark phase as the tool reports it (or measured around it)


def find_peers() -> dict[str, str]:
    """Peer name -> executable for the peers installed: $SERVELAB_<NAME>, else .peers/<name>/bin/<exe>, else PATH."""
    found: dict[str, str] = {}
    for name, exe in PEER_EXECUTABLES.items():
        candidates = [os.environ.get(f"SERVELAB_{name.upper()}"), str(PEERS_DIR / name / "bin" / exe),
                      shutil.which(exe)]
        for path in candidates:
            if path and os.path.isfile(path) and os.access(path, os.X_OK):
                found[name] = path
                break
    return found


def whitespace_tokenizer(path: Path) -> Path:
    """A tiny Hugging Face tokenizer folder (one token per word) for peers that insist on one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"a{i}": i + 1 for i in range(4096)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "unk_token": "[UNK]", "model_max_length": 100000}))
    return path


def _run(tool: str, cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> float:
    """Run a peer's CLI with its output in `log`; the wall seconds it took. RuntimeError with the last lines of
    its output if it exits non-zero or runs past `timeout_s` (then its whole process group is killed: aiperf
    runs a dozen worker processes)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        except OSError as exc:
            raise RuntimeError(f"{tool} could not start: {exc}") from exc
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None or rc is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        why = f"ran past {timeout_s:.0f} s" if rc is None else f"exited {rc}"
        raise RuntimeError(f"{tool} {why}; last lines of {log}:\n{_tail(log)}")
    return wall


def _tail(log: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no output)"
    kept = [ln for ln in text.rstrip().splitlines() if not ln.startswith(NOISE)]
    return "\n".join(kept[-lines:]) or "(no output)"


def _ms(metric: dict | None) -> float | list[float] | None:
    """An aiperf {value, unit} metric in milliseconds (a scalar or a list)."""
    if not metric or metric.get("value") is None:
        return None
    factor = TO_MS[metric.get("unit", "ms")]
    value = metric["value"]
    return [v * factor for v in value] if isinstance(value, list) else value * factor


def aiperf_level(exe: str, url: str, conc: int, n_requests: int, osl: int, tokenizer_dir: Path, workdir: Path,
                 timeout_s: float = 900) -> PeerLevel:
    out = workdir / f"aiperf-c{conc}-n{n_requests}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [exe, "profile", "--model", "calibration", "--url", url, "--endpoint-type", "chat", "--streaming",
           "--tokenizer", str(tokenizer_dir), "--concurrency", str(conc), "--request-count", str(n_requests),
           "--isl", "8", "--osl", str(osl), "--use-server-token-count", "--artifact-dir", str(out), "--ui", "none"]
    # With HF_HUB_OFFLINE=1 aiperf 0.13 fails to load a local tokenizer folder (it calls snapshot_download).
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    log = workdir / f"aiperf-c{conc}-n{n_requests}.log"
    measured = _run("aiperf", cmd, log, timeout_s, env)
    records_file, summary_file = out / "profile_export.jsonl", out / "profile_export_aiperf.json"
    if not records_file.is_file() or not summary_file.is_file():
        raise RuntimeError(f"aiperf wrote no {records_file.name} / {summary_file.name} in {out}; last lines of "
                           f"{log}:\n{_tail(log)}")

    gaps: list[float] = []
    ttfts: list[float] = []
    errors = 0
    for line in records_file.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("metadata", {}).get("benchmark_phase", "profiling") != "profiling":
            continue  # warm-up records, if any
        if rec.get("error"):
            errors += 1
            continue
        metrics = rec.get("metrics", {})
        gaps.extend(_ms(metrics.get("inter_chunk_latency")) or [])
        ttft = _ms(metrics.get("time_to_first_token"))
        if ttft is not None:
            ttfts.append(ttft)

    summary = json.loads(summary_file.read_text())

    def avg(name: str) -> float | None:
        m = summary.get(name)
        return m.get("avg") if isinstance(m, dict) else None

    duration = avg("benchmark_duration")
    wall = duration * TO_MS[summary["benchmark_duration"].get("unit", "sec")] / 1e3 if duration else measured
    return PeerLevel(tokens_s=float(avg("output_token_throughput") or 0.0),
                     requests_s=float(avg("request_throughput") or 0.0), gaps_ms=gaps, ttft_ms=ttfts,
                     failed=max(errors, int(avg("error_request_count") or 0)), wall_s=float(wall))


def vllm_level(exe: str, url: str, conc: int, n_requests: int, osl: int, tokenizer_dir: Path, workdir: Path,
               timeout_s: float = 900) -> PeerLevel:
    out = workdir / f"vllm-c{conc}-n{n_requests}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    result_name = "result.json"
    cmd = [exe, "bench", "serve", "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
           "--model", "calibration", "--tokenizer", str(tokenizer_dir), "--dataset-name", "random",
           "--random-input-len", "8", "--random-output-len", str(osl), "--num-prompts", str(n_requests),
           "--max-concurrency", str(conc), "--request-rate", "inf", "--ignore-eos", "--seed", "0",
           "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(out),
           "--result-filename", result_name]
    # No hub look-ups for the local tokenizer folder, no usage-stats reporting.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    log = workdir / f"vllm-c{conc}-n{n_requests}.log"
    measured = _run("vllm bench serve", cmd, log, timeout_s, env)
    result_file = out / result_name
    if not result_file.is_file():
        raise RuntimeError(f"vllm bench serve wrote no {result_file}; last lines of {log}:\n{_tail(log)}")
    res = json.loads(result_file.read_text())
    if "itls" not in res or "ttfts" not in res:
        raise RuntimeError(f"{result_file} has no per-request itls/ttfts (was --save-detailed dropped?)")

    gaps: list[float] = []
    ttfts: list[float] = []
    errors = res.get("errors") or [""] * len(res["itls"])
    for itl, ttft, error in zip(res["itls"], res["ttfts"], errors):
        if error:  # a failed request: vllm keeps its slot, with ttft 0 and whatever gaps it got
            continue
        gaps.extend(g * 1e3 for g in itl)  # seconds
        if ttft:
            ttfts.append(ttft * 1e3)
    failed = res.get("failed")
    if failed is None:
        failed = sum(1 for e in errors if e)
    if not res.get("completed"):  # vllm exits 0 even when every request failed (aiperf exits 1)
        first = next((e for e in errors if e), "").strip().splitlines()
        raise RuntimeError(f"vllm bench serve: all {failed} requests failed; the first: "
                           f"{first[-1] if first else '?'}; last lines of {log}:\n{_tail(log)}")
    return PeerLevel(tokens_s=float(res.get("output_throughput") or 0.0),
                     requests_s=float(res.get("request_throughput") or 0.0), gaps_ms=gaps, ttft_ms=ttfts,
                     failed=int(failed), wall_s=float(res.get("duration") or measured))
