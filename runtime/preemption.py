"""Stopping a training run cleanly: SIGTERM (preemption) and a wall-time deadline.

A preemptible TPU VM (or a spot GPU VM, or Kubernetes) announces the end with SIGTERM and
kills the process some seconds later. ``PreemptionWatcher`` turns SIGTERM into a request
the training loop sees at the next *step* boundary, even in the middle of a host loop of
``steps_per_loop`` steps: the loop reads ``watcher.stop_requested`` (a tf.Variable) before
every step, and a helper thread sets it the moment the signal arrives (Python's own signal
handlers only run once the main thread is back in the interpreter, i.e. after the whole
host loop). The trainer then writes a checkpoint at the step reached and raises
``Preempted``; the executor maps it to ``EXIT_PREEMPTED`` and never writes COMPLETED, and
``runexp.runtime.relaunch.run_with_relaunch`` starts the command again, which resumes from
that checkpoint.

A deadline (``deadline_unix``, an absolute time.time()) stops the same way, early enough
for the last checkpoint to be complete before it (runtime/stop_planner.py plans the stop
from the run's measured step and checkpoint times and a margin), and raises
``DeadlineReached`` (a ``Preempted``) with its own exit code, which is not relaunched: the
budget is spent. It says how many seconds were left when that checkpoint was complete.

Usage:
    with PreemptionWatcher() as watcher:       # in the main thread
        ... loop(iterator, n, watcher.stop_requested) ...
        if watcher.requested: save; raise Preempted(step, checkpoint)
"""

from __future__ import annotations

import signal
import socket
import threading

import tensorflow as tf

# Why these two codes: compiler/exit_codes.py.
from runexp.compiler.exit_codes import EXIT_DEADLINE, EXIT_PREEMPTED


class Preempted(Exception):
    """Training stopped on SIGTERM after writing a checkpoint at ``step``.

    Attributes:
      step: the step of the latest checkpoint, where a rerun continues: the step reached,
        unless a deadline left no time for its checkpoint (the trainer then said so).
      checkpoint: prefix of the latest complete checkpoint (None if none was ever written).
      reason: "SIGTERM" or "deadline".
      exit_code: the process exit code the executor should return.
    """

    exit_code = EXIT_PREEMPTED

    def __init__(self, step: int, checkpoint: str | None, reason: str = "SIGTERM"):
        self.step, self.checkpoint, self.reason = step, checkpoint, reason
        super().__init__(self._message())

    def _message(self) -> str:
        where = self.checkpoint or "none (no checkpoint was written)"
        return (f"training stopped by {self.reason} at step {self.step}; latest checkpoint: "
                f"{where}; run the same command again to continue from it")


class DeadlineReached(Preempted):
    """Training stopped at the wall-time budget (``deadline_unix``) after a checkpoint.

    Attributes (beyond Preempted's):
      seconds_left: seconds between the moment the last checkpoint was complete (written,
        and uploaded on gs://) and the deadline; negative if it was complete only after it;
        None if not measured.
    """

    exit_code = EXIT_DEADLINE

    def __init__(self, step: int, checkpoint: str | None, seconds_left: float | None = None):
        self.seconds_left = seconds_left
        super().__init__(step, checkpoint, reason="the wall-time budget (deadline_unix)")

    def _message(self) -> str:
        message = super()._message()
        if self.seconds_left is None:
            return message
        side = "before" if self.seconds_left >= 0 else "AFTER"
        return (f"{message} (the checkpoint was complete {abs(self.seconds_left):.1f} s "
                f"{side} the deadline)")


class PreemptionWatcher:
    """Installs a SIGTERM handler for the duration of a ``with`` block (main thread only;
    elsewhere it watches nothing and ``requested`` stays None).

    Args:
      stop_requested: the scalar bool tf.Variable to set (one is made if None); host loops
        read it between steps.
      signals: the signals that request a stop.

    Attributes:
      stop_requested: the variable, True once a signal arrived.
      requested: the signal's name once one arrived, else None.
    """

    def __init__(self, stop_requested: tf.Variable | None = None,
                 signals=(signal.SIGTERM,)):
        self.signals = tuple(signals)
        # Outside any strategy scope: one host variable, read by the host loop.
        if stop_requested is None:
            stop_requested = tf.Variable(False, trainable=False, name="stop_requested")
        self.stop_requested = stop_requested
        self.requested: str | None = None
        self._previous: dict = {}
        self._old_wakeup = None
        self._pipe = None
        self._thread = None

    def _on_signal(self, signum, frame):  # runs in the main thread, once Python regains it
        self._request(signum)

    def _request(self, signum: int) -> None:
        if self.requested is None:
            self.requested = signal.Signals(signum).name
        self.stop_requested.assign(True)

    def _wake(self, sock) -> None:
        # The C-level handler writes the signal number to the wakeup fd at once, even while
        # the main thread is inside a TensorFlow call: set the variable from here.
        while True:
            try:
                data = sock.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in [int(s) for s in self.signals]:
                    self._request(signum)

    def __enter__(self) -> "PreemptionWatcher":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        read, write = socket.socketpair()
        write.setblocking(False)
        self._pipe = (read, write)
        self._old_wakeup = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._wake, args=(read,), daemon=True,
                                        name="runexp-preemption")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._old_wakeup if self._old_wakeup is not None else -1)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        read, write = self._pipe
        write.close()  # the thread's recv returns b"": it ends
        self._thread.join(timeout=5)
        read.close()
        self._pipe = None
