"""The arithmetic of a wall-time budget (``experiment.wall_time_hours``): how much time to keep
free before the deadline, what a checkpoint is assumed to cost before one was timed, and the
step a run is expected to stop at. Standard library only: the plan shows these numbers, and
the runtime (runtime/stop_planner.py) stops by the same ones.

A machine taken away at a fixed time (a free notebook TPU after 12 hours, a preemptible
slot's notice) loses a checkpoint finished after that time; the margin is what absorbs a
machine that slows down, a save slower than the ones measured, a step longer than the one
before it.

Usage:
    margin = default_margin_s(budget_s=12 * 3600, parameters=110_000_000)   # 495 s
    last = expected_last_step(budget_s=12 * 3600, margin_s=margin, step_seconds=0.5,
                              checkpoint_every=1000, save_seconds=30.0,
                              train_steps=1_000_000)
"""

from __future__ import annotations

import math

# Bytes a training checkpoint holds per model parameter: float32 weights and up to two
# float32 optimizer slots (Adam's m and v).
CHECKPOINT_BYTES_PER_PARAMETER = 12

# Before the first checkpoint of a run is timed, writing (and, on gs://, uploading) one is
# assumed to take this long plus its bytes at this rate.
ASSUMED_SAVE_FIXED_S = 1.0
ASSUMED_SAVE_BYTES_PER_SECOND = 50e6

# The automatic margin (default_margin_s) is the sum of:
#   - a share of the budget: over a long run conditions drift (a neighbour on the host, a
#     throttled accelerator, a slower link to the bucket) and the figures the stop is planned
#     from were measured under earlier conditions;
MARGIN_BUDGET_SHARE = 0.01
#   - one more checkpoint moved at a pessimistic rate: the final save may be slower than the
#     slowest one measured (or be the first one, timed by nothing but an assumption), and
#     how much slower grows with the checkpoint's size;
MARGIN_SLOW_UPLOAD_BYTES_PER_SECOND = 25e6
#   - a fixed allowance for the process itself: a garbage collection, log and summary
#     flushes, the stop record's upload;
MARGIN_FIXED_S = 10.0
#   - never more than this share of the budget, so a short budget still trains.
MARGIN_MAX_BUDGET_SHARE = 0.25


def checkpoint_bytes(parameters: int | None) -> float:
    """The size a checkpoint of a model with ``parameters`` is assumed to have."""
    return float(CHECKPOINT_BYTES_PER_PARAMETER * max(int(parameters or 0), 0))


def assumed_save_seconds(parameters: int | None) -> float:
    """What writing one checkpoint is assumed to take before a save of this run was timed."""
    return ASSUMED_SAVE_FIXED_S + checkpoint_bytes(parameters) / ASSUMED_SAVE_BYTES_PER_SECOND


def default_margin_s(budget_s: float, parameters: int | None) -> float:
    """The automatic safety margin, in seconds, for a budget of ``budget_s`` seconds and a
    model of ``parameters`` parameters (None or 0: unknown, the size term is left out):

        min(25% of the budget, 10 s + 1% of the budget + 12 B/parameter / 25 MB/s)

    e.g. 12 h with BERT-base (110M parameters): 10 + 432 + 53 = 495 s (8.3 min); 1 h with
    BERT-large (335M): 10 + 36 + 161 = 207 s; a budget of 20 s: 5 s."""
    budget_s = max(float(budget_s), 0.0)
    margin = (MARGIN_FIXED_S + MARGIN_BUDGET_SHARE * budget_s
              + checkpoint_bytes(parameters) / MARGIN_SLOW_UPLOAD_BYTES_PER_SECOND)
    return min(margin, MARGIN_MAX_BUDGET_SHARE * budget_s)


def margin_s(budget_s: float, parameters: int | None,
             margin_minutes: float | None = None) -> float:
    """The margin a run keeps: ``margin_minutes`` (experiment.wall_time_margin_minutes) if
    set, else ``default_margin_s``."""
    if margin_minutes is not None:
        return max(float(margin_minutes), 0.0) * 60.0
    return default_margin_s(budget_s, parameters)


def expected_last_step(budget_s: float, margin_s: float, step_seconds: float,
                       checkpoint_every: int, save_seconds: float,
                       train_steps: int | None = None, start_step: int = 0,
                       startup_s: float = 0.0) -> int:
    """The step a run is expected to stop at (with its final checkpoint) when it starts at
    ``start_step`` with ``budget_s`` seconds left, keeps ``margin_s`` free, takes
    ``step_seconds`` a step and ``save_seconds`` a checkpoint (one every
    ``checkpoint_every`` steps, and one at the stop), after ``startup_s`` of start-up.
    At most ``train_steps`` if given. The runtime stops a step or two earlier: near the
    deadline it shortens its calls (runtime/stop_planner.py)."""
    if step_seconds <= 0 or not math.isfinite(step_seconds):
        raise ValueError(f"step_seconds must be a positive number; got {step_seconds}")
    checkpoint_every = max(int(checkpoint_every), 1)
    usable = budget_s - margin_s - startup_s - save_seconds  # the final save is kept free
    steps = 0
    if usable > 0:
        interval = checkpoint_every * step_seconds + max(save_seconds, 0.0)
        full = int(usable // interval)
        rest = usable - full * interval
        steps = full * checkpoint_every + min(int(rest // step_seconds), checkpoint_every)
    last = start_step + steps
    return min(last, train_steps) if train_steps is not None else last
