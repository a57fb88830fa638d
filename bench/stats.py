"""Summary statistics for every benchmark: one definition of a percentile."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (1-99), interpolated between samples and never beyond the largest
    one (statistics.quantiles, inclusive method); NaN for no samples."""
    if not values:
        return math.nan
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary(values: Sequence[float], digits: int = 1) -> dict[str, float]:
    """p50, p95, p99 and max, rounded."""
    return {
        **{f"p{q}": round(percentile(values, q), digits) for q in (50, 95, 99)},
        "max": round(max(values), digits) if values else math.nan,
    }
