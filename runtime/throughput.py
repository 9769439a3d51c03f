"""Examples per second of a training run, as its train log and summary report them.

What counts as an example: the model's ``examples`` stat when it has one, else a row of the
batch. The stat is an exact count taken from the batch itself: BertPretrainer's counts
instances, on packed rows (tasks/instances/packing.py: up to 3 instances a row) the sum of the
batch's ``next_sentence_weights`` (1 for an instance, 0 for an empty slot), so a packed run
reports instances per second, comparable with an unpacked one; unpacked, and for
BertClassifier, it is the batch's rows.
"""

from __future__ import annotations

from typing import Mapping

from runexp.runtime.log_window import LogWindow

# The model stat that counts the examples a call trained on (runtime/model.py STAT_KEYS).
EXAMPLES_STAT = "examples"


def examples_in(stats: Mapping[str, float], steps: int, batch_size: int) -> float:
    """The examples a call of ``steps`` steps trained on, from its summed ``stats``: the
    model's own count (module docstring), else ``batch_size`` rows a step."""
    if EXAMPLES_STAT in stats:
        return stats[EXAMPLES_STAT]
    return steps * batch_size


class Throughput:
    """The steady-state rate: the calls of the compiled loop after the first, which traces
    and compiles it (seconds to minutes that a long run does not pay again)."""

    def __init__(self):
        self.seconds = 0.0
        self.steps = 0
        self.examples = 0.0

    def add(self, steps: int, examples: float, seconds: float) -> None:
        """A steady call: ``steps`` steps on ``examples`` examples in ``seconds``."""
        self.seconds += seconds
        self.steps += steps
        self.examples += examples

    def examples_per_second(self, window: LogWindow, now: float) -> float:
        """The steady rate; the log window's until a steady call was timed."""
        if self.seconds:
            return self.examples / self.seconds
        return window.examples_per_second(now)

    def seconds_per_step(self, window: LogWindow, now: float) -> float:
        """A step's time at the steady rate (the log window's until one was timed): for the
        ETA, in steps, whatever a step's examples."""
        if self.seconds:
            return self.seconds / self.steps
        return window.seconds_per_step(now)
