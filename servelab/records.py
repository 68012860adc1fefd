"""The records every part of servelab shares.

Each arrow of the flow (launch -> verify -> bench -> metrics -> store -> report) passes one of these. They are
pydantic models so that `--json`, the run directory and the report all emit the same shapes; every JSON
document servelab writes carries `schema_version`.

Times inside a run are `time.perf_counter_ns()` values (monotonic, only meaningful relative to each other);
wall-clock time appears only in provenance (`started_at`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_serializer, model_validator

from servelab import SCHEMA_VERSION, event_columns
from servelab.redaction import redact_url

# A server URL as recorded: never with the user and password it may have been given (http://u:p@h -> http://***@h).
SafeUrl = Annotated[str, AfterValidator(redact_url)]

# --------------------------------------------------------------------------------------------------------------
# Requests, as they happened
# --------------------------------------------------------------------------------------------------------------

TokenKind = Literal["answer", "reasoning"]

# How the tokens of a stream were counted. Ordered from best to worst; a record says which one it used.
#   server_per_chunk  the server reported a running token count on every chunk (llama.cpp `timings.predicted_n`,
#                     vLLM/SGLang `continuous_usage_stats`), so each event's count is the difference of two counts
#   client_tokenizer  the client tokenized the accumulated text after the run (never chunk by chunk)
#   chunk_count       one token per content-bearing chunk: a last resort, always labelled as such
CountMethod = Literal["server_per_chunk", "client_tokenizer", "chunk_count"]

ErrorKind = Literal[
    "connect",  # connection refused, unknown host
    "http",  # non-2xx status
    "in_band",  # a 200 stream that carried {"error": ...}
    "timeout_connect",
    "timeout_first_byte",
    "timeout_idle",  # the gap between two events exceeded the idle deadline
    "timeout_total",
    "disconnect",  # the connection closed before the stream ended properly
    "parse",  # the body was not what an OpenAI-compatible server sends (HTML, invalid JSON, a malformed chunk)
    "fd_limit",  # the client could not open a socket: its file-descriptor limit (EMFILE/ENFILE), not the server
    "cancelled",  # stopped by the user (Ctrl-C) while in flight
]


class TokenEvent(NamedTuple):
    """One received SSE event that carried generated tokens.

    A plain tuple, not a pydantic model: a long run reads millions of them back (report, compare), and a tuple
    takes ~120 bytes where a model took ~520 (and is built ~10x faster while streaming)."""

    t_ns: int  # receive time (perf_counter_ns), taken right after the socket read that completed the event
    kind: TokenKind
    tokens: int  # tokens this event carried, counted by the record's `count_method`
    text: str = ""


class Usage(BaseModel):
    """The server's own accounting (`usage` object), as reported."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    reasoning_tokens: int | None = None  # SGLang top-level, or vLLM completion_tokens_details.reasoning_tokens
    cached_tokens: int | None = None


class ToolCall(BaseModel):
    """One tool call of a streamed answer, joined from its `delta.tool_calls` pieces (bench/tool_calls.py)."""

    index: int  # the call's `index` in the deltas (parallel calls: 0, 1, ...)
    id: str | None = None
    name: str | None = None  # function.name, as the first piece of the call gave it
    arguments: str = ""  # the function.arguments fragments, joined
    fragments: int = 0  # pieces that carried a non-empty arguments fragment


class RequestRecord(BaseModel):
    """One request as it happened. Every benchmark figure is a pure function of a list of these."""

    index: int
    tag: str = ""  # which load level / phase it belonged to, e.g. "single", "c8"
    warmup: bool = False
    endpoint: str  # e.g. "/v1/chat/completions"
    stream: bool = True
    input_tokens: int | None = None  # prompt tokens as sent, when the workload knows them
    max_tokens: int | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)

    scheduled_ns: int | None = None  # when the load generator meant to send it (open loop); lag = send - scheduled
    t_send_ns: int
    t_headers_ns: int | None = None
    t_end_ns: int | None = None  # end of stream ([DONE], or the last byte)

    events: list[TokenEvent] = Field(default_factory=list)
    count_method: CountMethod = "chunk_count"
    chunks: int = 0  # SSE data events received (including ones with no tokens), [DONE] excluded
    saw_done: bool = False  # it ended with `data: [DONE]` (Responses: response.completed; Messages: message_stop)
    usage: Usage | None = None
    finish_reason: str | None = None

    ok: bool = False
    http_status: int | None = None
    error_kind: ErrorKind | None = None
    error_detail: str | None = None
    # An HTTP 429 or 503 answer's Retry-After, in seconds (at most 600): closed-loop workers wait that long.
    retry_after_s: float | None = None
    # Which trial of its cell the request belonged to (experiments repeat each cell; docs/metrics.md#trials).
    # 0 for a lone bench run and for records written before trials existed.
    trial: int = 0
    # Multi-turn workloads and trace replay (issue 16): which conversation the request belonged to and its turn
    # there (1-based); None for single-turn workloads. The prompt tokens the engine served from its cache are in
    # usage.cached_tokens.
    conversation: int | None = None
    turn: int | None = None
    # Chat with images (bench/workloads/images.py): the images the request carried and their pixels, summed
    # (width x height of each as sent); None for requests without images (docs/metrics.md#images).
    images: int | None = None
    image_sizes: str | None = None  # each image's "WxH" as sent, comma-separated ("?": a size not read)
    image_pixels: int | None = None
    # A non-streamed request (embeddings, rerank; `stream` false): the inputs or documents it carried, what its
    # items/s counts (docs/metrics.md#non-streamed). None for streamed requests.
    items: int | None = None
    # Tool calls (bench/tool_calls.py; docs/metrics.md#tool-calls), all None for a request that declared no tools:
    # the calls as streamed ([]: none made), the arrival of the first tool_calls piece and of the finish_reason that
    # completed them, whether every call's arguments parse as a JSON object, whether every call also names a
    # declared tool and validates against its parameters, and the first problem found.
    tools_declared: int | None = None  # how many tools the request's `tools` declared; None: it had none
    tool_calls: list[ToolCall] | None = None
    t_first_tool_ns: int | None = None
    t_tool_done_ns: int | None = None
    tool_calls_parse: bool | None = None
    tool_calls_valid: bool | None = None
    tool_problem: str | None = None
    # Structured output (docs/metrics.md#structured-output), None for a request that asked for no format: whether
    # the answer's text is the JSON object its response_format (or guided field) promised, and why not.
    schema_valid: bool | None = None
    schema_problem: str | None = None
    # The answer's and the reasoning's whole text, for a record read back from event columns that kept the text
    # once per request rather than per event (servelab/event_columns.py); None while the events carry it.
    kept_text: tuple[str, str] | None = Field(None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _events_from_columns(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("events"), dict):
            data = dict(data)
            data["events"], whole = event_columns.decode(data["events"])
            if whole is not None:
                data["kept_text"] = whole
        return data

    @field_serializer("events", when_used="json")
    def _events_as_columns(self, events: list[TokenEvent], info) -> dict[str, Any]:
        """Written as columns (event_columns.py); each event's text only with the context key `events_text`."""
        per_event = bool(info.context and info.context.get("events_text")) and self.kept_text is None
        return event_columns.encode(events, self.text, self.reasoning_text, per_event)

    # ---- derived views (pure functions of the fields above) ----
    @property
    def output_tokens(self) -> int:
        return sum(e.tokens for e in self.events)

    @property
    def answer_tokens(self) -> int:
        return sum(e.tokens for e in self.events if e.kind == "answer")

    @property
    def reasoning_tokens(self) -> int:
        return sum(e.tokens for e in self.events if e.kind == "reasoning")

    @property
    def text(self) -> str:
        if self.kept_text is not None:
            return self.kept_text[0]
        return "".join(e.text for e in self.events if e.kind == "answer")

    @property
    def reasoning_text(self) -> str:
        if self.kept_text is not None:
            return self.kept_text[1]
        return "".join(e.text for e in self.events if e.kind == "reasoning")


# --------------------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------------------


class Distribution(BaseModel):
    n: int
    mean: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float


class Figure(BaseModel):
    """One number with its meaning attached: the definition's anchor in docs/metrics.md and how it was counted."""

    value: float | None  # the headline value (for a distribution: the statistic the definition names)
    unit: str
    definition: str  # anchor in docs/metrics.md, e.g. "decode-tok-s"
    counted_by: CountMethod | Literal["mixed"] | None = None
    dist: Distribution | None = None
    note: str | None = None


class SpecDecode(BaseModel):
    """Speculative-decoding acceptance over one load level (definitions: docs/metrics.md#spec-decode)."""

    drafted_tokens: float | None = None
    accepted_tokens: float | None = None
    drafts: float | None = None  # verification steps
    acceptance_rate: float | None = None  # accepted / drafted
    mean_accepted_length: float | None = None  # tokens emitted per verification step: 1 + accepted / drafts
    source: str  # e.g. "llamacpp:spec_decode_* counters (/metrics)"


class ServerEvidence(BaseModel):
    """What the server's own Prometheus metrics said about one load level."""

    counters: dict[str, float] = Field(default_factory=dict)  # meaning -> increase over the level
    gauges: dict[str, dict[str, float]] = Field(default_factory=dict)  # meaning -> {mean, max, last} during it
    server_ttft_mean_ms: float | None = None  # from the server's TTFT histogram (sum/count increase)
    client_ttft_mean_ms: float | None = None  # the same requests as the client measured them
    spec_decode: SpecDecode | None = None
    samples: int = 0  # scrapes taken during the level
    notes: list[str] = Field(default_factory=list)


class TopProcess(BaseModel):
    """A process other than servelab and the engine, with the CPU it used over a level (cores)."""

    pid: int
    name: str
    cores: float


class EnvironmentSummary(BaseModel):
    """What the machine did while one load level ran (host/environment.py; docs/metrics.md#environment).

    CPU is in cores (1.0 = one logical CPU busy for the whole level), split into this servelab process (the
    client's own load: its headroom), the engine's process tree when known, and everything else on the host.
    Means are over the level (total CPU time ÷ its duration), maxima over one sampling interval. Every reading is
    optional: None when it could not be taken (no /proc, no NVML, no engine on this host), and files written
    before a field existed still load."""

    samples: int = 0  # readings taken during the level (one at its start and one at its end, at least)
    contended: bool = False  # the contention rule (docs/metrics.md#contended) held during the level
    reasons: list[str] = Field(default_factory=list)  # why it is contended, each with the figure it rests on
    interval_s: float | None = None  # the sampling interval asked for
    duration_s: float | None = None  # first to last reading
    host_cpus: int | None = None  # online logical CPUs
    load1_mean: float | None = None  # 1-minute load average (os.getloadavg), mean and max over the readings
    load1_max: float | None = None
    run_queue_mean: float | None = None  # runnable tasks on the host (/proc/stat procs_running, the sampler
    run_queue_max: float | None = None  # itself excluded), mean and max over the readings
    steal_pct: float | None = None  # CPU steal, % of host CPU time over the level
    iowait_pct: float | None = None  # CPU iowait, % of host CPU time over the level
    host_busy_cores_mean: float | None = None  # all busy CPU on the host (user+nice+system+irq+softirq)
    other_cpu_cores_mean: float | None = None  # host busy − client − engine, clamped at 0
    other_cpu_cores_max: float | None = None
    client_cpu_cores_mean: float | None = None  # this servelab process, all its threads
    client_cpu_cores_max: float | None = None
    engine_cpu_cores_mean: float | None = None  # the engine's process tree; None when it is not on this host
    engine_cpu_cores_max: float | None = None  # or could not be found
    engine_pids: list[int] = Field(default_factory=list)  # the roots of the engine's tree that was watched
    gpu_util_pct_mean: float | None = None  # NVML utilisation, mean over devices and readings; None without NVML
    gpu_clock_mhz_mean: float | None = None  # NVML SM clock, likewise
    top_others: list[TopProcess] = Field(default_factory=list)  # the busiest other processes over the level
    note: str | None = None  # a limit of the readings, e.g. the engine runs here but its process was not visible


# --------------------------------------------------------------------------------------------------------------
# What the GPUs did (host/gpu_telemetry/; docs/metrics.md#gpu)
# --------------------------------------------------------------------------------------------------------------

class GpuReading(BaseModel):
    """One device at one instant, from one telemetry source. Every reading is optional: None when the source
    cannot give it (no energy counter on an older GPU, DCGM without profiling fields), never 0. Counters
    (`energy_mj`, `throttle_ns`, `xid_errors`) are cumulative as the source keeps them; figures take deltas."""

    model_config = ConfigDict(frozen=True)

    t_ns: int  # time.perf_counter_ns() when read, as every time inside a run
    gpu: int  # device index as the source numbers them
    uuid: str | None = None
    name: str | None = None
    sm_active_pct: float | None = None  # GPM SM activity where supported, else NVML/DCGM GPU utilisation
    sm_source: Literal["gpm", "utilization", "dcgm_prof", "dcgm_util", "amdsmi"] | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None  # instantaneous board power
    energy_mj: float | None = None  # total-energy counter since driver load (mJ), cumulative
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: int | None = None  # NVML clocks-event reasons bitmask (idle and app-clock bits included)
    throttle_ns: int | None = None  # cumulative power/thermal violation time (DCGM *_VIOLATION, NVML), ns
    xid_errors: int | None = None  # XID events seen since the source opened (cumulative count; NVML events)
    xid_last: int | None = None  # the last XID code seen (DCGM_FI_DEV_XID_ERRORS gives only this), 0 or None: none
    retired_pages: int | None = None  # pages retired for single + double bit ECC errors (cumulative)
    pcie_tx_bytes_s: float | None = None  # throughput over the last sample period, bytes/s
    pcie_rx_bytes_s: float | None = None
    nvlink_tx_bytes_s: float | None = None
    nvlink_rx_bytes_s: float | None = None
    processes: tuple[int, ...] = ()  # pids computing on the device (NVML running compute processes; a
    # display server's graphics context is not a competitor for the engine's SMs)


class GpuDeviceSummary(BaseModel):
    """One GPU over one level's steady-state window (docs/metrics.md#gpu)."""

    gpu: int
    uuid: str | None = None
    name: str | None = None
    engine: bool = True  # one of the engine's GPUs: counted in the summed figures (docs/metrics.md#gpu-engine)
    samples: int = 0  # readings inside the window
    sm_samples: int = 0  # of them, those with SM activity (what the mean and the idle share are over)
    mem_samples: int = 0  # of them, those with memory used
    energy_j: float | None = None  # delta of the energy counter over the window (a reset or wrap handled: notes)
    energy_from: Literal["counter", "power"] | None = None  # the energy counter, or power readings (trapezoid)
    power_w_mean: float | None = None  # energy ÷ window, however the energy was measured
    power_w_max: float | None = None
    sm_active_pct_mean: float | None = None
    sm_source: str | None = None  # the readings' sm_source ("gpm", "utilization", …)
    mem_used_bytes_mean: float | None = None
    mem_used_bytes_max: int | None = None
    idle_share: float | None = None  # share of the window's readings with SM activity under the idle threshold
    throttle_s: float | None = None  # power/thermal throttle time in the window
    temp_c_max: float | None = None
    xid_errors: int | None = None  # new XID events during the window
    other_pids: list[int] = Field(default_factory=list)  # processes outside the engine's tree holding this GPU


class GpuSummary(BaseModel):
    """What the GPUs did during one level: per device and summed, with the figures per token. When `measured`
    is false, `reason` says why in one line (e.g. "no GPU telemetry source") and nothing else is filled in.
    The summed figures are over the engine's GPUs (`gpus[].engine`)."""

    measured: bool = False
    reason: str | None = None
    source: str | None = None  # "nvml", "dcgm http://127.0.0.1:9400/metrics", "amdsmi"
    interval_s: float | None = None
    window_s: float | None = None
    gpus: list[GpuDeviceSummary] = Field(default_factory=list)
    output_tokens: int | None = None  # the tokens output tok/s counts in the window (what J/token divides by)
    answer_tokens: int | None = None  # the answer tokens among them, where reasoning was counted apart
    energy_j: float | None = None  # summed over the GPUs
    power_w_mean: float | None = None  # summed over the GPUs
    power_w_max: float | None = None  # the largest summed reading
    sm_active_pct_mean: float | None = None  # mean over the GPUs of their means
    idle_share: float | None = None  # over every reading of the GPUs
    j_per_output_token: float | None = None
    j_per_answer_token: float | None = None  # where reasoning tokens were counted apart
    output_tokens_per_j: float | None = None
    # Another process held one of the engine's GPUs: the level measured more than the engine (an experiment runs
    # such a trial again, as for CPU contention). Only that: a GPU at its power cap under full load is the engine's
    # own load, and a fault does not go away on a rerun.
    contended: bool = False
    reasons: list[str] = Field(default_factory=list)  # why it is contended, one sentence each
    # Said loudly with the level's figures, never a reason to drop them: throttling for power or heat, XID errors.
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # limits: a counter reset, a field the source lacks


class SteadyState(BaseModel):
    """Whether a level ran long enough for its aggregate figures to mean something (docs/metrics.md#steady-state).
    When `measured` is false the level's throughput figures have no value and `reason` says why."""

    measured: bool = True
    reason: str | None = None
    completed_in_window: int | None = None  # successful requests that ended inside the window
    min_completed: int | None = None  # N: how many the rule asks for
    latency_multiple: float | None = None  # K: the window must last K x E2E p50
    e2e_p50_s: float | None = None  # of the requests completed in the window (of all that finished, if none did)
    window_s: float | None = None
    # What stopped the level sending: steady (the rule held after its duration), budget (--requests), schedule,
    # cap, failures (its first requests all failed), failing (most had failed when its duration ran out),
    # duration (no rule), interrupted.
    ended_by: str | None = None
    capped: bool = False  # the cap ended it; requests still in flight after a grace were cancelled
    cap_s: float | None = None
    # Open loop: the offered rate and the completions per second in the window; kept_up is false when the
    # completions were below half the offered rate.
    offered_rate: float | None = None
    completed_rate: float | None = None
    kept_up: bool | None = None


class ErrorCount(BaseModel):
    """One kind of failure of a level and how often it happened (docs/metrics.md#errors)."""

    kind: str  # error_kind
    status: int | None = None  # HTTP status, when there was one
    detail: str | None = None  # the first such request's error_detail (a response excerpt for HTTP errors)
    count: int
    # timeout_idle against an engine on this host: what the engine's stacks showed when the first such stream went
    # silent (bench/stall_stacks.py), the same line as the level's warning
    stacks: str | None = None


class TurnFigures(BaseModel):
    """One turn index of a multi-turn level (docs/metrics.md#cache): how long its first token took and how much of
    its prompt the engine served from its cache (bench/cache_figures.py)."""

    turn: int  # 1-based
    requests: int  # successful requests of this turn index
    ttft_ms: Distribution | None = None
    prompt_tokens_mean: float | None = None  # the server's usage.prompt_tokens
    cached_tokens_mean: float | None = None  # the server's usage.cached_tokens, over requests that reported it
    cached_share: float | None = None  # cached ÷ prompt tokens, token-weighted, over requests that reported both


class ImageGroupFigures(BaseModel):
    """The requests of a level that carried one image count and one pixel total (docs/metrics.md#images): how long
    their first token took, and the prompt the server counted for them (bench/image_figures.py)."""

    images: int  # images per request (0: the level's requests without images)
    megapixels: float | None = None  # pixels per request, summed over its images, in millions (None: unknown)
    requests: int  # successful requests of this group
    sizes: str | None = None  # each image's "WxH", comma-separated (None: grouped by image count alone)
    failed: int = 0  # requests of this group that failed (not cancelled ones): none of the figures above count them
    ttft_ms: Distribution | None = None
    prompt_tokens_mean: float | None = None  # the server's usage.prompt_tokens, over requests that reported it


class Summary(BaseModel):
    """The figures for one load level."""

    tag: str
    mode: Literal["single", "concurrency", "rate"]  # rate: open loop at a request rate
    concurrency: int  # closed loop: streams; open loop: the max-concurrency cap, 0 when uncapped
    requests: int  # measured requests sent (warm-up excluded): ok + failed + cancelled
    ok: int
    failed: int  # requests that ended in an error (cancelled ones are not failures)
    errors: dict[str, int] = Field(default_factory=dict)  # error_kind -> count, over the failed requests
    window_s: float  # the measurement window aggregate rates are computed over
    # Requests cut off in flight by an interruption (Ctrl-C), recorded with error_kind "cancelled": neither ok
    # nor failed, outside every figure. Defaults to 0 so files written before the field existed still load.
    cancelled: int = 0
    figures: dict[str, Figure] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    server: ServerEvidence | None = None  # the server's own metrics, when it exposes /metrics
    # Open loop (issue 3): the offered request rate (req/s), and how the load was generated: arrival process,
    # burstiness, seed, request/duration bounds, max-concurrency cap, warm-up (None / empty for closed loop).
    rate: float | None = None
    load: dict[str, Any] = Field(default_factory=dict)
    # With latency targets (issue 3): {"passed", "targets": {key: {"limit_ms", "observed_ms", "passed"}}};
    # see bench/slo.py and docs/metrics.md#slo-level.
    slo: dict[str, Any] | None = None
    # What the machine did during the level (None: not sampled, e.g. files written before it existed).
    environment: EnvironmentSummary | None = None
    # Whether the level reached a steady state; None for files written before the rule existed.
    steady: SteadyState | None = None
    # The most common failures, most frequent first (grouped by kind, status and detail with numbers masked).
    top_errors: list[ErrorCount] = Field(default_factory=list)
    trial: int = 0  # the trial of its cell this level ran in (docs/metrics.md#trials)
    # Multi-turn levels (issue 16): figures per turn index, in turn order; empty for single-turn workloads.
    turns: list[TurnFigures] = Field(default_factory=list)
    # What the GPUs did during the level (None: files written before it existed).
    gpu: GpuSummary | None = None
    # Chat with images: figures per image count and size, fewest images first; empty when no request carried one.
    images: list[ImageGroupFigures] = Field(default_factory=list)


class WorkerProvenance(BaseModel):
    """One load-generating worker of a bench run with --workers or --ray (bench/workers/; docs/metrics.md#clocks):
    where it ran and where its clock stood against the coordinator's. Record times are the worker's own clock
    moved by `applied_offset_ns` (0 when the worker shares the coordinator's clock: same host, same boot)."""

    id: int
    backend: str  # "process" (a child process on this host) or "ray" (a Ray actor)
    host: str | None = None
    pid: int | None = None
    node: str | None = None  # the Ray node it was placed on
    shared_clock: bool = False  # same host and boot as the coordinator: one CLOCK_MONOTONIC
    applied_offset_ns: int = 0  # subtracted from the worker's times: worker clock - coordinator clock
    clock_offset_ns: int | None = None  # measured at the start (ping exchange with the shortest round trip)
    clock_error_ns: int | None = None  # its bound: half that round trip
    clock_offset_end_ns: int | None = None  # measured again at the end (drift = end - start)
    clock_error_end_ns: int | None = None
    requests: int = 0  # requests handed to it
    status: Literal["ok", "died"] = "ok"
    died: str | None = None  # why, when it died


class BenchResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    url: SafeUrl
    model: str
    # single, sweep (concurrency 1, 2, 4, …), and (issue 3) one concurrency level, one rate level, a rate sweep,
    # and the max-load search under SLOs.
    mode: Literal["single", "sweep", "concurrency", "rate", "rate-sweep", "slo-search", "multiturn", "replay",
                  "burst"]
    workload: dict[str, Any]
    levels: list[Summary]
    headline: dict[str, Figure] = Field(default_factory=dict)  # e.g. "single.decode_tok_s", "peak.output_tok_s"
    stop_reason: str | None = None
    interrupted: bool = False
    # slo-search only (issue 3): targets, the dimension searched, the bracket, each probe and the answer.
    search: dict[str, Any] | None = None
    # About the whole bench rather than one level, e.g. a --model the server does not list.
    warnings: list[str] = Field(default_factory=list)
    # The load-generating workers when the bench used --workers or --ray (empty: this process alone).
    workers: list[WorkerProvenance] = Field(default_factory=list)
    # Why the bench was ended early on a busy machine (an experiment's trial, rerun once it is quiet); empty: it
    # was not.
    contended_stop: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------------------------
# Start-up, verdicts, checks
# --------------------------------------------------------------------------------------------------------------


class Phase(BaseModel):
    name: str  # e.g. "initializing", "loading weights", "warm-up", "ready"
    start_s: float  # seconds since launch
    end_s: float | None = None
    progress: float | None = None  # 0..1 when the log says (n/total)
    detail: str | None = None


# "not running" and "no such process" are doctor's: nothing listens and nothing to look at; a pid with no process.
VerdictState = Literal["starting", "loading", "ready", "stalled", "crashed", "not running", "no such process"]


class Verdict(BaseModel):
    state: VerdictState
    reason: str
    evidence: dict[str, Any] = Field(default_factory=dict)


class LintFinding(BaseModel):
    setting: str
    severity: Literal["info", "warn", "serious"]
    why: str


class LaunchResult(BaseModel):
    engine: str
    url: SafeUrl | None
    ready_s: float | None
    phases: list[Phase] = Field(default_factory=list)
    verdict: Verdict
    log_path: str | None = None
    lint: list[LintFinding] = Field(default_factory=list)


CheckOutcome = Literal["pass", "fail", "warn", "skip"]


class CheckResult(BaseModel):
    id: str
    title: str
    outcome: CheckOutcome
    reason: str
    request: dict[str, Any] | None = None
    response_excerpt: str | None = None
    duration_ms: float | None = None


class VerifyResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    url: SafeUrl
    model: str | None
    checks: list[CheckResult]

    @property
    def failed(self) -> bool:
        return any(c.outcome == "fail" for c in self.checks)


# --------------------------------------------------------------------------------------------------------------
# Provenance and the whole run
# --------------------------------------------------------------------------------------------------------------


class HostInfo(BaseModel):
    hostname: str
    os: str
    python: str
    cpu_model: str | None
    cpu_cores_logical: int | None
    cpu_cores_physical: int | None
    ram_bytes: int | None
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    gpu_driver: str | None = None


class Provenance(BaseModel):
    started_at: str  # ISO-8601 wall clock
    servelab_version: str
    servelab_git_revision: str | None = None
    client_event_loop: str | None = None  # "uvloop" or "asyncio": what the bench client ran on
    engine: str | None = None
    engine_version: str | None = None
    command: list[str] | None = None  # exact command line of the engine, secrets redacted
    env: dict[str, str] = Field(default_factory=dict)  # relevant environment, secrets redacted
    model: str | None = None
    model_path: str | None = None
    model_size_bytes: int | None = None
    model_format: str | None = None
    host: HostInfo | None = None
    # How busy the host was when the run began: a short look by the same definitions as a level's environment
    # (docs/metrics.md#environment), the engine's tree excluded once it runs. None: not measured (older files).
    host_load: EnvironmentSummary | None = None
    # Every load-generating worker (--workers, --ray): its host, pid and clock offset. Empty: one process.
    workers: list[WorkerProvenance] = Field(default_factory=list)
    # ssh://… when servelab ran this on another host (`--on`) and copied it back: `host` above is that host.
    ran_on: str | None = None


class Step(BaseModel):
    """One bench of a trial: its name among the experiment's steps ("single", "sweep", "slo-search", "replay", …;
    unique within the trial, so trials pool step by step) and what it measured."""

    name: str
    result: BenchResult


class Steps:
    """What holds a trial's ordered bench steps (a trial; a run as compare sees it): the steps, their benches and
    levels, and `single` / `sweep` for what holds the single-stream bench and a sweep (or what ran in its place)."""

    steps: list[Step]

    def step(self, name: str) -> BenchResult | None:
        return next((s.result for s in self.steps if s.name == name), None)

    @property
    def single(self) -> BenchResult | None:
        return self.step("single")

    @property
    def sweep(self) -> BenchResult | None:
        """The step named sweep, else the first that is not single-stream: where a file from before steps kept
        any other mode (a multi-turn level, `bench --out` of a rate sweep)."""
        return self.step("sweep") or next((s.result for s in self.steps if s.name != "single"), None)

    @property
    def benches(self) -> list[BenchResult]:
        return [s.result for s in self.steps]

    @property
    def levels(self) -> list[Summary]:
        return [s for b in self.benches for s in b.levels]


def steps_of(single: Any = None, sweep: Any = None) -> list[dict[str, Any]]:
    """The steps of a trial written before steps existed, which held `single` and `sweep` (either may be None)."""
    return [{"name": name, "result": result} for name, result in (("single", single), ("sweep", sweep))
            if result is not None]


class Trial(Steps, BaseModel):
    """One pass of a cell's bench steps (by default single-stream, then the sweep) against its server, in order.
    An experiment repeats each cell as several trials, interleaved with the other cells' (docs/metrics.md#trials);
    its records carry the trial's `index` in `RequestRecord.trial`."""

    index: int  # 0-based within the cell; also the round of the experiment's schedule it ran in
    slot: int | None = None  # its position in the experiment's whole schedule (all cells' trials, in run order)
    started_at: str | None = None  # ISO-8601 wall clock
    # contended: stopped early because the machine was busy (experiment/contention.py); it is kept as evidence,
    # never counted, and its round runs again once the machine is quiet.
    status: Literal["complete", "interrupted", "failed", "contended"] = "complete"
    # The round of the schedule this trial stands for when it is a rerun of a contended one (its `index` is then
    # past the planned trials, so records stay apart); None: its own index. Interleaved cells pair by round.
    round: int | None = None
    contention: list[str] = Field(default_factory=list)  # why it was stopped early (status contended)
    # Whether the server's prefix cache was emptied before the trial, and how or why not, in one line ("reset: …"
    # or "not reset: …", bench/cache_reset.py); None: a trial recorded before servelab reset caches.
    cache_reset: str | None = None
    steps: list[Step] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _steps_before_steps(cls, data: Any) -> Any:
        """A trial written before steps existed held exactly `single` and `sweep`: those are its steps."""
        if isinstance(data, dict) and ("single" in data or "sweep" in data):
            data = dict(data)
            single, sweep = data.pop("single", None), data.pop("sweep", None)
            if not data.get("steps"):
                data["steps"] = steps_of(single, sweep)
        return data

    @property
    def round_index(self) -> int:
        return self.index if self.round is None else self.round

    @property
    def contended_levels(self) -> list[Summary]:
        """Levels that measured more than the engine: the machine's CPU was busy with other work, or another
        process held one of the engine's GPUs."""
        return [s for s in self.levels if (s.environment is not None and s.environment.contended)
                or (s.gpu is not None and s.gpu.contended)]


class RunSummary(BaseModel):
    """What `servelab run` writes as summary.json: one cell, measured as one or more trials."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    status: Literal["complete", "interrupted", "failed"]
    error: str | None = None
    provenance: Provenance
    launch: LaunchResult | None = None
    verify: VerifyResult | None = None
    trials: list[Trial] = Field(default_factory=list)
    # Over every trial (the quiet ones when there are any): bench/trials.py pools them by the same definitions.
    headline: dict[str, Figure] = Field(default_factory=dict)
    # Trials whose levels were contended and left out of the headline (bench/trials.py); empty when none were.
    excluded_trials: list[int] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _one_trial_before_trials(cls, data: Any) -> Any:
        """A summary written before trials existed held `single` and `sweep` directly: that was one trial."""
        if isinstance(data, dict) and ("single" in data or "sweep" in data) and not data.get("trials"):
            data = dict(data)
            single, sweep = data.pop("single", None), data.pop("sweep", None)
            data["trials"] = [{"index": 0, "single": single, "sweep": sweep}] if (single or sweep) else []
        return data


# --------------------------------------------------------------------------------------------------------------
# Liveness evidence (issue 4): what a starting engine's process tree, log and port were doing, sampled ~1/s
# --------------------------------------------------------------------------------------------------------------


class EvidenceSample(BaseModel):
    """One look at a starting engine. Counters are cumulative over the process tree; None when unreadable."""

    t_s: float  # seconds since launch (or since `doctor` began watching)
    phase: str | None = None
    progress: float | None = None  # 0..1 from the log (tqdm n/total), when the current phase has one
    log_bytes: int | None = None
    log_lines: int = 0  # lines that can mean progress (heartbeats and our own probes' access lines excluded)
    cpu_s: float | None = None  # user + system CPU time of the tree
    read_bytes: int | None = None  # /proc/<pid>/io read_bytes: what came from storage
    read_chars: int | None = None  # /proc/<pid>/io rchar: every read() syscall, page cache hits included
    rss_bytes: int | None = None
    threads: int | None = None
    thread_states: dict[str, int] = Field(default_factory=dict)  # R, S, D, ... from /proc/<pid>/task/*/stat
    threads_in_futex: int | None = None  # threads whose wchan is a futex wait (idle pools, loaders waiting on I/O)
    processes: int | None = None  # live processes in the tree
    processes_exited: int = 0  # tree members seen earlier that are gone now
    port: Literal["open", "closed"] | None = None
    probe: str | None = None  # the adapter's reading of the readiness probe
    gpu_memory_bytes: int | None = None  # used by the tree's processes (NVML), when a GPU is visible
    gpu_util_percent: float | None = None  # busiest visible GPU


# --------------------------------------------------------------------------------------------------------------
# What every engine process is doing: stacks, read and named (lifecycle/stacks/; docs/engines.md#stacks)
# --------------------------------------------------------------------------------------------------------------

class StackFrame(BaseModel):
    function: str
    module: str | None = None  # the file as py-spy shortens it (package-relative), or the native library
    line: int | None = None
    native: bool = False


class ThreadStack(BaseModel):
    tid: int
    name: str | None = None
    active: bool | None = None  # py-spy's reading: on CPU (or in a GIL-holding call) when sampled
    frames: list[StackFrame] = Field(default_factory=list)  # innermost first
    activity: str | None = None  # the named activity its frames match, e.g. "NCCL all_reduce"


class ProcessStacks(BaseModel):
    """One process of the engine's tree across the samples taken."""

    pid: int
    role: str | None = None  # e.g. "TP3 scheduler", "detokenizer", "HTTP server", from its title or frames
    command: str | None = None  # its command line, redacted
    activity: str = "unknown"  # the process's named activity (its most telling thread's)
    detail: str | None = None  # what in it, e.g. the function ("all_reduce") and library ("NCCL")
    kind: Literal["loading", "idle", "busy", "waiting", "collective", "unknown"] = "unknown"
    moving: bool | None = None  # the stacks changed between samples; None with one sample
    unchanged_s: float | None = None  # how long no thread moved and nothing was read, across the samples
    cpu_percent: float | None = None  # its CPU time over the capture's window (100 = one core); None: unread
    samples: int = 0
    threads: list[ThreadStack] = Field(default_factory=list)  # the last sample's threads
    error: str | None = None  # why this process's stacks could not be read
    line: str = ""  # one readable line, e.g. "TP3 scheduler: in all_reduce (NCCL) for 300 s, stack unchanged"


class StackReport(BaseModel):
    """The stacks of an engine's process tree, read several times, named, and summed up in one line."""

    tool: str | None = None  # e.g. "py-spy 0.4.3"
    samples: int = 0
    interval_s: float | None = None
    processes: list[ProcessStacks] = Field(default_factory=list)
    # loading / idle / busy: what the tree is doing; deadlock: ranks disagree on a collective or all wait on
    # each other with unchanged stacks; stuck: unchanged and not idle; unknown: could not tell
    verdict: Literal["loading", "idle", "busy", "deadlock", "stuck", "unknown"] = "unknown"
    summary: str = ""  # e.g. "8 of 8 ranks loading weights (safetensors), stacks moving: loading, not hung"
    unavailable: str | None = None  # why there are no stacks at all, and how to allow them, in one line
    raw: str | None = None  # the dumps as text (inert, redacted), for --stacks


class Diagnosis(BaseModel):
    """`servelab doctor`: one verdict about a server servelab did not start, with what it rests on."""

    schema_version: int = SCHEMA_VERSION
    engine: str | None = None
    pid: int | None = None
    log_path: str | None = None
    url: SafeUrl | None = None
    verdict: Verdict
    phases: list[Phase] = Field(default_factory=list)
    samples: list[EvidenceSample] = Field(default_factory=list)
    lint: list[LintFinding] = Field(default_factory=list)
    stacks: str | None = None  # the raw dumps (StackReport.raw), with --stacks
    stack_report: StackReport | None = None  # the stacks read and named (none with --no-stacks)
    # Each GPU of this host at the moment of the verdict (doctor reads the GPUs only where the server runs here),
    # and why there are none when there are none ("not measured: no GPU telemetry source (...)").
    gpus: list[GpuReading] = Field(default_factory=list)
    gpus_note: str | None = None
    engine_gpus: list[int] = Field(default_factory=list)  # the devices the engine's processes hold
    notes: list[str] = Field(default_factory=list)
