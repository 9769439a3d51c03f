"""The skeleton a training stage runs, shared by pretrain and finetune (runtime/stages/).

``run_training`` sets the threads and the seed, makes the kind of stage (which reads and
checks its data first), the strategy, the model and optimizer under it, and the Trainer
(runtime/trainer.py); the kind sets a fresh run's starting weights; then it trains, draws
the curves (at a stop too: the curves so far) and returns the kind's summary. A kind
(``TrainingKind``) supplies what differs: its loop, model, datasets, metrics, starting
weights and summary.

Usage (a stage handler):
    def run(ctx) -> dict:
        return run_training(ctx, TrainSpec.from_stage(ctx), Pretraining)
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from runexp.runtime import strategy as strategy_lib
from runexp.runtime.preemption import Preempted
from runexp.runtime.report.curves import draw_stage_curves
from runexp.runtime.train_loop_config import TrainLoopConfig
from runexp.runtime.trainer import Trainer


class TrainingKind:
    """What a training stage supplies to ``run_training``; made with ``(ctx, spec)`` once
    the seed is set, before the strategy.

    Attributes:
      loop: the training loop's cadence (``prepare`` may still change it).
      metrics_fn: summed stats -> metrics (runtime/train_log.py).
      eval_dataset: () -> the held-out dataset evaluated every ``loop.eval_every`` steps,
        or None.
    """

    loop: TrainLoopConfig
    metrics_fn: Callable[[dict], dict]
    eval_dataset: Callable[[], tf.data.Dataset] | None = None

    def build(self, xla: bool) -> tuple[tf.Module, object]:
        """(model, optimizer), made under the strategy's scope; ``xla``: the model's layers
        compiled with XLA."""
        raise NotImplementedError

    def prepare(self, strategy: tf.distribute.Strategy) -> None:
        """After the model, before the Trainer: what depends on the strategy."""

    def start(self, trainer: Trainer) -> None:
        """Before training: a fresh run's starting weights, and what the stage reports."""

    def make_dataset(self, skip_batches: int):
        """The training data with ``skip_batches`` global batches skipped (Trainer.train)."""
        raise NotImplementedError

    def summary(self, result: dict, trainer: Trainer) -> dict:
        """The stage's summary from the Trainer's (and its own outputs, written here)."""
        raise NotImplementedError


def run_training(ctx, spec, make_kind: Callable[[object, object], TrainingKind]) -> dict:
    """Runs a training stage of the kind ``make_kind(ctx, spec)`` makes (module docstring);
    returns its summary. ``spec``: the stage's params (a TrainSpec or FinetuneSpec)."""
    strategy_lib.configure_threads()
    tf.random.set_seed(spec.seed)
    kind = make_kind(ctx, spec)
    accelerator = strategy_lib.accelerator_of(ctx)
    strategy = strategy_lib.make_strategy(accelerator)
    xla = kind.loop.jit_compile or strategy_lib.is_tpu(accelerator)
    with strategy.scope():
        model, optimizer = kind.build(xla)
    kind.prepare(strategy)
    trainer = Trainer(strategy, model, optimizer, ctx.work_dir, kind.loop,
                      metrics_fn=kind.metrics_fn, progress=ctx.progress,
                      on_checkpoint=ctx.sync, eval_dataset=kind.eval_dataset)
    kind.start(trainer)
    try:
        result = trainer.train(kind.make_dataset)
    except Preempted:  # and DeadlineReached: the curves so far, then the stop goes on
        draw_stage_curves(ctx, sync=True)
        raise
    summary = kind.summary(result, trainer)
    draw_stage_curves(ctx, summary)  # curves.png; a failure is only a warning
    return summary
