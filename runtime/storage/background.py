"""One job at a time in a background thread, its error raised in the thread that waits for it.

The mirror uploads a training checkpoint this way (mirror.StageSync) while training goes on:

    worker = Background("checkpoint upload")
    worker.submit(upload)       # waits for the job before (raising its error), then starts
    ...
    job = worker.poll()         # a job that ended since the last look, or None; its error
    job = worker.wait()         # raised here, in the caller's thread, once

A job's error is never lost: it is raised by the next ``submit``, ``poll`` or ``wait``
(exactly once). The thread is a daemon: a process that exits while a job runs does not wait
for it (what the job writes must be safe to cut short anywhere, as a kill would).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable


@dataclasses.dataclass
class Job:
    """One job: when it started (``time.perf_counter()``), and once it ended its duration
    and error (None if it succeeded)."""

    what: str
    started: float
    seconds: float | None = None
    error: BaseException | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def elapsed(self) -> float:
        return self.seconds if self.seconds is not None else time.perf_counter() - self.started


class Background:
    """Runs at most one job at a time in a daemon thread (``name`` names the thread)."""

    def __init__(self, name: str):
        self.name = name
        self._job: Job | None = None  # the job in flight, or ended and not collected yet

    @property
    def in_flight(self) -> Job | None:
        """The job running now, or None."""
        job = self._job
        return job if job is not None and not job.done.is_set() else None

    def submit(self, fn: Callable[[], None], what: str = "") -> Job:
        """Waits for the job before (raising its error), then starts ``fn()``."""
        self.wait()
        job = Job(what or self.name, time.perf_counter())

        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                job.error = exc
            finally:
                job.seconds = time.perf_counter() - job.started
                job.done.set()

        self._job = job
        threading.Thread(target=run, name=f"runexp-{self.name}", daemon=True).start()
        return job

    def poll(self) -> Job | None:
        """The job, if it ended since it was last collected (its error raised), else None."""
        job = self._job
        if job is None or not job.done.is_set():
            return None
        return self._collect(job)

    def wait(self) -> Job | None:
        """Waits for the job in flight; returns it if it was not collected yet (its error
        raised), else None."""
        job = self._job
        if job is None:
            return None
        job.done.wait()
        return self._collect(job)

    def _collect(self, job: Job) -> Job:
        self._job = None
        if job.error is not None:
            raise job.error
        return job
