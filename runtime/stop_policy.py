"""When a training run stops before its last step, and how (runtime/trainer.py).

Two causes: SIGTERM (``preemption.PreemptionWatcher``, seen before every step) and the
wall-time deadline (``stop_planner.StopPlanner``, which sizes each call of the loop so that
the last checkpoint is complete before it). A stop saves a checkpoint at the step reached,
unless the deadline leaves no time to complete one (a call overran): it then keeps the
checkpoint before and says which steps the next run trains again. A deadline stop also logs
(and, on gs://, uploads) how many seconds were left when its checkpoint was complete. Then
it raises ``Preempted`` or ``DeadlineReached`` naming the checkpoint a rerun continues from.
"""

from __future__ import annotations

import os
from typing import Callable

from runexp.runtime.checkpoint_cadence import CheckpointCadence
from runexp.runtime.preemption import DeadlineReached, Preempted, PreemptionWatcher
from runexp.runtime.stop_planner import StopPlanner
from runexp.runtime.train_log import RunLog


def refuse_a_start_without_time(planner: StopPlanner | None, step: int,
                                resumed_from: str | None,
                                progress: Callable[[str], None]) -> None:
    """Raises DeadlineReached (nothing trained, nothing to save) if the start-up left no time
    for a step and a checkpoint."""
    if planner is None or planner.next_call_steps(1) > 0:
        return
    error = DeadlineReached(step, resumed_from)
    progress(f"wall-time budget: {planner.seconds_left():.1f} s left when training starts "
             f"(the start-up took the rest), not enough for a step and a checkpoint "
             f"(~{planner.save_seconds:.1f} s) with the {planner.margin_s:.1f} s margin: "
             f"stopping without training or saving anything. {error}")
    raise error


class StopPolicy:
    """Decides the stops of one training run and carries them out (module docstring).

    Args:
      watcher: the PreemptionWatcher the run trains under.
      planner: the deadline's StopPlanner, or None without a deadline.
      checkpoints: the run's CheckpointCadence.
      log: the run's logs.
      progress: reports a progress line.
      start: the step the run started at (where a rerun continues if it saves nothing).
      train_steps, checkpoint_every: the loop's, for the planner's forecast.
    """

    def __init__(self, watcher: PreemptionWatcher, planner: StopPlanner | None,
                 checkpoints: CheckpointCadence, log: RunLog,
                 progress: Callable[[str], None], start: int, train_steps: int,
                 checkpoint_every: int):
        self.watcher = watcher
        self.planner = planner
        self.checkpoints = checkpoints
        self.log = log
        self.progress = progress
        self.start = start
        self.train_steps = train_steps
        self.checkpoint_every = checkpoint_every
        self._forecast_made = False

    def on_signal(self, step: int) -> None:
        """Stops at ``step`` if SIGTERM arrived."""
        if self.watcher.requested:
            self.stop(Preempted, step, reason=self.watcher.requested)

    def interrupted(self, step: int) -> None:
        """A call ran no step: SIGTERM came before its first. Stops."""
        self.stop(Preempted, step, reason=self.watcher.requested or "SIGTERM")

    def call_steps(self, wanted: int, step: int) -> int:
        """How many of the ``wanted`` steps the next call runs; stops at the deadline when
        not one fits."""
        if self.planner is None:
            return wanted
        n = self.planner.next_call_steps(wanted)
        if n == 0:
            self.stop(DeadlineReached, step)
        return n

    def record_call(self, steps: int, seconds: float, tracing: bool, step: int) -> None:
        """A call (and the host work after it) took ``seconds``; ``tracing``: the first."""
        if self.planner is None:
            return
        self.planner.record_call(steps, seconds, tracing=tracing)
        if not tracing and not self._forecast_made:  # the first steady call: a forecast
            self._forecast_made = True
            self.progress(self.planner.describe(step, self.train_steps, self.checkpoint_every))

    def eval_fits(self) -> bool:
        """Whether a held-out evaluation ends early enough before the deadline."""
        return self.planner is None or self.planner.eval_fits()

    def record_eval(self, seconds: float) -> None:
        if self.planner is not None:
            self.planner.record_eval(seconds)

    def before_checkpoint(self, step: int) -> None:
        """Stops at the deadline if a checkpoint started now would end after it (a call
        overran): the one before is kept."""
        if self.planner is not None and not self.planner.checkpoint_fits():
            self.stop(DeadlineReached, step)

    def seconds_left_at_save(self) -> float | None:
        """For the summary: the seconds before the deadline when the last checkpoint was
        complete (None without a deadline)."""
        if self.planner is None:
            return None
        return round(self.planner.seconds_left_at_save(), 2)

    def stop(self, error_cls: type[Preempted], step: int, **kw) -> None:
        """Saves at ``step`` if it can, then raises ``error_cls`` (module docstring)."""
        at_deadline = error_cls is DeadlineReached
        saved = self.checkpoints.saved_step
        if step != saved and (not at_deadline or self.planner.checkpoint_fits()):
            self.checkpoints.save(step)
        else:  # the checkpoint before is complete once uploaded
            if step != saved:
                self.progress(self._no_time_to_save(step, saved or self.start))
            self.checkpoints.settle()
        self.log.writer.flush()
        kept = self.checkpoints.saved_step
        kept = kept if kept is not None else self.start  # where a rerun resumes
        if at_deadline:
            kw["seconds_left"] = self._deadline_stop_record(kept, step - kept)
        error = error_cls(kept, self.checkpoints.latest, **kw)
        self.progress(str(error))
        raise error

    def _deadline_stop_record(self, step: int, unsaved_steps: int) -> float | None:
        """Logs (and, on gs://, uploads) how much time was left when the last checkpoint of
        this run was complete (None: it wrote none); returns it. ``step``: the checkpoint's,
        ``unsaved_steps``: the steps trained after it that no checkpoint holds."""
        planner = self.planner
        left = planner.seconds_left_at_save() if planner.last_save_done is not None else None
        self.log.event(step, "deadline_stop",
                       deadline_seconds_left=round(left, 2) if left is not None else None,
                       margin_s=round(planner.margin_s, 2),
                       checkpoint=os.path.basename(self.checkpoints.latest or ""),
                       **({"unsaved_steps": unsaved_steps} if unsaved_steps else {}))
        if self.checkpoints.on_checkpoint is not None and planner.seconds_left() > 0:
            try:  # the checkpoint is complete already: a failure costs only this record
                self.checkpoints.sync()
            except Exception as e:  # noqa: BLE001 - reported, then the stop goes on
                self.progress(f"the stop record was not uploaded: {e}")
        return left

    def _no_time_to_save(self, step: int, kept: int) -> str:
        """The line saying why the stop at ``step`` writes no checkpoint (``kept``: the step
        a rerun continues from)."""
        latest = self.checkpoints.latest
        after = f"from {os.path.basename(latest)}" if latest else "from the start"
        redone = f"step {step}" if step == kept + 1 else f"steps {kept + 1}-{step}"
        wait = self.planner.upload_wait_s()
        return (f"wall-time budget: {self.planner.seconds_left():.1f} s left at step {step}, "
                f"not enough to complete a checkpoint (~{self.planner.save_seconds:.1f} s"
                + (f", after {wait:.1f} s of the upload in flight" if wait else "")
                + f"): stopping without one rather than finishing it after the deadline; the "
                f"next run continues {after} and trains {redone} again")
