"""A busy machine during an experiment: a contended trial is stopped early and run again once the machine is
quiet, and contention that does not pass ends the experiment with the reason (docs/metrics.md#contended-trials).

The rule that calls a level contended is host/environment.py's; here is only what an experiment does about it:

- A level that other processes or CPU steal kept contended for its first `stop_after_s` seconds ends its trial
  there (a trial measured on a busy machine is left out anyway: measuring it to the end only costs time). The
  client rule does not stop a trial: a saturated client stays saturated when the trial runs again.
- A contended trial, stopped early or run to its end with a contended level, is kept as evidence and never
  counted; its round runs again once the machine has been quiet for `quiet_s` seconds, at most `reruns` times
  per trial, with the wait said in the progress output.
- The machine not quiet within `wait_s`, or contended trials outnumbering the half of the planned trials (most
  of the planned time contended): the experiment stops (MachineBusy), naming the busiest process, and keeps what
  was measured; running it again resumes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from servelab.host.environment import EnvironmentSampler, busy_machine
from servelab.errors import UserError
from servelab.records import EnvironmentSummary, Trial

PROGRESS_S = 10.0  # a line this often while waiting, into a pipe too


class ContentionPolicy(BaseModel):
    """What an experiment does when the machine is busy (experiment files: `contention:`)."""

    model_config = ConfigDict(extra="forbid")

    # A level contended by other processes or CPU steal for this long ends its trial; null: every trial runs to
    # its end (a contended one still runs again).
    stop_after_s: float | None = Field(5.0, gt=0)
    # Times one trial's round may run again; 0: a contended trial is only left out, and nothing stops the run.
    reruns: int = Field(2, ge=0, le=20)
    quiet_s: float = Field(3.0, gt=0)  # how long the machine must be quiet before a rerun
    wait_s: float = Field(60.0, ge=0)  # how long to wait for that before stopping the experiment


class MachineBusy(UserError):
    """The machine stayed busy: the experiment stops early, keeping what it measured."""


@dataclass
class Quiet:
    quiet: bool
    waited_s: float
    last: EnvironmentSummary | None = None  # the last look (evidence for the stop line)


def busy_words(env: EnvironmentSummary | None) -> str:
    """The busy machine in one phrase: the busiest processes if any were seen, else the rule's reasons."""
    if env is None:
        return "no reading"
    named = [p for p in env.top_others if p.cores >= 0.05][:3]
    if named:
        return ", ".join(f"{p.name} pid {p.pid}: {p.cores:.2f} cores" for p in named)
    return "; ".join(env.reasons) or "busy"


def wait_for_quiet(policy: ContentionPolicy, engine_pids: Iterable[int] = (), url: str | None = None, *,
                   say: Callable[[str], None] = lambda line: None) -> Quiet:
    """Look at the machine `quiet_s` at a time until one whole look is quiet (by the level rule, the client's
    own CPU aside: it is idle while waiting), for at most `wait_s`; `say` gets a line every PROGRESS_S."""
    start = time.monotonic()
    last_said = start
    last: EnvironmentSummary | None = None
    sampler = EnvironmentSampler(engine_pids, url=url, thread=False, gpu=False, interval_s=policy.quiet_s)
    try:
        while True:
            sampler.start_level()
            end = time.monotonic() + policy.quiet_s
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(left, 0.5))
                sampler.sample()
            last = sampler.end_level()
            waited = time.monotonic() - start
            if not busy_machine(last):
                return Quiet(True, waited, last)
            if waited >= policy.wait_s:
                return Quiet(False, waited, last)
            if time.monotonic() - last_said >= PROGRESS_S:
                last_said = time.monotonic()
                say(f"  still busy after {waited:.0f} s of {policy.wait_s:.0f} ({busy_words(last)})")
    finally:
        sampler.close()


def needs_rerun(trial: Trial) -> bool:
    """A trial stopped early on a busy machine, or one with a level that other processes or CPU steal made
    contended, or whose engine GPUs another process held. A client that saturated itself is not cured by running
    again: such a trial is only left out."""
    return trial.status == "contended" or any(
        (s.environment is not None and busy_machine(s.environment)) or (s.gpu is not None and s.gpu.contended)
        for s in trial.contended_levels)


@dataclass
class ContentionGuard:
    """The experiment's count of contended trials against its plan, and the reruns each round has had."""

    policy: ContentionPolicy
    planned: int  # trials planned in the whole experiment (every cell's)
    contended: int = 0
    reruns: dict[tuple[str, int], int] = field(default_factory=dict)  # (cell, round) -> reruns so far

    def after_contended(self, cell: str, round_: int, engine_pids: Iterable[int], url: str | None,
                        trial_words: str, say: Callable[[str], None]) -> bool:
        """A trial of `cell` in `round_` was contended: True when it may run again (the machine is quiet now),
        False when reruns are off (`reruns: 0`: it is only left out); raises MachineBusy to stop the experiment."""
        if self.policy.reruns == 0:
            return False
        self.contended += 1
        done = self.reruns.get((cell, round_), 0)
        if self.contended * 2 > self.planned:
            raise MachineBusy(f"the machine was busy for most of the experiment: {self.contended} of "
                              f"{self.planned} planned trials were contended; stopped early, keeping what was "
                              f"measured", hint="run the same command again on a quiet machine to resume")
        if done >= self.policy.reruns:
            raise MachineBusy(f"{trial_words} was contended {done + 1} times; stopped early, keeping what was "
                              f"measured", hint="run the same command again on a quiet machine to resume")
        say(f"machine busy: waiting up to {self.policy.wait_s:.0f} s for {self.policy.quiet_s:.0f} quiet seconds, "
            f"then {trial_words} runs again (rerun {done + 1} of at most {self.policy.reruns})")
        quiet = wait_for_quiet(self.policy, engine_pids, url, say=say)
        if not quiet.quiet:
            raise MachineBusy(f"the machine stayed busy for {quiet.waited_s:.0f} s ({busy_words(quiet.last)}); "
                              f"stopped early before {trial_words} could run again, keeping what was measured",
                              hint="stop the busy process, or run the same command again later to resume")
        self.reruns[(cell, round_)] = done + 1
        say(f"machine quiet after {quiet.waited_s:.0f} s: {trial_words} runs again")
        return True
