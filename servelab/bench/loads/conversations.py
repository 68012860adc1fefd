"""Multi-turn load: simulated users walking through conversations (bench/workloads/conversations.py).

- closed loop (`run_users`): N users; each takes the next conversation not yet started, sends its turns one
  after another (each turn's history holds the answers before it), waits a think time between turns, and takes
  another conversation when one ends, until the level's conversations are all started. A user thinking is not
  sending: think time belongs to the load, not to the server.
- open loop (`run_conversation_starts`): conversations start at the times of an arrival schedule (Poisson, gamma
  or constant, bench/loads/arrivals.py), whatever the server is doing; each then goes on turn by turn as above.
  A conversation's first turn records its scheduled start (`scheduled_ns`), so client lag is measured as in
  any open-loop level; the later turns follow their answers and have no schedule.

A turn that fails ends its conversation (the next turn would have no answer to send back); the turns not sent
leave no record. The level's window runs from its start to its last send; LevelControl (with a budget of every
turn the level plans) says what ended it: `budget` when every turn was sent, `schedule` when conversations ended
early, or a failure rule. Ctrl-C records what was in flight as cancelled, as every load mode does.
"""

from __future__ import annotations

import asyncio
import time

from servelab.bench.sender import Sender
from servelab.bench.loads.arrivals import Arrival, schedule_ns
from servelab.bench.loads.common import Recorder, Target, level_running
from servelab.bench.loads.control import LevelControl
from servelab.bench.loads.open_loop import START_LEAD_NS, sleep_until
from servelab.records import RequestRecord

NS_PER_S = 1_000_000_000


def planned_turns(workload, conversations: int, first: int = 0) -> int:
    return sum(len(workload.conversation(i).turns) for i in range(first, first + conversations))


async def _conversation(client: Sender, workload, target: Target, recorder: Recorder, control: LevelControl,
                        measured: list[RequestRecord], i: int, tag: str, scheduled_ns: int | None = None) -> None:
    conv = workload.conversation(i)
    answers: list[str] = []
    for k in range(len(conv.turns)):
        if k:
            await control.pause(workload.think.draw(workload.seed, i, k))
        if not control.may_send():
            return
        spec = workload.turn_request(i, conv, k, answers, target.model, index=recorder.take_index(), tag=tag,
                                     accepts_ignore_eos=target.accepts_ignore_eos,
                                     accepts_min_tokens=target.accepts_min_tokens)
        control.sending(time.perf_counter_ns() if scheduled_ns is None or k else scheduled_ns)
        record = await client.send(spec, scheduled_ns=scheduled_ns if k == 0 else None)
        recorder.add(record)
        measured.append(record)
        control.finished(record)
        if not record.ok:
            return
        answers.append(workload.next_history(conv, k, record.text))


async def run_users(client: Sender, workload, target: Target, recorder: Recorder, *, users: int,
                    conversations: int, tag: str, control: LevelControl | None = None, first: int = 0
                    ) -> tuple[list[RequestRecord], tuple[int, int]]:
    """Closed loop: `users` users share `conversations` conversations (numbered first..first+conversations-1)."""
    control = control or LevelControl(None, duration_s=None,
                                      max_requests=planned_turns(workload, conversations, first))
    next_conversation = 0

    async def user() -> None:
        nonlocal next_conversation
        while next_conversation < conversations and control.may_send():
            i = first + next_conversation
            next_conversation += 1
            await _conversation(client, workload, target, recorder, control, measured, i, tag)

    async with level_running(control, recorder, client, time.perf_counter_ns()) as level:
        measured = level.measured
        level.tasks.extend(asyncio.create_task(user()) for _ in range(min(users, conversations)))
        await asyncio.gather(*level.tasks)
        control.end_schedule()
    return measured, control.window()


async def run_conversation_starts(client: Sender, workload, target: Target, recorder: Recorder, *,
                                  rate: float, conversations: int, arrival: Arrival = "poisson",
                                  burstiness: float = 1.0, seed: int = 0, tag: str,
                                  control: LevelControl | None = None, first: int = 0
                                  ) -> tuple[list[RequestRecord], tuple[int, int]]:
    """Open loop: conversation first+i starts at the i-th time of the arrival schedule (`rate` conversations/s)."""
    control = control or LevelControl(None, duration_s=None,
                                      max_requests=planned_turns(workload, conversations, first), open_loop=True)
    offsets = schedule_ns(rate=rate, arrival=arrival, burstiness=burstiness, seed=seed, count=conversations)
    start_ns = time.perf_counter_ns() + START_LEAD_NS
    async with level_running(control, recorder, client, start_ns) as level:
        measured = level.measured
        for i, offset in enumerate(offsets):
            due_ns = start_ns + offset
            await sleep_until(due_ns, control)
            if not control.may_send(due_ns):
                break
            level.tasks.append(asyncio.create_task(_conversation(client, workload, target, recorder, control,
                                                                 measured, first + i, tag, scheduled_ns=due_ns)))
        await asyncio.gather(*level.tasks)
        control.end_schedule()
    return measured, control.window()
