"""multiturn: simulated users walking through conversations whose history grows turn by turn
(bench/loads/conversations.py), as one level.

- closed loop (no --rate): `users` simulated users share the level's conversations (default one each); tag
  `u<users>`, mode "concurrency" with concurrency = users.
- open loop (--rate R): conversations start at R per second (arrival process as for rate levels); tag `r<R>`, mode
  "rate" (its `rate` is None: R is in `load.conversation_rate`). Default conversations: R x the level duration.
Trial t of an experiment runs conversations t x count onwards, so no trial finds another's conversations in a cache
kept between trials. Every turn is in the level's budget, so the level ends when all were sent (`budget`), or when
conversations ended early (`schedule`: a failed turn ends its conversation).
"""

from __future__ import annotations

from servelab.bench.headline import concurrency_peak, rate_peak
from servelab.bench.level_spec import LevelSpec
from servelab.bench.levels import run_level
from servelab.bench.loads import Target, rate_tag
from servelab.bench.loads.control import LevelControl
from servelab.bench.loads.conversations import planned_turns, run_conversation_starts, run_users
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.bench.workloads.conversations import ConversationWorkload
from servelab.errors import UserError
from servelab.records import BenchResult, Figure


@mode("multiturn")
class Multiturn(Mode):
    description = "conversations whose history grows turn by turn"

    def validate(self, options: BenchOptions) -> None:
        if not isinstance(options.workload, ConversationWorkload):
            raise UserError("--mode multiturn needs a conversation workload (synthetic, or --dataset of "
                            "conversations)")

    def peak_streams(self, options: BenchOptions) -> int | None:
        plan = options.plan
        return (plan.max_concurrency or None) if plan.rates else plan.concurrency  # closed loop: one stream per user

    def describe_load(self, options: BenchOptions) -> dict:
        plan = options.plan
        if not plan.rates:
            return plan.describe_bounds() | {"users": plan.concurrency}
        return plan.describe_bounds() | plan.describe_arrivals() | plan.describe_slos()

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return concurrency_peak(result) | rate_peak(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        opts, plan = state.options, state.options.plan
        workload = opts.workload
        open_loop = bool(plan.rates)
        users = plan.concurrency
        streams = None
        if open_loop:
            rate = plan.rates[0]
            duration = plan.duration_s or opts.level_duration_s
            count = workload.count or max(1, round(rate * duration))
            tag = rate_tag(rate)
        else:
            rate, count, tag = None, workload.count or users, f"u{users}"
            streams = (min(users, count), f"{users} users")
        # Each trial of an experiment runs conversations of its own (trial t: numbers t x count ...), so a server
        # kept up between trials does not find a whole conversation in its cache from the trial before.
        first = opts.trial * count
        budget = planned_turns(workload, count, first)
        load = {"conversations": count, "first_conversation": first, "turns_planned": budget,
                "think_time": workload.think.describe(), "history": workload.history}
        if open_loop:
            load |= {"conversation_rate": rate, "arrival": plan.arrival, "burstiness": plan.burstiness,
                     "seed": plan.seed, "window": "first scheduled start .. last send"}
        else:
            load |= {"users": users, "window": "first send .. last send"}
        control = LevelControl(opts.steady, duration_s=None, max_requests=budget, open_loop=open_loop)
        # No request rate: conversations start at `rate`, their turns follow answers (the steady-state judge's
        # "kept up" compares completions with an offered request rate, which a conversation rate is not).
        spec = LevelSpec(tag=tag, mode="rate" if open_loop else "concurrency", concurrency=0 if open_loop else users,
                         load=load, control=control, streams=streams)

        async def generate():
            if open_loop:
                records, window = await run_conversation_starts(
                    client, workload, target, state.recorder, rate=rate, conversations=count, arrival=plan.arrival,
                    burstiness=plan.burstiness, seed=plan.seed, tag=tag, control=control, first=first)
            else:
                records, window = await run_users(client, workload, target, state.recorder, users=users,
                                                  conversations=count, tag=tag, control=control, first=first)
            load["sent"] = len(records)
            return records, window

        await run_level(state, spec, generate)
