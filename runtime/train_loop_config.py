"""The cadence of a training run (steps, batches, checkpoints, evaluation, deadline), as the
trainer (runtime/trainer.py) takes it from a stage's TrainSpec or FinetuneSpec."""

from __future__ import annotations

import dataclasses

from runexp.compiler.specs import TrainSpec


@dataclasses.dataclass(frozen=True)
class TrainLoopConfig:
    """Cadence of a training run.

    Attributes:
      train_steps: total optimizer steps (a resumed run trains up to this step).
      batch_size: global batch size, in rows (the examples a step counts when the model
        counts none itself: runtime/throughput.py).
      steps_per_loop: steps per tf.function call.
      log_every: steps between metrics lines.
      checkpoint_every: steps between checkpoints (also saved at the end).
      keep_checkpoints: CheckpointManager's max_to_keep.
      jit_compile: compile the step with XLA (on one replica the whole step, gradients and
        update; under MirroredStrategy the gradient computation).
      grad_accum_steps: micro-batches per step: each replica's batch is split into this
        many parts whose gradients are summed before one update (same update as the whole
        batch at once, in less memory).
      compute_dtype: the model's compute dtype; "mixed_float16" turns on dynamic loss
        scaling.
      eval_every: steps between held-out evaluations (0 = never; needs an eval dataset).
      deadline: absolute time.time() by which training stops with a checkpoint
        (``DeadlineReached``), or None.
      deadline_margin: seconds kept free before the deadline beyond the measured step and
        checkpoint times; None: ``compiler.wall_time.default_margin_s`` of the time left
        when training starts and the model's size.
    """

    train_steps: int
    batch_size: int
    jit_compile: bool  # resolved by the plan (TrainSpec.jit_compile None means auto)
    # Defaults are the spec's (one declaration: compiler/specs/train.py).
    steps_per_loop: int = TrainSpec.steps_per_loop
    log_every: int = TrainSpec.log_every
    checkpoint_every: int = TrainSpec.checkpoint_every
    keep_checkpoints: int = TrainSpec.keep_checkpoints
    grad_accum_steps: int = TrainSpec.grad_accum_steps
    compute_dtype: str = TrainSpec.compute_dtype
    eval_every: int = TrainSpec.eval_every
    deadline: float | None = None
    deadline_margin: float | None = None
