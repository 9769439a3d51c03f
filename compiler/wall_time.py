"""The arithmetic of a wall-time budget (``experiment.wall_time_hours``): how much time to keep
free before the deadline, what a checkpoint is assumed to cost before one was timed, the
step a run is expected to stop at, and what restarts cost a run on preemptible machines or in
wall-time sessions (``restart_cost``, ``expected_restarts``, ``sessions``). Standard library
only: the plan shows these numbers, and the runtime (runtime/stop_planner.py) stops by the
same ones.

A machine taken away at a fixed time (a free notebook TPU after 12 hours, a preemptible
slot's notice) loses a checkpoint finished after that time; the margin is what absorbs a
machine that slows down, a save slower than the ones measured, a step longer than the one
before it.

Usage:
    margin = default_margin_s(budget_s=12 * 3600, parameters=110_000_000)   # 495 s
    last = expected_last_step(budget_s=12 * 3600, margin_s=margin, step_seconds=0.5,
                              checkpoint_every=1000, save_seconds=30.0,
                              train_steps=1_000_000)
    restarts = expected_restarts(train_hours=60.0, rate_per_day=1.0,
                                 cost=restart_cost(110_000_000, "tpu"))   # 2.5, 60.2 h
"""

from __future__ import annotations

import dataclasses
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


# --- restarts: what a preemptible run or a run in wall-time sessions pays to continue ------
#
# Each restart costs, before training goes on: the checkpoint at the stop (a preemption's
# notice, SIGTERM: runtime/preemption.py saves at the step reached, so no step is lost), a
# new process's start-up, the train step's compilation, the checkpoint's restore (download
# on gs:// and read), and the data position (constant time at any step:
# runtime/data_order.py). What this repository measures on a CPU machine:
#   - bench/soak.py: process start to the first step of each resume of a tiny model on the
#     loopback GCS server (start-up, compile, restore and data position together), flat from
#     the first restart to the twentieth;
#   - bench/resume.py: process start to the first batch, the same at step 10^3 and 10^6.
# The figures below are for an accelerator host and BERT-sized models, where they cannot be
# measured here: start-up (imports of TensorFlow and seqio, the plan, the strategy and its
# devices, the dataset) and compilation (XLA compiling the train step: minutes on a TPU host,
# about a minute on a GPU) are assumptions; the restore is the checkpoint's bytes at the
# assumed transfer rate; the data position is what bench/resume.py measures, rounded up.
STARTUP_S = 15.0
COMPILE_S = {"cpu": 5.0, "gpu": 60.0, "tpu": 180.0}
DATA_POSITION_S = 1.0
# Preemptions a day of a preemptible (spot) machine: an assumption, not a measurement.
# Preemptible VMs and TPUs were stopped at least once every 24 hours; spot ones have no
# such limit but are reclaimed at a similar rate when capacity is short. By accelerator
# type; a profile without a preemptible price is never preempted.
PREEMPTIONS_PER_DAY = {"gpu": 1.0, "tpu": 1.0}


@dataclasses.dataclass(frozen=True)
class RestartCost:
    """Seconds one restart costs, by part."""

    stop_save_s: float  # the checkpoint at the stop
    startup_s: float  # process start, imports, plan, strategy, dataset
    compile_s: float  # tracing and compiling the train step
    restore_s: float  # the checkpoint downloaded and read
    data_position_s: float  # the data stream at the checkpoint's position

    @property
    def seconds(self) -> float:
        return (self.stop_save_s + self.startup_s + self.compile_s + self.restore_s
                + self.data_position_s)

    def describe(self) -> str:
        return (f"{self.seconds / 60:.1f} min each: save at the stop {self.stop_save_s:.0f} s, "
                f"start-up {self.startup_s:.0f} s, compile {self.compile_s:.0f} s, restore "
                f"{self.restore_s:.0f} s, data position {self.data_position_s:.0f} s")


def restart_cost(parameters: int | None, accelerator_type: str) -> RestartCost:
    """What one restart of a training run of a model with ``parameters`` costs."""
    restore = ASSUMED_SAVE_FIXED_S + checkpoint_bytes(parameters) / ASSUMED_SAVE_BYTES_PER_SECOND
    return RestartCost(stop_save_s=assumed_save_seconds(parameters), startup_s=STARTUP_S,
                       compile_s=COMPILE_S.get(accelerator_type, COMPILE_S["gpu"]),
                       restore_s=restore, data_position_s=DATA_POSITION_S)


def preemptions_per_day(accelerator: dict | None) -> float:
    """The expected preemptions a day of ``accelerator``'s preemptible offering (0: none)."""
    accelerator = accelerator or {}
    if not accelerator.get("usd_per_hour_preemptible"):
        return 0.0
    return PREEMPTIONS_PER_DAY.get(accelerator.get("type", ""), 0.0)


@dataclasses.dataclass(frozen=True)
class Restarts:
    """A preemptible run of ``train_hours`` of training: ``count`` restarts expected,
    ``hours`` in all with them."""

    rate_per_day: float
    count: float
    cost: RestartCost
    hours: float


def expected_restarts(train_hours: float, rate_per_day: float, cost: RestartCost) -> Restarts:
    """Restarts of a run that trains ``train_hours`` on a machine preempted ``rate_per_day``
    times a day: preemptions come during restarts too, so with r = rate_per_day / 24 and c a
    restart's hours, the run takes T = train_hours / (1 - r c) and is restarted r T times."""
    r, c = max(rate_per_day, 0.0) / 24.0, cost.seconds / 3600.0
    if r * c >= 1:  # preempted faster than it restarts: it never ends
        return Restarts(rate_per_day, math.inf, cost, math.inf)
    hours = train_hours / (1 - r * c)
    return Restarts(rate_per_day, r * hours, cost, hours)


def sessions(train_steps: int, first_session_last_step: int, later_session_steps: int) -> int:
    """Sessions (runs of one wall-time budget each) to train ``train_steps``: the first ends
    at ``first_session_last_step``, each later one trains ``later_session_steps`` (after its
    restart). 0: a later session cannot train a step."""
    if first_session_last_step >= train_steps:
        return 1
    if later_session_steps <= 0:
        return 0
    return 1 + math.ceil((train_steps - first_session_last_step) / later_session_steps)
