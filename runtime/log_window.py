"""The training since the last train log line (runtime/trainer.py writes one every
``log_every`` steps and starts a new window)."""

from __future__ import annotations

from typing import Mapping


class LogWindow:
    """The calls since ``start`` (a perf_counter time): the model's summed stats, the summed
    step extras (gradient norm, loss scale...), steps, examples and the seconds the calls
    took. Held-out evaluation and checkpoints are moved out of its wall time (``exclude``):
    they are not training."""

    def __init__(self, start: float):
        self.start = start
        self.stats: dict = {}
        self.extras: dict = {}
        self.steps = 0
        self.examples = 0.0
        self.compute_seconds = 0.0

    def add(self, stats: Mapping[str, float], extras: Mapping[str, float], steps: int,
            examples: float, seconds: float) -> None:
        """A call of the compiled loop: its summed stats and extras, ``steps`` steps on
        ``examples`` examples in ``seconds``."""
        self.stats = {k: self.stats.get(k, 0.0) + v for k, v in stats.items()}
        self.extras = {k: self.extras.get(k, 0.0) + v for k, v in extras.items()}
        self.steps += steps
        self.examples += examples
        self.compute_seconds += seconds

    def exclude(self, seconds: float) -> None:
        """``seconds`` of the wall time since ``start`` were not training."""
        self.start += seconds

    def examples_per_second(self, now: float) -> float:
        return self.examples / max(now - self.start, 1e-9)

    def seconds_per_step(self, now: float) -> float:
        return max(now - self.start, 1e-9) / self.steps

    def extra_means(self) -> dict:
        """The extras averaged over the window's steps, and ``step_time``: the compute
        seconds a step."""
        means = {k: v / self.steps for k, v in self.extras.items()}
        means["step_time"] = self.compute_seconds / self.steps
        return means
