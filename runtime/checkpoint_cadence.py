"""The checkpoints a training run writes and how each becomes durable (runtime/trainer.py).

``on_checkpoint`` makes a checkpoint durable (a gs:// run uploads it). A plain callable is
called after each checkpoint is written. One that also has ``start()`` (-> True when the
upload runs in the background), ``poll()`` and ``wait()`` (-> the ended upload with its
``seconds``, or None; raising its error), as ``ctx.sync`` of a gs:// stage has
(gcs_mirror.StageSync), uploads each checkpoint but the last and a stop's in the background
while training goes on: at most one upload in flight (a new checkpoint first waits for the
one before), and an upload's error is raised in the training thread (between two calls of
the loop, at the next checkpoint or at the end).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf

from runexp.runtime.stop_planner import StopPlanner


@dataclasses.dataclass(frozen=True)
class _Saved:
    """What ``CheckpointCadence._save`` did: ``seconds`` training waited for it,
    ``own_seconds`` of them for this checkpoint (not waiting for the upload before);
    ``previous``, the background upload before if it ended during this save (its
    ``seconds``), else None; ``in_flight``: this checkpoint's upload goes on in the
    background."""

    seconds: float
    own_seconds: float
    previous: object
    in_flight: bool


class CheckpointCadence:
    """Writes ckpt-<step> every ``every`` steps and at the end, and makes each durable with
    ``on_checkpoint`` (module docstring); tells the stop planner (None without a deadline)
    what each took, written and uploaded.

    Args:
      manager: the trainer's tf.train.CheckpointManager.
      on_checkpoint: see the module docstring; None: a checkpoint is durable once written.
      every: steps between checkpoints.
      planner: the run's StopPlanner, or None.
      saved_step: the step of the checkpoint the run resumed from (None: a fresh run).
      clock: () -> seconds (time.perf_counter; tests pass a fake one).

    Attributes:
      saved_step: the step of the latest checkpoint (None: none yet).
    """

    def __init__(self, manager: tf.train.CheckpointManager,
                 on_checkpoint: Callable[[], None] | None, every: int,
                 planner: StopPlanner | None, saved_step: int | None,
                 clock: Callable[[], float]):
        self.manager = manager
        self.on_checkpoint = on_checkpoint
        self.every = every
        self.planner = planner
        self.saved_step = saved_step
        self.clock = clock
        self._uploading = None  # what the checkpoint uploading in the background took here

    @property
    def latest(self) -> str | None:
        """The prefix of the latest checkpoint, if any."""
        return self.manager.latest_checkpoint

    def due(self, step: int, at_end: bool) -> bool:
        return step % self.every == 0 or at_end

    def save(self, step: int, background: bool = False) -> float:
        """A checkpoint at ``step`` (its upload in the background with ``background``, if
        ``on_checkpoint`` can); returns the seconds training waited for it."""
        saved = self._save(step, background)
        self.saved_step = step
        self._ended(saved.previous)
        if saved.in_flight:
            self._uploading = saved.own_seconds
            if self.planner is not None:
                self.planner.record_upload_started()
        elif self.planner is not None:  # complete: written and uploaded
            self.planner.record_save(saved.seconds)
        return saved.seconds

    def poll(self) -> None:
        """Notes the background upload if it has ended (raises its error)."""
        self._ended(self._upload_ended(block=False))

    def settle(self) -> None:
        """Waits for the background upload in flight, if any (raises its error): the latest
        checkpoint is complete."""
        self._ended(self._upload_ended(block=True))

    def settle_after_failure(self, progress: Callable[[str], None]) -> None:
        """Training failed: lets the upload in flight end, so the last good checkpoint is
        durable; its own error is reported, not raised over the one that ends training."""
        try:
            self._upload_ended(block=True)
        except Exception as e:  # noqa: BLE001 - reported; the first error goes on
            progress(f"the checkpoint upload in flight failed too: {e}")

    def sync(self) -> None:
        """Makes the work dir durable now, in the foreground (a stop's record)."""
        if self.on_checkpoint is not None:
            self.on_checkpoint()

    def _save(self, step: int, background: bool = False) -> _Saved:
        """Writes ckpt-<step>; waits for the background upload of the checkpoint before, if
        still in flight (this save may just have deleted that one's files, keep-last-K: the
        upload reads a snapshot); then syncs ckpt-<step>, or with ``background`` starts its
        upload if ``on_checkpoint`` can."""
        t0 = self.clock()
        self.manager.save(checkpoint_number=step)
        t1 = self.clock()
        previous = self._upload_ended(block=True)
        waited = self.clock() - t1
        in_flight = False
        if self.on_checkpoint is not None:
            start = getattr(self.on_checkpoint, "start", None) if background else None
            if start is not None:
                in_flight = bool(start())
            else:
                self.on_checkpoint()
        seconds = self.clock() - t0
        return _Saved(seconds, seconds - waited, previous, in_flight)

    def _upload_ended(self, block: bool):
        """The background upload that ended (``block``: waits for the one in flight), or
        None; raises its error."""
        ended = getattr(self.on_checkpoint, "wait" if block else "poll", None)
        return ended() if ended is not None else None

    def _ended(self, job) -> None:
        """The background upload ended (``job``; None: not yet): the planner learns what its
        checkpoint took, written and uploaded."""
        if job is not None and self._uploading is not None:
            if self.planner is not None:
                self.planner.record_save(self._uploading + job.seconds)
            self._uploading = None
