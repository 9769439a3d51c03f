"""Seed noise: the mean and sample spread of a metric over seeds, and whether two groups'
means differ by more than their seeds vary (the report's ablation tables)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Optional

# The verdict: a group's mean within this many pooled sample standard deviations of the first
# group's is "within seed noise".
NOISE_STDS = 2.0


@dataclasses.dataclass(frozen=True)
class Stat:
    n: int
    mean: float
    std: Optional[float]  # sample (n - 1); None for one value


def stat(values: list) -> Optional[Stat]:
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    return Stat(len(values), statistics.fmean(values), std)


def pooled_std(a: Stat, b: Stat) -> Optional[float]:
    """The two groups' pooled sample standard deviation (None without n - 1 > 0 in all)."""
    dof = (a.n - 1) + (b.n - 1)
    if dof <= 0:
        return None
    return math.sqrt(((a.n - 1) * (a.std or 0.0) ** 2 + (b.n - 1) * (b.std or 0.0) ** 2) / dof)


def verdict(a: Stat, b: Stat) -> tuple[float, Optional[float], str]:
    """(b.mean - a.mean, the pooled std, 'within seed noise' | 'differs' | why neither)."""
    diff = b.mean - a.mean
    pooled = pooled_std(a, b)
    if pooled is None:
        return diff, None, "one seed each: no noise estimate"
    return diff, pooled, ("within seed noise" if abs(diff) <= NOISE_STDS * pooled + 1e-12
                          else "differs")
