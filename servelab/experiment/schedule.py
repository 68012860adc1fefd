"""The order an experiment runs its cells' trials in (docs/metrics.md#trials).

Whatever drifts during an experiment (other work on the machine, CPU frequency, a warming page cache) should hit
every cell alike, so trials of different cells alternate instead of running cell after cell:

- interleaved (default): round by round, each round every cell once, the order reversed every other round
  (A B, B A, A B, …). Reversing balances position: over two rounds each cell has run first and last once, so a
  steady drift cannot favour the cell that always runs first.
- shuffled: each round in its own seeded random order (the same seed, the same schedule).
- blocked: every trial of the first cell, then every trial of the next. It cannot tell drift from a difference
  between cells; use it only when switching between cells is costly (a server that takes minutes to load and
  cannot stay up beside the others) and say so when reading the result.
"""

from __future__ import annotations

import random
from typing import Literal

Order = Literal["interleaved", "shuffled", "blocked"]


def trial_schedule(cells: list[str], trials: int, order: Order = "interleaved", seed: int = 0
                   ) -> list[tuple[str, int]]:
    """(cell, trial index) in the order they run. Every cell gets `trials` trials; trial i of each cell runs in
    round i (except when blocked)."""
    if trials < 1:
        raise ValueError("trials must be at least 1")
    if order == "blocked":
        return [(cell, t) for cell in cells for t in range(trials)]
    rng = random.Random(f"servelab-schedule:{seed}")
    slots: list[tuple[str, int]] = []
    for t in range(trials):
        round_cells = list(cells)
        if order == "shuffled":
            rng.shuffle(round_cells)
        elif t % 2 == 1:
            round_cells.reverse()
        slots += [(cell, t) for cell in round_cells]
    return slots
