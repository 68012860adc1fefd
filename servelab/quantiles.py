"""The percentile every servelab figure uses, in a module of its own below all of them.

The benchmark figures, the calibration server's account of what it wrote and the compare intervals must all read
a quantile the same way, or a client checked against the calibration server would disagree with it by definition
rather than by measurement (docs/metrics.md).
"""

from __future__ import annotations

import math


def percentile(sorted_values, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), over an ascending sequence."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
