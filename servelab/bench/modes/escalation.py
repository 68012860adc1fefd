"""The one rule for a ladder of rising loads (the concurrency sweep, the rate ramp): run levels until throughput
stops growing (docs/metrics.md#peak-output-tok-s).

After each level, the ladder stops when:
- more than half the level's requests failed;
- the level was not measured (a higher load would not be either);
- the level broke its latency targets (only a level with targets has a verdict);
- `patience` levels in a row did not beat the best throughput so far by `min_gain` (one noisy level is not a
  plateau). Throughput is output tok/s; for non-streamed work (embeddings, rerank), which has no output tokens,
  items/s (docs/metrics.md#peak-items-s).
A ladder of loads given as a list (`fixed`) runs every one of them, stopping only on the first rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servelab.bench.steady import is_measured
from servelab.records import Summary


@dataclass
class Escalation:
    min_gain: float
    patience: int
    where: Callable[[Summary], str]  # the level's load, in words: "concurrency 8", "4 req/s"
    higher: str  # why an unmeasured level ends the ladder: "a higher concurrency would be slower still"
    fixed: bool = False  # the loads were listed: run them all
    best: Summary | None = None
    flat: int = 0  # levels in a row that did not beat the best by min_gain

    def stop_reason(self, level: Summary) -> str | None:
        """Why the ladder stops after `level` (None: it goes on)."""
        if level.failed and level.failed > (level.ok + level.failed) / 2:
            return f"more than half the requests failed at {self.where(level)}"
        if self.fixed:
            return None
        if not is_measured(level):
            return f"{self.where(level)} was not measured ({level.steady.reason}); {self.higher}"
        if level.slo is not None and not level.slo["passed"]:
            return f"the latency targets broke at {self.where(level)}"
        key, name = throughput_of(level)
        tput = _value(level, key)
        best = self.best
        best_tput = _value(best, key) if best is not None else 0.0
        if best is not None and tput < best_tput * (1 + self.min_gain):
            self.flat += 1
            if self.flat >= self.patience:
                return (f"{name} stopped growing: {self.flat} level(s) up to {self.where(level)} were not "
                        f"{self.min_gain:.0%} above {best_tput:.1f} at {self.where(best)}")
        else:
            self.flat = 0
        if best is None or tput > best_tput:
            self.best = level
        return None


def throughput_of(level: Summary) -> tuple[str, str]:
    """The figure a ladder climbs on, and its name: output tok/s, or items/s for a non-streamed level (which has
    no output tokens, so no output tok/s figure at all)."""
    if "output_tok_s" not in level.figures and "items_s" in level.figures:
        return "items_s", "items/s"
    return "output_tok_s", "output tok/s"


def _value(level: Summary, key: str) -> float:
    figure = level.figures.get(key)
    return (figure.value or 0.0) if figure is not None else 0.0
