"""From the `bench` command's flat options to BenchOptions: which workload, which load plan, and every
combination that makes no sense refused as a UserError (one line, before anything is sent).

Kept out of cli.py so the CLI only parses and renders, and so these rules are tested without a subprocess.

Numbers are bounded as well as checked for sign: a duration, rate or burstiness must be finite, an integer must fit
what engines and JSON carry (MAX_INT), and an open-loop schedule may neither last longer than MAX_SECONDS nor hold
more than MAX_SCHEDULED requests, so `--duration inf`, `--max-tokens 18446744073709551616` or `--rate 1e-9
--requests 2` (a 31-year wait) are one-line usage errors, not internal errors or silent waits.
"""

from __future__ import annotations

from dataclasses import replace

from servelab.bench.args import BenchArgs  # the options' declaration, light enough for the CLI's start
from servelab.bench.client import Deadlines
from servelab.bench.loads.arrivals import ARRIVALS
from servelab.bench.modes import MODES, get_mode
from servelab.bench.plans import LoadPlan
from servelab.bench.slo import parse_slos
from servelab.bench.state import BenchOptions
from servelab.bench.steady import SteadyRule
from servelab.bench.workers import parse_workers
from servelab.bench.workloads import (CHAT, DATASET_FORMATS, OutputSpec, SharedPrefixWorkload,
                                      SyntheticWorkload, Workload, load_dataset, parse_length)
from servelab.bench.workloads.base import STREAM_ENDPOINTS
from servelab.bench.workloads.unary import UNARY_ENDPOINTS, build_unary_workload
from servelab.errors import UserError

DEFAULT_LEVEL_DURATION_S = 10.0
DEFAULT_SINGLE_REQUESTS = 8
DEFAULT_SWEEP_MAX_CONCURRENCY = 64
MAX_INT = 2**31 - 1  # counts and token lengths: what every engine's int32 fields hold
MAX_SEED = 2**63 - 1
MAX_REQUESTS = 10_000_000  # per level: every record of a level is held in memory
MAX_SECONDS = 7 * 24 * 3600.0  # a level, a deadline, a schedule: a week at most
MAX_RATE = 1_000_000.0  # requests/s
MAX_BURSTINESS = 1000.0  # gamma shape: CV 0.03, already constant for every purpose (use --arrival constant)
MAX_SCHEDULED = 10_000_000  # requests one open-loop level may schedule (the schedule is computed up front)


def build_options(a: BenchArgs) -> BenchOptions:
    if a.mode not in MODES:
        raise UserError(f"unknown mode '{a.mode}'", hint=f"use --mode {', '.join(MODES)}")
    if a.endpoint not in (None, *STREAM_ENDPOINTS, *UNARY_ENDPOINTS):
        raise UserError(f"unknown endpoint '{a.endpoint}'", hint="use --endpoint chat, completions, responses, "
                                                                   "messages, embeddings or rerank")
    _positive(requests=a.requests, duration=a.duration, max_tokens=a.max_tokens,
              max_concurrency=a.max_concurrency, concurrency=a.concurrency, prefix_groups=a.prefix_groups,
              prefix_tokens=a.prefix_tokens, prefix_group_size=a.prefix_group_size, min_tokens=a.min_tokens,
              max_rate=a.max_rate, max_probes=a.max_probes, burstiness=a.burstiness)
    warmup = parse_warmup(a.warmup)
    _positive(min_requests=a.min_requests, max_level_duration=a.max_level_duration, timeout_connect=a.timeout_connect,
              timeout_first_byte=a.timeout_first_byte, timeout_idle=a.timeout_idle, timeout_total=a.timeout_total)
    _at_most(MAX_INT, max_tokens=a.max_tokens, max_concurrency=a.max_concurrency, concurrency=a.concurrency,
             prefix_groups=a.prefix_groups, prefix_tokens=a.prefix_tokens, prefix_group_size=a.prefix_group_size,
             min_tokens=a.min_tokens, warmup=warmup, max_probes=a.max_probes, min_requests=a.min_requests)
    _at_most(MAX_REQUESTS, requests=a.requests)
    _at_most(MAX_SEED, seed=a.seed)
    if a.seed < 0:
        raise UserError("--seed must be zero or more")
    _at_most(MAX_SECONDS, duration=a.duration, max_level_duration=a.max_level_duration,
             timeout_connect=a.timeout_connect, timeout_first_byte=a.timeout_first_byte,
             timeout_idle=a.timeout_idle, timeout_total=a.timeout_total, unit=" s (a week)")
    _at_most(MAX_RATE, max_rate=a.max_rate, unit=" requests/s")
    _at_most(MAX_BURSTINESS, burstiness=a.burstiness, unit=" (use --arrival constant for regular arrivals)")
    if a.max_error_rate is not None and not 0 <= a.max_error_rate <= 1:
        raise UserError(f"--max-error-rate is a fraction between 0 and 1 (got {a.max_error_rate:g})")
    if a.max_level_duration is not None and a.duration is not None and a.max_level_duration < a.duration:
        raise UserError(f"--max-level-duration ({a.max_level_duration:g} s) is shorter than --duration "
                        f"({a.duration:g} s)")
    rule = SteadyRule()
    if a.min_requests is not None:
        rule = replace(rule, min_completed=a.min_requests)
    if a.max_level_duration is not None:
        rule = replace(rule, max_level_duration_s=a.max_level_duration)
    slos = parse_slos(a.slo)
    if slos and not get_mode(a.mode).takes_slos:
        raise UserError("latency targets (--slo) apply to --mode concurrency, rate, rate-sweep and slo-search")
    plan = build_plan(a, slos)
    level_duration_s = a.duration or DEFAULT_LEVEL_DURATION_S
    check_schedule(a.mode, plan, rule, level_duration_s)
    options = BenchOptions(mode=a.mode, model=a.model, workload=build_workload(a),
                        single_requests=a.requests or DEFAULT_SINGLE_REQUESTS, warmup=warmup,
                        level_duration_s=level_duration_s,
                        max_concurrency=a.max_concurrency or DEFAULT_SWEEP_MAX_CONCURRENCY, api_key=a.api_key,
                        plan=plan, tokenizer=a.tokenizer, steady=rule,
                        max_error_rate=a.max_error_rate, deadlines=build_deadlines(a),
                        workers=parse_workers(a.workers), ray=check_ray(a.ray, a.workers),
                        gpu=a.gpu, gpu_metrics=check_gpu_metrics(a.gpu_metrics), profile_level=a.profile_level)
    # The mode's own refusals here too, not only when the bench starts: an experiment checks its steps' options
    # through this function before any cell launches an engine.
    get_mode(a.mode).validate(options)
    return options


def check_gpu_metrics(urls: list[str] | None) -> list[str]:
    """--gpu-metrics: an http(s) URL of a DCGM exporter's /metrics. One only: a bench reads one telemetry source,
    whose GPU indices and engine processes are one host's; readings of several hosts would need their GPUs told
    apart, which servelab does not do."""
    out = []
    for url in urls or []:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise UserError(f"bad --gpu-metrics '{url}'", hint="a DCGM exporter's URL, e.g. "
                                                               "http://127.0.0.1:9400/metrics")
        out.append(url)
    if len(set(out)) > 1:
        raise UserError(f"--gpu-metrics given {len(set(out))} URLs: a bench reads one DCGM exporter (the engine's "
                        f"host's)", hint="give the URL of the exporter on the host the engine runs on")
    return list(dict.fromkeys(out))


def parse_warmup(value: int | str | None) -> int | None:
    """--warmup: auto (or not given) is None, the rule of bench/warmup.py; N (zero or more) is N requests, one at a
    time."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return None
        try:
            value = int(text)
        except ValueError:
            raise UserError(f"bad --warmup '{value}'", hint="a number of requests (0: none), or auto") from None
    if value < 0:
        raise UserError("--warmup must be zero or more")
    return value


def check_ray(ray: str | None, workers: str | None) -> str | None:
    """--ray auto|ADDRESS needs --workers (a number, or auto: one per CPU of the cluster but one)."""
    if ray is None:
        return None
    ray = ray.strip()
    if not ray:
        raise UserError("--ray needs auto or a Ray cluster's address (HOST:PORT, or ray://HOST:PORT)")
    if workers is None:
        raise UserError("--ray places worker processes: say how many with --workers N (or --workers auto)")
    return ray


def build_deadlines(a: BenchArgs) -> Deadlines:
    """The per-request deadlines (docs/metrics.md#deadlines): the defaults, with what was given laid over them."""
    given = {"connect_s": a.timeout_connect, "first_byte_s": a.timeout_first_byte, "idle_s": a.timeout_idle,
             "total_s": a.timeout_total}
    return replace(Deadlines(), **{k: v for k, v in given.items() if v is not None})


def check_schedule(mode: str, plan: LoadPlan, rule: SteadyRule, level_duration_s: float) -> None:
    """Refuse an open-loop schedule that would take longer than MAX_SECONDS or hold more than MAX_SCHEDULED
    requests (it is computed, and its requests built, before the level starts), saying how long or how many."""
    rates = get_mode(mode).schedule_rates(plan)
    if rates is None:  # the mode schedules no requests at a rate
        return
    requests, duration = plan.bounds(level_duration_s)
    horizon = rule.cap_s(duration)  # with the steady-state extension, a level may schedule up to its cap
    for rate in rates:
        if horizon is None:  # a request budget without a duration: the schedule lasts as long as it takes
            span_s = (requests - 1) / rate if requests else 0.0
            if span_s > MAX_SECONDS:
                raise UserError(f"--rate {rate:g} with --requests {requests:,} schedules its requests over about "
                                f"{_how_long(span_s)}, more than the {_how_long(MAX_SECONDS)} a level may last",
                                hint="raise the rate, send fewer requests, or bound the level with --duration")
            continue
        count = rate * horizon if requests is None else min(requests, rate * horizon)
        if count > MAX_SCHEDULED:
            raise UserError(f"--rate {rate:g} for levels of up to {horizon:g} s (with the steady-state extension) "
                            f"schedules about {count:,.0f} requests, more than the {MAX_SCHEDULED:,} one level may "
                            f"hold", hint="lower the rate, or bound the level with --requests or a shorter "
                                          "--duration / --max-level-duration")


def _how_long(seconds: float) -> str:
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.3g} {unit}"
    return f"{seconds:,.3g} s"


def build_plan(a: BenchArgs, slos) -> LoadPlan:
    rates = parse_rates(a.rate) if a.rate else []
    if a.mode == "rate" and len(rates) != 1:
        raise UserError("--mode rate needs one --rate (requests/s)", hint="for several, use --mode rate-sweep")
    if a.mode == "multiturn" and len(rates) > 1:
        raise UserError("--mode multiturn takes one --rate (conversations started per second)")
    if a.mode not in ("rate", "rate-sweep", "multiturn") and rates and not (a.mode == "slo-search"
                                                                              and len(rates) == 1):
        raise UserError(f"--rate does not apply to --mode {a.mode}")
    if a.concurrency is not None and a.mode not in ("concurrency", "slo-search"):
        raise UserError(f"--concurrency does not apply to --mode {a.mode}")
    if a.mode == "concurrency" and a.concurrency is None:
        raise UserError("--mode concurrency needs --concurrency N")
    if a.search not in ("rate", "concurrency"):
        raise UserError(f"unknown search dimension '{a.search}'", hint="use --search rate or --search concurrency")
    arrival = a.arrival or ("gamma" if a.burstiness != 1.0 else "poisson")
    if arrival not in ARRIVALS:
        raise UserError(f"unknown arrival process '{arrival}'", hint=f"use --arrival {', '.join(ARRIVALS)}")
    if a.burstiness != 1.0 and arrival != "gamma":
        raise UserError(f"--burstiness applies to gamma arrivals, not {arrival}", hint="use --arrival gamma")
    if a.users is not None and a.mode != "multiturn":
        raise UserError("--users applies to --mode multiturn")
    if a.mode == "multiturn" and rates and a.users is not None:
        raise UserError("--mode multiturn is closed loop with --users N or open loop with --rate R, not both")
    plan = LoadPlan(concurrency=a.users or a.concurrency or 1, rates=rates, arrival=arrival, burstiness=a.burstiness,
                    seed=a.seed, requests=a.requests, duration_s=a.duration,
                    max_rate=a.max_rate, slos=slos, search=a.search, max_probes=a.max_probes)  # type: ignore[arg-type]
    if get_mode(a.mode).schedule_rates(plan) is not None:  # open loop at a rate: --max-concurrency caps it
        plan.max_concurrency = a.max_concurrency
    if a.mode == "slo-search":
        plan.search_start = rates[0] if rates else (a.concurrency if a.search == "concurrency" else None)
        if a.search == "concurrency":
            plan.search_max = a.max_concurrency or DEFAULT_SWEEP_MAX_CONCURRENCY
    return plan


def build_workload(a: BenchArgs):
    from servelab.bench.workloads.answers import with_answer_options  # tools, structured output, when asked for

    text = with_answer_options(build_text_workload(a), a)
    from servelab.bench.workloads.images import with_images  # chat with images, when asked for or in the dataset

    return with_images(text, a)


def build_text_workload(a: BenchArgs):
    if a.endpoint in UNARY_ENDPOINTS or a.batch_size is not None or a.documents is not None:
        return build_unary_workload(a)  # embeddings, rerank: non-streamed (bench/workloads/unary.py)
    endpoint = STREAM_ENDPOINTS.get(a.endpoint or "chat", CHAT)
    output = OutputSpec(max_tokens=a.max_tokens, ignore_eos=a.ignore_eos, min_tokens=a.min_tokens)
    if a.mode in ("multiturn", "replay"):
        from servelab.bench.workloads.multi import build_multi_workload

        return build_multi_workload(a, output)
    for name, given in (("turns", a.turns != 6), ("think-time", a.think_time is not None),
                        ("history", a.history != "server"), ("conversations", a.conversations is not None),
                        ("time-scale", a.time_scale != 1.0), ("block-tokens", a.block_tokens is not None)):
        if given:
            raise UserError(f"--{name} applies to --mode multiturn or replay")
    prefix = a.prefix_groups is not None or a.prefix_tokens is not None
    if a.dataset is not None:
        if a.input_tokens or prefix:
            raise UserError("--dataset cannot be combined with --input-tokens or --prefix-groups/--prefix-tokens")
        if a.dataset_format is not None and a.dataset_format not in DATASET_FORMATS:
            raise UserError(f"unknown dataset format '{a.dataset_format}'",
                            hint=f"use --dataset-format {' or '.join(DATASET_FORMATS)}")
        return load_dataset(a.dataset, a.dataset_format, endpoint=endpoint, output=output,
                            output_from_dataset=a.output_from_dataset, seed=a.seed)
    if a.dataset_format is not None or a.output_from_dataset:
        raise UserError("--dataset-format and --output-from-dataset need --dataset")
    if prefix:
        if a.prefix_groups is None or a.prefix_tokens is None or a.input_tokens is None:
            raise UserError("shared-prefix prompts need --prefix-groups, --prefix-tokens and --input-tokens "
                            "(the whole prompt's length)")
        return SharedPrefixWorkload(input_tokens=parse_length(a.input_tokens), endpoint=endpoint, output=output,
                                    seed=a.seed, groups=a.prefix_groups, per_group=a.prefix_group_size,
                                    prefix_tokens=a.prefix_tokens)
    if a.input_tokens is not None:
        return SyntheticWorkload(input_tokens=parse_length(a.input_tokens), endpoint=endpoint, output=output,
                                 seed=a.seed)
    if a.min_tokens is not None:
        raise UserError("--min-tokens needs a workload that controls lengths: --input-tokens or --dataset")
    return Workload(endpoint=endpoint, max_tokens=a.max_tokens, ignore_eos=a.ignore_eos)


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"bad --rate '{text}'", hint="requests per second, e.g. 4 or 1,2,4,8") from None
    if not rates or any(not r > 0 for r in rates):
        raise UserError(f"bad --rate '{text}': rates must be positive")
    if any(not r <= MAX_RATE for r in rates):
        raise UserError(f"bad --rate '{text}': rates must be finite, at most {MAX_RATE:,.0f} requests/s")
    return rates


def _positive(**values) -> None:
    bad = [name for name, v in values.items() if v is not None and not v > 0]
    if bad:
        raise UserError(f"--{bad[0].replace('_', '-')} must be positive")


def _at_most(limit: float, unit: str = "", **values) -> None:
    """Each given value is at most `limit`, and so finite (inf and nan are refused too)."""
    for name, v in values.items():
        if v is not None and not v <= limit:
            shown = (f"{v:g}" if isinstance(v, float) else f"{v:,}" if v < 10**24
                     else f"{str(v)[:6]}… ({len(str(v))} digits)")
            most = f"{limit:,}" if isinstance(limit, int) else f"{limit:,.0f}"
            raise UserError(f"--{name.replace('_', '-')} {shown} is out of range: at most {most}{unit}")
