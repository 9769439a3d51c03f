"""A wall-time budget that starts where a test says, not when the run was launched.

A deadline test that sets its deadline before a run starts assumes how long that run's
start-up takes (imports, the download of the checkpoint it resumes from, restoring, the
first call's tracing), and a busy machine can stretch that many times over. Installed,
every stop planner the trainer makes takes its deadline ``budget_s`` after the moment
chosen, with the automatic margin of that budget (compiler/wall_time.py); the run's own
deadline (``DEADLINE_ENV``) only has to be far enough for training to start.

    planners = deadline_budget.install(monkeypatch, budget_s=20.0,
                                       starts=deadline_budget.AFTER_TRACING)
    ... run the stage with a far deadline ...
    deadline = planners[-1].deadline   # the one the run planned with (time.time() terms)
"""

from __future__ import annotations

from runexp.compiler import wall_time
from runexp.runtime import trainer
from runexp.runtime.stop_planner import StopPlanner

TRAIN_START = "train start"  # when the trainer makes its planner
AFTER_TRACING = "after tracing"  # when the loop's first call (tracing) ended


def install(monkeypatch, budget_s: float, starts: str) -> list[StopPlanner]:
    """Patches the trainer's StopPlanner (for this test); returns the planners made, in
    order."""
    if starts not in (TRAIN_START, AFTER_TRACING):
        raise ValueError(f"starts: {TRAIN_START!r} or {AFTER_TRACING!r}; got {starts!r}")
    planners = []

    class Budgeted(StopPlanner):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            planners.append(self)
            if starts == TRAIN_START:
                self._start_budget()

        def _start_budget(self) -> None:
            self.deadline = self.clock() + budget_s
            self.margin_s = wall_time.default_margin_s(budget_s, None)

        def record_call(self, steps, seconds, tracing=False):
            if tracing and starts == AFTER_TRACING:
                self._start_budget()
            super().record_call(steps, seconds, tracing)

    monkeypatch.setattr(trainer, "StopPlanner", Budgeted)
    return planners
