"""Relaunching a command that was preempted.

``run_with_relaunch`` runs a command (the CLI passes the runexp command line, run in a
child process) and starts it again each time it exits with ``EXIT_PREEMPTED`` (75: a
SIGTERM stopped training after a checkpoint), so a run on preemptible machines continues
from its latest checkpoint without a person. Any other exit code, including
``EXIT_DEADLINE`` (the wall-time budget is spent), ends it. Standard library only: the CLI
can call it without importing TensorFlow.

Usage:
    code = run_with_relaunch([sys.executable, "-m", "runexp.compiler.cli", *args],
                             max_attempts=5, backoff_s=30.0)
    sys.exit(code)

If this process itself gets SIGTERM or SIGINT it passes the signal on to the child and
relaunches nothing more: the machine (or the person) is stopping everything.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from runexp.compiler.exit_codes import EXIT_DEADLINE, EXIT_PREEMPTED  # noqa: F401 (re-exported)

# Longest wait between attempts, whatever backoff_s and the attempt number say.
MAX_BACKOFF_S = 600.0
# An attempt that ran at least this long before it was preempted made progress: the next
# wait starts again from backoff_s. Over a days-long run on preemptible machines, the wait
# after the twentieth preemption is the first one's, not ten minutes; only preemptions in
# quick succession (a machine that is taken again at once) back off.
BACKOFF_RESET_S = 1800.0


def backoff_seconds(backoff_s: float, attempt: int) -> float:
    """Wait before relaunch number ``attempt`` (1, 2, ...): backoff_s doubled each time,
    at most MAX_BACKOFF_S."""
    return min(float(backoff_s) * 2 ** (attempt - 1), MAX_BACKOFF_S)


def run_with_relaunch(argv: list[str], max_attempts: int, backoff_s: float,
                      say: Callable[[str], None] | None = None) -> int:
    """Runs ``argv`` until it exits with anything but EXIT_PREEMPTED, at most
    ``max_attempts`` times in all.

    Args:
      argv: the command and its arguments.
      max_attempts: launches in all (the first included), >= 1.
      backoff_s: seconds before the first relaunch; doubled for each further one in a row
        of attempts shorter than BACKOFF_RESET_S (capped at MAX_BACKOFF_S); after a longer
        attempt, backoff_s again.
      say: where the one line per relaunch goes (default: stderr).

    Returns:
      The exit code of the last launch (EXIT_PREEMPTED if every attempt was preempted; a
      negative number -N if it was killed by signal N, as subprocess reports it).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1; got {max_attempts}")
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    command = shlex.join(argv)
    child = _Child(argv)
    with _stop_signals_handled_by(child.forward):
        attempt, streak = 1, 0  # streak: preempted attempts in a row shorter than the reset
        while True:
            started = time.monotonic()
            code = child.run()
            streak = 1 if time.monotonic() - started >= BACKOFF_RESET_S else streak + 1
            if code != EXIT_PREEMPTED or child.stopping is not None:
                return code
            if attempt >= max_attempts:
                say(f"runexp: attempt {attempt}/{max_attempts} was preempted (exit "
                    f"{EXIT_PREEMPTED}); no attempts left, giving up. Run the same command "
                    "again to continue from the latest checkpoint.")
                return code
            wait = backoff_seconds(backoff_s, streak)
            say(f"runexp: attempt {attempt}/{max_attempts} was preempted (exit "
                f"{EXIT_PREEMPTED}); relaunching in {wait:g} s (attempt {attempt + 1}/"
                f"{max_attempts}): {command}")
            if child.stopped.wait(wait):  # a stop signal came during the wait
                return code
            attempt += 1


class _Child:
    """The command's launches, one at a time, and whether this process was told to stop
    (the signal number in ``stopping``; ``stopped`` is set then)."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.process: subprocess.Popen | None = None
        self.stopping: int | None = None
        self.stopped = threading.Event()

    def run(self) -> int:
        """Launches the command and waits for its exit code."""
        self.process = subprocess.Popen(self.argv)
        code = self.process.wait()
        self.process = None
        return code

    def forward(self, signum, frame) -> None:
        """A signal handler: no more launches, and the running child gets the signal too."""
        self.stopping = signum
        self.stopped.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signum)


@contextlib.contextmanager
def _stop_signals_handled_by(handler):
    """SIGTERM and SIGINT go to ``handler`` inside the block, to the previous handlers after
    it. Only the main thread may set handlers: elsewhere the block runs with them as they
    are."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
