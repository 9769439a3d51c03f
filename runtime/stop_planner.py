"""Planning where a training run stops so that its last checkpoint is complete before a
wall-time deadline, from what this run has measured.

The trainer asks before every call of the compiled loop how many steps it may run
(``next_call_steps``; 0 = stop now and save), and reports what each call, held-out
evaluation and checkpoint really took (``record_call``, ``record_eval``, ``record_save``).
The rule:

- keep free the margin (compiler/wall_time.py) plus one checkpoint at the duration of the
  slowest checkpoint written in this run, its upload on gs:// included (before the first,
  an assumption from the model's size);
- while a checkpoint uploads in the background (``record_upload_started``, until its
  ``record_save``), keep free the rest of that upload too: the final save waits for it
  first. It is expected to take as long as the slowest checkpoint (``save_seconds``);
- a step costs the slowest per-step time of the last ``window`` calls (the host work after
  a call, logging, included), not the last call's: one slow call raises it at once, only a
  whole window of fast ones lowers it again;
- a call may take at most ``shrink`` (half) of the time left beyond that: near the deadline
  calls shrink geometrically, so a call twice as slow as the slowest recent one still ends
  before the margin is touched, and the margin is left for what nobody measured;
- stop when not even one step fits. The first call (tracing and compiling) runs one step,
  and so does the second, which times a steady step: nothing measured can bound it but the
  first call, which tracing makes many times longer than a step (seconds to minutes), so
  that one step is taken whenever anything is spare, with the margin as its cover;
- start a checkpoint only if it is expected to be complete before the deadline
  (``checkpoint_fits``: the rest of the upload in flight, then one as slow as the slowest
  so far; the margin is the cover for one slower than that, not a condition). A call that
  overran (the tracing call of a run whose start-up left little time, on a busy machine)
  can leave less: the stop then keeps the checkpoint before, complete, rather than
  finishing a new one after the deadline.

Time comes from ``clock`` (``time.time`` by default: the deadline is an absolute
time.time()); tests pass a fake one.

Usage:
    planner = StopPlanner(deadline, margin_s=300.0, assumed_save_s=30.0)
    while training:
        n = planner.next_call_steps(wanted)
        if n == 0:
            if planner.checkpoint_fits():
                save()
            raise DeadlineReached(..., seconds_left=planner.seconds_left_at_save())
        t0 = time.perf_counter(); run(n); planner.record_call(n, time.perf_counter() - t0)
"""

from __future__ import annotations

import collections
import time
from typing import Callable

from runexp.compiler import wall_time


# How many of the latest save and evaluation times a planner keeps (StopPlanner.saves).
RECENT = 32


def _keep_recent(values: list, value: float) -> None:
    values.append(value)
    if len(values) > RECENT:
        del values[0]


def format_duration(seconds: float) -> str:
    """h:mm:ss (negative: -h:mm:ss)."""
    sign = "-" if seconds < 0 else ""
    seconds = int(round(abs(seconds)))
    return f"{sign}{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class StopPlanner:
    """Decides the length of each call so the last checkpoint ends before ``deadline``.

    Args:
      deadline: the absolute time (in ``clock``'s terms) by which the last checkpoint must be
        complete.
      margin_s: seconds kept free before the deadline on top of the measured figures.
      assumed_save_s: what a checkpoint is assumed to take before one of this run was timed.
      clock: () -> now, in the deadline's terms.
      window: how many recent calls the step time is the slowest of.
      shrink: the share of the spare time one call may take (0 < shrink <= 1).
    """

    def __init__(self, deadline: float, margin_s: float, assumed_save_s: float,
                 clock: Callable[[], float] = time.time, window: int = 8,
                 shrink: float = 0.5):
        if not 0 < shrink <= 1:
            raise ValueError(f"shrink must be in (0, 1]; got {shrink}")
        self.deadline = float(deadline)
        self.margin_s = max(float(margin_s), 0.0)
        self.assumed_save_s = max(float(assumed_save_s), 0.0)
        self.clock = clock
        self.shrink = shrink
        self._step_times: collections.deque = collections.deque(maxlen=max(int(window), 1))
        self._tracing_s: float | None = None  # the first call's time, per step
        # Seconds the latest checkpoints and held-out evaluations took (at most RECENT of
        # each, for reports), and the slowest of each in this run: the planner's memory and
        # work per call stay the same however long the run.
        self.saves: list[float] = []
        self.evals: list[float] = []
        self.slowest_save: float | None = None
        self.slowest_eval: float | None = None
        self.last_save_done: float | None = None  # clock() when the latest save ended
        self._upload_until: float | None = None  # when the upload in flight should end

    # -- what was measured ----------------------------------------------------------------

    def record_call(self, steps: int, seconds: float, tracing: bool = False) -> None:
        """A call of ``steps`` steps took ``seconds`` (with the host work after it);
        ``tracing``: the first call, which traced and compiled the loop."""
        if steps <= 0:
            return
        if tracing:
            self._tracing_s = seconds / steps
        else:
            self._step_times.append(seconds / steps)

    def record_save(self, seconds: float) -> None:
        """A checkpoint took ``seconds`` (written, and uploaded on gs://); it is complete now
        (a background upload: it has just ended)."""
        self.slowest_save = max(float(seconds), self.slowest_save or 0.0)
        _keep_recent(self.saves, float(seconds))
        self.last_save_done = self.clock()
        self._upload_until = None

    def record_upload_started(self) -> None:
        """A checkpoint was written and its upload goes on in the background while training
        does: until ``record_save`` reports it complete, a stop first waits for it."""
        self._upload_until = self.clock() + self.save_seconds

    def record_eval(self, seconds: float) -> None:
        self.slowest_eval = max(float(seconds), self.slowest_eval or 0.0)
        _keep_recent(self.evals, float(seconds))

    # -- the figures the plan uses --------------------------------------------------------

    @property
    def step_seconds(self) -> float | None:
        """A step's cost: the slowest of the recent steady calls (per step); before one was
        timed, the tracing call's; None before any call."""
        if self._step_times:
            return max(self._step_times)
        return self._tracing_s

    @property
    def save_seconds(self) -> float:
        """A checkpoint's cost: the slowest of this run's, or the assumption before any."""
        return self.slowest_save if self.slowest_save is not None else self.assumed_save_s

    def seconds_left(self) -> float:
        return self.deadline - self.clock()

    def upload_wait_s(self) -> float:
        """What a save would first wait for now: the expected rest of the upload in flight."""
        if self._upload_until is None:
            return 0.0
        return max(self._upload_until - self.clock(), 0.0)

    def spare_s(self) -> float:
        """Seconds left after the margin, one checkpoint and the rest of the upload in flight
        are kept free."""
        return self.seconds_left() - self.margin_s - self.save_seconds - self.upload_wait_s()

    def seconds_left_at_save(self) -> float:
        """Seconds between the end of the latest checkpoint of this run and the deadline
        (now, if this run wrote none)."""
        done = self.last_save_done if self.last_save_done is not None else self.clock()
        return self.deadline - done

    # -- decisions ------------------------------------------------------------------------

    def next_call_steps(self, wanted: int) -> int:
        """How many of the ``wanted`` steps the next call may run; 0: stop now."""
        spare = self.spare_s()
        if wanted <= 0 or spare <= 0:
            return 0
        if not self._step_times:  # the first call traces, the second times a step
            return 1
        step = max(max(self._step_times), 1e-9)
        return max(min(wanted, int(self.shrink * spare // step)), 0)

    def checkpoint_fits(self) -> bool:
        """Whether a checkpoint started now is expected to be complete before the deadline:
        after the rest of the upload in flight (a save waits for it), one as slow as the
        slowest of this run (or the assumption)."""
        return self.seconds_left() >= self.upload_wait_s() + self.save_seconds

    def eval_fits(self) -> bool:
        """Whether a held-out evaluation as slow as the slowest so far still leaves the
        margin and a checkpoint free (the first one is not known: it runs)."""
        return self.slowest_eval is None or self.spare_s() >= self.slowest_eval

    def expected_last_step(self, step: int, train_steps: int, checkpoint_every: int) -> int:
        """The step this run is expected to stop at, from ``step`` and the figures so far."""
        if not self.step_seconds:
            return step
        return wall_time.expected_last_step(
            budget_s=self.seconds_left(), margin_s=self.margin_s,
            step_seconds=self.step_seconds, checkpoint_every=checkpoint_every,
            save_seconds=self.save_seconds, train_steps=train_steps, start_step=step)

    def describe(self, step: int, train_steps: int, checkpoint_every: int) -> str:
        """One progress line: time left, the margin, the figures and the expected last step."""
        last = self.expected_last_step(step, train_steps, checkpoint_every)
        what = "the end" if last >= train_steps else f"step ~{last}"
        return (f"wall-time budget: {format_duration(self.seconds_left())} left, margin "
                f"{format_duration(self.margin_s)}; at {self.step_seconds or 0:.3g} s/step "
                f"and {self.save_seconds:.3g} s/checkpoint training is expected to reach "
                f"{what} before the deadline")
