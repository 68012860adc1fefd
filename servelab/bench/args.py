"""`servelab bench`'s options, declared once: each field of BenchArgs is one option, with its flag, help text and
default. The command's parameters are built from these fields (cli.py), experiment steps take the same names
(experiment/model.py STEP_KEYS), the Python API validates against them (api.py), and docs/cli.md is generated from
them (scripts/cli_docs.py). The rules between options (which a mode takes, ranges) are bench/options.py's.

Kept apart from bench/options.py, which imports the whole bench, so that `servelab --help` stays fast: this module
imports nothing heavy. The help order is the field order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.cli_options import option


@dataclass
class BenchArgs:
    """The bench command's options as typed (None: not given)."""

    mode: str = option("single", "single (one request at a time), sweep (concurrency 1, 2, 4, … until throughput "
                                 "stops growing), concurrency (one closed-loop level), rate (one open-loop level), "
                                 "rate-sweep (open-loop levels at listed rates, or a ramp until throughput stops growing), slo-search (the highest load that meets --slo), multiturn "
                                 "(conversations whose history grows turn by turn), replay (a trace's arrival times "
                                 "and lengths) or burst (--requests N sent at once).")
    model: str | None = option(None, "Model id to request (default: the first one the server lists).",
                               "--model", "-m")
    requests: int | None = option(None, "Measured requests: in single mode (default 8), or per level in the other "
                                        "modes.")
    max_tokens: int = option(128, "Output tokens per request.")
    duration: float | None = option(None, "Seconds per level (default 10 when --requests is not given).")
    max_concurrency: int | None = option(None, "sweep / slo-search --search concurrency: highest concurrency tried "
                                               "(default 64); rate modes: cap on requests in flight.")
    # Not given on the command line is None: chat, but completions for a trace replay. The API's default is chat.
    endpoint: str | None = option("chat", "chat, completions, responses (OpenAI's Responses API) or messages "
                                          "(Anthropic's), streamed (default chat; replay: completions); embeddings or "
                                          "rerank: non-streamed requests, timed and checked (--batch-size, "
                                          "--documents).", command_default=None)
    batch_size: int | None = option(None, "--endpoint embeddings: inputs per request (default 1), each "
                                          "--input-tokens long.")
    documents: int | None = option(None, "--endpoint rerank: documents per request, scored against one query "
                                         "(default 8), each --input-tokens long.")
    concurrency: int | None = option(None, "Streams for --mode concurrency (slo-search: the first concurrency "
                                           "tried).")
    rate: str | None = option(None, "Requests/s for --mode rate; a list (1,2,4) for rate-sweep (default: a ramp 1, "
                                    "2, 4, …); the first rate tried for slo-search.")  # "4" or "1,2,4"
    arrival: str | None = option(None, "Open-loop arrivals: poisson, gamma or constant (default poisson; gamma "
                                       "when --burstiness is given).")
    burstiness: float = option(1.0, "Gamma shape: 1 = Poisson, < 1 burstier, > 1 more regular.")
    # None or "auto": bench/warmup.py's rule; N: N requests one at a time. The command line gives it as text.
    warmup: int | str | None = option(
        None, "Warm-up before the first level, excluded from every figure: N requests one at a time (0: none), or "
              "auto (the default): as many at once as the highest concurrency the run uses (capped by the server's "
              "slots where it says; open loop: --max-concurrency, else 4), then one alone.", parse_as=str)
    dataset: Path | None = option(None, "Prompts from a file: ShareGPT JSON or JSONL ({\"prompt\"} or "
                                        "{\"messages\"} per line).")
    dataset_format: str | None = option(None, "sharegpt or jsonl (default: from the file extension); replay: "
                                              "mooncake, azure or burstgpt.")
    output_from_dataset: bool = option(False, "Output length from the dataset's answers (ShareGPT's gpt turn, in "
                                              "tokens).")
    input_tokens: str | None = option(None, "Synthetic prompts of exact length after the chat template: N, "
                                            "uniform:MIN..MAX, normal:MEAN,STD[,MIN..MAX] or "
                                            "lognormal:MEAN,STD[,MIN..MAX].")
    prefix_groups: int | None = option(None, "Shared-prefix prompts: number of groups.")
    prefix_tokens: int | None = option(None, "Shared-prefix prompts: tokens each group shares.")
    prefix_group_size: int = option(8, "Shared-prefix prompts: consecutive requests per group.")
    # Chat with images (bench/workloads/images.py): synthetic images added to each request's user message.
    images: str | None = option(None, "Synthetic images per chat request, added after the text: N, or a list "
                                      "(0,1,4) that requests take in turn. A JSONL --dataset's lines may name "
                                      "their own instead (\"images\": [paths]).")
    image_size: str = option("224x224", "Synthetic images' size in pixels: WxH, or a list (224x224,1024x768) taken "
                                        "in turn after every --images count.")
    image_url: str = option("data", "How images are sent: data (base64 data URLs) or file (file:// URLs into "
                                    "--image-dir, which the server must read: llama.cpp --media-path).")
    image_dir: Path | None = option(None, "--image-url file: the directory images are written to, as the server "
                                          "names it.")
    # Multi-turn conversations and trace replay (bench/modes/multiturn.py, replay.py)
    users: int | None = option(None, "multiturn, closed loop: simulated users, each walking through conversations "
                                     "(default 1).")
    turns: int = option(6, "multiturn, synthetic conversations: user turns each (each --input-tokens long, default "
                           "64, after a shared system prompt of --prefix-tokens, default 128).")
    think_time: str | None = option(None, "multiturn: a user's pause between an answer and the next turn, seconds: "
                                          "2, exp:MEAN or uniform:LO..HI (default 0).")
    history: str = option("server", "multiturn: earlier answers sent back as the server gave them (server) or as "
                                    "the dataset recorded them (dataset).")
    conversations: int | None = option(None, "multiturn: conversations per level (default one per user; open "
                                             "loop: rate x duration).")
    time_scale: float = option(1.0, "replay: trace seconds x this = replay seconds (0.1: ten times as fast).")
    block_tokens: int | None = option(None, "replay: prompt tokens per Mooncake hash id (default 512).")
    ignore_eos: bool = option(True, "Ask for exactly --max-tokens tokens (where the engine accepts ignore_eos).")
    min_tokens: int | None = option(None, "Ask for at least this many output tokens (where the engine accepts "
                                          "min_tokens).")
    # Tool calling and structured output (bench/workloads/tools.py, structured.py), on the chat endpoint.
    tools: str | None = option(None, "Tool calling: builtin (three small tools, with prompts that ask for them unless "
                                     "--dataset or --input-tokens gives the prompts) or a JSON file of OpenAI tool "
                                     "definitions, sent with every request; times the streamed tool_calls and checks "
                                     "each call.", metavar="FILE|builtin")
    tool_choice: str | None = option(None, "With --tools: auto, required, none, or a declared tool's name (default: "
                                           "not sent, the server's auto).")
    response_format: str | None = option(None, "Structured output: json_object, or json_schema:FILE (a JSON schema); "
                                               "checks each answer against it.", metavar="json_object|json_schema:FILE")
    schema_field: str = option("response_format", "With --response-format json_schema: the request field that "
                                                  "carries the schema: response_format (OpenAI's), or an engine's own: "
                                                  "guided_json, structured_outputs (vLLM), json_schema (llama.cpp, "
                                                  "SGLang).")
    slo: str | None = option(None, "Latency targets, e.g. ttft_p99_ms=500,itl_p99_ms=50,e2e_p99_ms=10000: goodput "
                                   "per level, and what slo-search must meet.")
    search: str = option("rate", "slo-search: vary the request rate or the concurrency.")
    max_rate: float = option(256.0, "Highest rate a ramp or a search tries (req/s).")
    max_probes: int = option(8, "slo-search: most levels to run.")
    seed: int = option(0, "Seed for arrival times, synthetic prompts and lengths.")
    tokenizer: str = option("auto", "How to count tokens when the server gives no per-chunk counts: auto (the "
                                    "server's /tokenize when it has one), server, none (one per chunk, labelled), or "
                                    "a tokenizer.json path.")
    # Steady state (bench/steady.py) and the error gate
    min_requests: int | None = option(
        None, "Steady state: completed requests a level's window must hold for its throughput to be measured "
              "(default 10); a level runs past --duration until it has them, and lasts 3x their E2E p50.")
    max_level_duration: float | None = option(
        None, "Steady state: the longest a level may run, seconds (default max(4 x duration, 60)); a level it ends "
              "is not measured, and its requests still in flight 2 s later are cancelled.")
    max_error_rate: float | None = option(
        None, "Exit 1 when a level's share of failed requests is above this fraction (default: only when every "
              "request of a level failed).")
    # Per-request deadlines, seconds (None: the defaults of bench/client.py's Deadlines).
    timeout_connect: float | None = option(None, "Per-request deadline, seconds: connecting (default 10).")
    timeout_first_byte: float | None = option(None, "Per-request deadline, seconds: from sending to the first "
                                                    "token (default 120).")
    timeout_idle: float | None = option(
        None, "Per-request deadline, seconds: after the first token, the longest time without an SSE data event; "
              "`: ping` comments do not reset it (default 60).")
    timeout_total: float | None = option(None, "Per-request deadline, seconds: the whole request (default 900).")
    workers: str | None = option(  # "N" or "auto": send from worker processes (bench/workers/)
        None, "Send from this many worker processes (or auto: enough to keep each within what `servelab selftest` "
              "timed accurately), one coordinator owning the schedule and the figures.")
    ray: str | None = option(  # "auto" or a Ray cluster's address: the workers as Ray actors
        None, "Place the --workers as Ray actors on a Ray cluster: auto (the cluster `ray start` made here) or its "
              "address. Needs `pip install servelab[ray]`.")
    gpu_metrics: list[str] | None = option(
        None, "What the GPUs did: a DCGM exporter's /metrics URL to read them from (one: the engine's host's), "
              "after NVML where the engine runs on this host; dcgm-exporter's default local endpoint is tried too.",
        metavar="URL")
    gpu: bool = option(True, "Sample the GPUs during every level (J/token, tokens/J, power, SM activity); --no-gpu "
                             "turns it off.")
    profile_level: str | None = option(
        None, "Run the engine's torch profiler (SGLang, vLLM: POST /start_profile, /stop_profile) around the level "
              "with this tag (single, c8, r4, ...); the trace directory is kept in that level's load.",
        metavar="TAG")
    api_key: str | None = option(None, "Bearer token for the server. Never written anywhere.", "--api-key",
                                 envvar="SERVELAB_API_KEY", show_default=False)


# Options the command line takes as text that a Python value or a YAML file may give as numbers, lists or a mapping.
_NUMBER_AS_TEXT = ("rate", "input_tokens", "workers", "think_time", "images")


def as_command_text(options: dict[str, Any]) -> dict[str, Any]:
    """`options` (named as BenchArgs' fields) with the values an experiment file or a Python call writes as numbers,
    lists or mappings spelt as the command line takes them: rate 4 or [1, 2, 4] -> "4" / "1,2,4", slo {ttft_p99_ms:
    500} or a list of targets -> "ttft_p99_ms=500", input_tokens / workers / think_time 64 -> "64". Anything else is left as it is."""
    out = dict(options)
    for key, value in options.items():
        if isinstance(value, bool):
            continue
        if key == "slo" and isinstance(value, Mapping):
            out[key] = ",".join(f"{k}={v}" for k, v in value.items())
        elif key in ("rate", "slo") and isinstance(value, (list, tuple)):
            out[key] = ",".join(str(v) for v in value)
        elif key in _NUMBER_AS_TEXT and isinstance(value, (int, float)):
            out[key] = str(value)
    return out
