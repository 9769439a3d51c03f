"""The training loop shared by pretrain and finetune.

A model here is a tf.Module with ``loss(features, training) -> (loss, stats)`` where
``stats`` is a dict of scalar *sums* (so windows and replicas add up exactly) and
``google_variables() -> {name: variable}``. The loop:

- runs ``steps_per_loop`` steps per ``tf.function`` call under the strategy (fewer near a
  log or checkpoint boundary; the step count is a tensor, so it never retraces);
- every ``log_every`` steps turns the summed stats into metrics (``metrics_fn``), writes
  TensorBoard scalars and a ``train_log.jsonl`` line, and reports progress;
- saves ``checkpoints/ckpt-<step>`` every ``checkpoint_every`` steps and at the end, with
  model, optimizer (slots and step) and the number of batches consumed;
- resumes from the latest checkpoint in ``work_dir``: the step continues and the data
  stream skips the batches already consumed;
- stops on a NaN/Inf loss, naming the last good checkpoint, before saving anything bad.

Usage:
    trainer = Trainer(strategy, model, optimizer, work_dir, TrainLoopConfig(...),
                      metrics_fn=pretraining_metrics, progress=ctx.progress)
    summary = trainer.train(lambda skip: make_dataset(skip_batches=skip))
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Callable, Mapping

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from runexp.runtime.checkpoints import CHECKPOINT_SUBDIR

TRAIN_LOG = "train_log.jsonl"
TENSORBOARD_SUBDIR = "tensorboard"

# What tensorboard's own scalar summary writes; tf.summary.scalar needs the tensorboard
# package installed, tf.summary.write with this metadata does not.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def write_scalar(name: str, value: float, step: int) -> None:
    """One TensorBoard scalar into the default summary writer."""
    tf.summary.write(name, tf.constant(float(value), tf.float32), step=step,
                     metadata=_SCALAR_METADATA)


@dataclasses.dataclass(frozen=True)
class TrainLoopConfig:
    """Cadence of a training run.

    Attributes:
      train_steps: total optimizer steps (a resumed run trains up to this step).
      batch_size: global batch size (for examples/s).
      steps_per_loop: steps per tf.function call.
      log_every: steps between metrics lines.
      checkpoint_every: steps between checkpoints (also saved at the end).
      keep_checkpoints: CheckpointManager's max_to_keep.
      jit_compile: compile the train step with XLA.
    """

    train_steps: int
    batch_size: int
    steps_per_loop: int = 100
    log_every: int = 100
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    jit_compile: bool = False


def pretraining_metrics(totals: Mapping[str, float]) -> dict:
    """Metrics of ``BertPretrainer.loss`` stats summed over a window."""
    mlm_loss = totals["mlm_loss_sum"] / max(totals["mlm_weight"], 1e-5)
    nsp_loss = totals["nsp_loss_sum"] / max(totals["examples"], 1.0)
    return {
        "loss": mlm_loss + nsp_loss,
        "mlm_loss": mlm_loss,
        "mlm_accuracy": totals["mlm_correct"] / max(totals["mlm_weight"], 1e-5),
        "nsp_loss": nsp_loss,
        "nsp_accuracy": totals["nsp_correct"] / max(totals["examples"], 1.0),
    }


def classification_metrics(totals: Mapping[str, float]) -> dict:
    """Metrics of ``BertClassifier.loss`` stats summed over a window."""
    n = max(totals["examples"], 1.0)
    return {"loss": totals["loss_sum"] / n, "accuracy": totals["correct"] / n}


def _format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def distribute(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
    """The dataset as the strategy's replicas read it (unchanged for one replica)."""
    if strategy.num_replicas_in_sync == 1:
        return dataset
    return strategy.experimental_distribute_dataset(dataset)


def _sum_stats(strategy, per_replica: Mapping) -> dict:
    if strategy.num_replicas_in_sync == 1:
        return dict(per_replica)
    return {k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
            for k, v in per_replica.items()}


class Trainer:
    """Runs a model's training to ``train_steps`` with checkpoints and logs in work_dir."""

    def __init__(self, strategy: tf.distribute.Strategy, model: tf.Module, optimizer,
                 work_dir: str, config: TrainLoopConfig,
                 metrics_fn: Callable[[Mapping[str, float]], dict],
                 progress: Callable[[str], None] = print,
                 on_checkpoint: Callable[[], None] | None = None):
        self.strategy = strategy
        # Called after each checkpoint is written: a gs:// run uploads it then.
        self.on_checkpoint = on_checkpoint
        self.model = model
        self.optimizer = optimizer
        self.work_dir = work_dir
        self.config = config
        self.metrics_fn = metrics_fn
        self.progress = progress
        self._names_and_vars = list(model.google_variables().items())
        with strategy.scope():
            optimizer.build(dict(self._names_and_vars))
            # Batches consumed so far: the data position a resumed run skips to.
            self.batches_consumed = tf.Variable(0, dtype=tf.int64, name="batches_consumed",
                                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                              batches_consumed=self.batches_consumed)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(work_dir, CHECKPOINT_SUBDIR),
            max_to_keep=config.keep_checkpoints, checkpoint_name="ckpt",
            step_counter=optimizer.iterations)
        self._loop_fn = self._build_loop()

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def restore_latest(self) -> str | None:
        """Restores the newest checkpoint in work_dir, if any; returns its prefix."""
        latest = self.manager.latest_checkpoint
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
        return latest

    def _build_loop(self):
        strategy, model, optimizer = self.strategy, self.model, self.optimizer
        variables = [v for _, v in self._names_and_vars]
        replicas = strategy.num_replicas_in_sync

        def compute(features):
            with tf.GradientTape() as tape:
                loss, stats = model.loss(features, training=True)
                # Gradients are summed across replicas, so each replica scales by 1/n.
                scaled = loss / replicas
            return tape.gradient(scaled, variables), stats

        if self.config.jit_compile:
            compute = tf.function(compute, jit_compile=True)

        def step_fn(features):
            grads, stats = compute(features)
            if replicas > 1:
                grads = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, grads)
            optimizer.apply(grads, variables)
            return stats

        @tf.function
        def loop(iterator, num_steps):
            totals = _sum_stats(strategy, strategy.run(step_fn, args=(next(iterator),)))
            for _ in tf.range(num_steps - 1):
                stats = _sum_stats(strategy, strategy.run(step_fn, args=(next(iterator),)))
                totals = {k: totals[k] + stats[k] for k in totals}
            return totals

        return loop

    def _trim_log(self, log_path: str, step: int) -> None:
        # A run killed between a log line and its checkpoint logged steps it will redo.
        if not os.path.exists(log_path):
            return
        with open(log_path) as f:
            lines = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        with open(log_path, "w") as f:
            f.writelines(lines)

    def _last_logged(self, log_path: str) -> dict:
        if not os.path.exists(log_path):
            return {}
        with open(log_path) as f:
            lines = [line for line in f if line.strip()]
        return json.loads(lines[-1]) if lines else {}

    def train(self, make_dataset: Callable[[int], tf.data.Dataset]) -> dict:
        """Trains from the latest checkpoint (or from scratch) to ``train_steps``.

        Args:
          make_dataset: skip_batches -> the deterministic, repeated, batched dataset with
            that many batches skipped.

        Returns:
          Summary: step, the last window's metrics, examples_per_second (steady state, the
          first call's tracing excluded), resumed_from (checkpoint prefix or None).

        Raises:
          FloatingPointError: the loss became NaN or Inf.
        """
        cfg = self.config
        os.makedirs(self.work_dir, exist_ok=True)
        resumed_from = self.restore_latest()
        start = self.step
        log_path = os.path.join(self.work_dir, TRAIN_LOG)
        self._trim_log(log_path, start)
        if resumed_from:
            self.progress(f"resuming from {resumed_from} at step {start}/{cfg.train_steps} "
                          f"({int(self.batches_consumed.numpy())} batches consumed)")
        if start >= cfg.train_steps:
            last = self._last_logged(log_path)
            return {**last, "step": start, "resumed_from": resumed_from, "steps_trained": 0}

        skip = int(self.batches_consumed.numpy())
        iterator = iter(distribute(self.strategy, make_dataset(skip)))
        writer = tf.summary.create_file_writer(os.path.join(self.work_dir, TENSORBOARD_SUBDIR))
        window: dict = {}
        window_start, window_steps = time.perf_counter(), 0
        steady_time, steady_steps, first_call = 0.0, 0, True
        step, metrics, eps = start, {}, float("nan")
        while step < cfg.train_steps:
            n = min(cfg.steps_per_loop, cfg.train_steps - step,
                    cfg.log_every - step % cfg.log_every,
                    cfg.checkpoint_every - step % cfg.checkpoint_every)
            t0 = time.perf_counter()
            totals = {k: float(v) for k, v in self._loop_fn(iterator, tf.constant(n)).items()}
            elapsed = time.perf_counter() - t0
            if first_call:
                first_call = False
            else:
                steady_time += elapsed
                steady_steps += n
            step += n
            self.batches_consumed.assign_add(n)
            window = {k: window.get(k, 0.0) + v for k, v in totals.items()}
            window_steps += n
            if not all(math.isfinite(v) for v in totals.values()):
                raise FloatingPointError(
                    f"loss became NaN/Inf between steps {step - n} and {step}; the last good "
                    f"checkpoint is {self.manager.latest_checkpoint or 'none (none saved yet)'}"
                    ": lower the learning rate or check the data, then re-run to resume")
            at_end = step >= cfg.train_steps
            if step % cfg.log_every == 0 or at_end:
                now = time.perf_counter()
                metrics = self.metrics_fn(window)
                window_eps = window_steps * cfg.batch_size / max(now - window_start, 1e-9)
                eps = (steady_steps * cfg.batch_size / steady_time) if steady_time else window_eps
                lr = float(self.optimizer.schedule(step - 1))
                self._log(writer, log_path, step, metrics, lr, window_eps)
                remaining = (cfg.train_steps - step) * cfg.batch_size / eps if eps else math.inf
                accs = " ".join(f"{k} {v:.3f}" for k, v in metrics.items()
                                if k.endswith("accuracy"))
                self.progress(f"step {step}/{cfg.train_steps} loss {metrics['loss']:.4f} "
                              f"{accs} lr {lr:.2e} {window_eps:.1f} ex/s "
                              f"ETA {_format_eta(remaining)}")
                window, window_start, window_steps = {}, now, 0
            if step % cfg.checkpoint_every == 0 or at_end:
                self.manager.save(checkpoint_number=step)
                if self.on_checkpoint is not None:
                    writer.flush()
                    self.on_checkpoint()
        writer.close()
        return {"step": step, **metrics, "examples_per_second": eps,
                "resumed_from": resumed_from, "steps_trained": step - start,
                "checkpoint": self.manager.latest_checkpoint}

    def _log(self, writer, log_path, step, metrics, lr, eps) -> None:
        with writer.as_default(step=step):
            for k, v in metrics.items():
                write_scalar(k, v, step)
            write_scalar("learning_rate", lr, step)
            write_scalar("examples_per_second", eps, step)
        writer.flush()
        record = {"step": step, **{k: round(v, 6) for k, v in metrics.items()},
                  "learning_rate": lr, "examples_per_second": round(eps, 2),
                  "batches_consumed": int(self.batches_consumed.numpy()),
                  "time": round(time.time(), 3)}
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")


def evaluate_totals(strategy: tf.distribute.Strategy, model: tf.Module,
                    dataset: tf.data.Dataset) -> dict:
    """Sums ``model.loss(features, training=False)`` stats over one pass of ``dataset``."""

    @tf.function(reduce_retracing=True)
    def step(features):
        return _sum_stats(strategy, strategy.run(lambda f: model.loss(f, training=False)[1],
                                                 args=(features,)))

    totals: dict = {}
    for features in distribute(strategy, dataset):
        for k, v in step(features).items():
            totals[k] = totals.get(k, 0.0) + float(v)
    return totals
