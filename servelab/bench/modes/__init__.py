"""The bench modes, one file each. Importing this package registers every mode, in the order the imports below
give (the order `--mode` lists them in); docs/metrics.md describes each.

    registry      Mode (what a mode declares), @mode, MODES, get_mode
    escalation    the sweeps' stop rule: run levels until throughput stops growing
    single        requests one at a time
    sweep         concurrency 1, 2, 4, … until throughput stops growing
    concurrency   one closed-loop level
    rate          one open-loop level
    rate_sweep    listed rates, or a ramp until throughput stops growing
    slo_search    the highest load that meets the latency targets
    multiturn     conversations, closed or open loop
    replay        a trace's arrival times
    burst         N requests at once

A new mode is one file here with its `@mode(name)` class, and its import below.
"""

from servelab.bench.modes.registry import MODES, Mode, get_mode, mode
from servelab.bench.modes import single  # noqa: F401
from servelab.bench.modes import sweep  # noqa: F401
from servelab.bench.modes import concurrency  # noqa: F401
from servelab.bench.modes import rate  # noqa: F401
from servelab.bench.modes import rate_sweep  # noqa: F401
from servelab.bench.modes import slo_search  # noqa: F401
from servelab.bench.modes import multiturn  # noqa: F401
from servelab.bench.modes import replay  # noqa: F401
from servelab.bench.modes import burst  # noqa: F401
from servelab.bench.state import BenchOptions


def mode_of(options: BenchOptions) -> Mode:
    return get_mode(options.mode)


def streams_needed(options: BenchOptions) -> tuple[int, str] | None:
    """The most concurrent streams a bench's options fix in advance, with the option that asks for them; None
    when only the levels know (a sweep checks each level; open loop without a cap is caught as it runs)."""
    return mode_of(options).streams_needed(options)


__all__ = ["MODES", "Mode", "get_mode", "mode", "mode_of", "streams_needed"]
