"""The bench modes of issue 16: multi-turn conversations (`multiturn`) and trace replay (`replay`).

Each is one level, begun and finished by the same steps as every other mode (bench/runner.py begin_level,
bench/plans.py _finish: server metrics, recount, figures, steady state, client-lag warning):
- multiturn, closed loop (no --rate): `users` simulated users share the level's conversations (default one
  each); tag `u<users>`, mode "concurrency" with concurrency = users. Trial t of an experiment runs
  conversations t x count onwards, so no trial finds another's conversations in a cache kept between trials.
- multiturn, open loop (--rate R): conversations start at R per second (arrival process as for rate levels);
  tag `r<R>`, mode "rate" (its `rate` is None: R is in `load.conversation_rate`). Default conversations: R x the
  level duration.
- replay: the trace's requests (the first --requests of them, or all) at their time-scaled arrival times; tag
  `trace`, mode "rate"; `rate` is the mean offered rate. The level's `load` holds the trace's own implied cache
  hit ratio beside the one the engine reported (bench/workloads/traces.py).
Every turn and every trace request is in the level's budget, so the level ends when all were sent (`budget`), or
when conversations ended early (`schedule`: a failed turn ends its conversation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.bench.client import StreamClient
from servelab.bench.loads import Target, rate_tag
from servelab.bench.loads.control import LevelControl
from servelab.bench.loads.conversations import planned_turns, run_conversation_starts, run_users
from servelab.bench.loads.replay import run_trace
from servelab.bench.workloads.conversations import ConversationWorkload
from servelab.bench.workloads.traces import TraceWorkload
from servelab.errors import UserError
from servelab.records import Summary

if TYPE_CHECKING:
    from servelab.bench.runner import BenchState

MODES = ("multiturn", "replay")


async def run_mode(state: BenchState, client: StreamClient, target: Target) -> Summary:
    mode = state.options.mode
    if mode == "multiturn":
        return await multiturn_level(state, client, target)
    if mode == "replay":
        return await replay_level(state, client, target)
    raise UserError(f"unknown mode '{mode}'")


async def multiturn_level(state: BenchState, client: StreamClient, target: Target) -> Summary:
    from servelab.bench.plans import _finish
    from servelab.bench.runner import begin_level, ensure_streams

    opts, plan = state.options, state.options.plan
    workload = opts.workload
    if not isinstance(workload, ConversationWorkload):
        raise UserError("--mode multiturn needs a conversation workload (synthetic, or --dataset of conversations)")
    open_loop = bool(plan.rates)
    users = plan.concurrency
    if open_loop:
        rate = plan.rates[0]
        duration = plan.duration_s or opts.level_duration_s
        count = workload.count or max(1, round(rate * duration))
        tag = rate_tag(rate)
    else:
        rate, count, tag = None, workload.count or users, f"u{users}"
        ensure_streams(state, min(users, count), f"{users} users")
    # Each trial of an experiment runs conversations of its own (trial t: numbers t x count ...), so a server kept up
    # between trials does not find a whole conversation in its cache from the trial before.
    first = opts.trial * count
    budget = planned_turns(workload, count, first)
    load = {"conversations": count, "first_conversation": first, "turns_planned": budget,
            "think_time": workload.think.describe(), "history": workload.history}
    if open_loop:
        load |= {"conversation_rate": rate, "arrival": plan.arrival, "burstiness": plan.burstiness, "seed": plan.seed,
                 "window": "first scheduled start .. last send"}
    else:
        load |= {"users": users, "window": "first send .. last send"}
    state.current_plan = {"mode": "rate" if open_loop else "concurrency", "rate": rate, "load": load}
    await begin_level(state, tag, 0 if open_loop else users)
    control = LevelControl(opts.steady, duration_s=None, max_requests=budget, open_loop=open_loop)
    if open_loop:
        records, window = await run_conversation_starts(client, workload, target, state.recorder, rate=rate,
                                                        conversations=count, arrival=plan.arrival,
                                                        burstiness=plan.burstiness, seed=plan.seed, tag=tag,
                                                        control=control, first=first)
    else:
        records, window = await run_users(client, workload, target, state.recorder, users=users,
                                          conversations=count, tag=tag, control=control, first=first)
    load["sent"] = len(records)
    # No request rate: conversations start at `rate`, their turns follow answers (the steady-state judge's
    # "kept up" compares completions with an offered request rate, which a conversation rate is not).
    return await _finish(state, records, tag=tag, mode="rate" if open_loop else "concurrency",
                         concurrency=0 if open_loop else users, window=window, rate=None, load=load,
                         control=control)


async def replay_level(state: BenchState, client: StreamClient, target: Target) -> Summary:
    from servelab.bench.plans import _finish
    from servelab.bench.runner import begin_level

    opts, plan = state.options, state.options.plan
    workload = opts.workload
    if not isinstance(workload, TraceWorkload):
        raise UserError("--mode replay needs a trace (--dataset FILE with --dataset-format mooncake, azure or "
                        "burstgpt)")
    count = min(plan.requests or len(workload.entries), len(workload.entries))
    offsets = workload.offsets_ns(count)
    span_s = offsets[-1] / 1e9
    rate = (count - 1) / span_s if span_s > 0 else None
    tag = "trace"
    load = {"requests": count, "time_scale": workload.time_scale, "replay_span_s": span_s,
            "mean_rate": rate, "implied_cache_hit_ratio": workload.implied_hit_ratio(count),
            "window": "first scheduled send .. last scheduled send"}
    state.current_plan = {"mode": "rate", "rate": rate, "load": load}
    await begin_level(state, tag, 0)
    control = LevelControl(opts.steady, duration_s=None, max_requests=count, open_loop=True)
    records, window = await run_trace(client, workload, target, state.recorder, count=count, tag=tag,
                                      control=control)
    load["sent"] = len(records)
    return await _finish(state, records, tag=tag, mode="rate", concurrency=0, window=window, rate=rate, load=load,
                         control=control)
