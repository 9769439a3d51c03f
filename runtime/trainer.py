"""The training loop shared by pretrain and finetune.

A model here is a tf.Module with ``loss_stats(features, training) -> stats`` (a dict of
scalar *sums*, so windows, micro-batches and replicas add up exactly; its keys are the
model's ``STAT_KEYS``),
``loss_denominators(features)`` and ``objective(stats, denominators) -> loss`` (the loss
of a part of a batch whose totals are ``denominators``), and
``google_variables() -> {name: variable}``. The loop:

- runs ``steps_per_loop`` steps per ``tf.function`` call under the strategy (fewer near a
  log, evaluation or checkpoint boundary; the step count is a tensor, so it never
  retraces);
- divides each replica's loss by the *global* batch's denominators (masked positions,
  examples), all-reduced before the forward pass, and sums gradients over micro-batches
  (``grad_accum_steps``) and replicas: every layout of the same global batch gives the
  same update;
- every ``log_every`` steps turns the summed stats into metrics (``metrics_fn``), writes
  TensorBoard scalars (metrics, learning rate, gradient norm, examples/s, step time) and a
  ``train_log.jsonl`` line, and reports progress with an ETA;
- every ``eval_every`` steps evaluates the held-out set (``eval_dataset``), written as
  ``eval/*`` scalars and ``eval_log.jsonl`` lines;
- saves ``checkpoints/ckpt-<step>`` every ``checkpoint_every`` steps and at the end, with
  model, optimizer (slots and step), the number of batches consumed (the data position)
  and, for float16, the loss scale;
- resumes from the latest checkpoint in ``work_dir``: the step continues and the data
  stream skips the batches already consumed;
- on SIGTERM (checked before every step) or at ``deadline``, saves a checkpoint at the step
  reached and raises ``preemption.Preempted`` / ``preemption.DeadlineReached``;
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

from runexp.runtime.checkpoints import CHECKPOINT_SUBDIR, checkpoint_step
from runexp.runtime import cluster
from runexp.runtime.optimizer import DynamicLossScale
from runexp.runtime.preemption import DeadlineReached, Preempted, PreemptionWatcher

TRAIN_LOG = "train_log.jsonl"
EVAL_LOG = "eval_log.jsonl"
# Before the first checkpoint is timed, saving and uploading one is assumed to take 1 s plus
# its bytes (weights and up to two slots, float32) at this rate.
_ASSUMED_SAVE_BYTES_PER_SECOND = 50e6
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
    """

    train_steps: int
    batch_size: int
    steps_per_loop: int = 100
    log_every: int = 100
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    jit_compile: bool = False
    grad_accum_steps: int = 1
    compute_dtype: str = "float32"
    eval_every: int = 0
    deadline: float | None = None


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
    if cluster.is_multi_worker():
        # Each worker reads the whole stream and keeps its share of every global batch: the
        # same examples per step, in the same order, as on one machine (and as a resumed run
        # skips to), whatever the number of files.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.DATA
        dataset = dataset.with_options(options)
    return strategy.experimental_distribute_dataset(dataset)


def broadcast_from_first_replica(strategy: tf.distribute.Strategy, variables) -> None:
    """Sets every replica's copy of ``variables`` to replica 0's (the chief's): after a restore
    that only the chief could make, every worker continues from the same state."""
    if strategy.num_replicas_in_sync == 1:
        return

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        first = tf.equal(ctx.replica_id_in_sync_group, 0)
        out = [None] * len(variables)
        # One all-reduce per dtype (they are packed together); integer state (steps, data
        # position, RNG state) is summed as integers: exact.
        for dtype in {v.dtype for v in variables}:
            idx = [i for i, v in enumerate(variables) if v.dtype == dtype]
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                    [variables[i] * tf.cast(first, dtype) for i in idx])
            for i, value in zip(idx, summed):
                out[i] = value
        return out

    summed = strategy.run(tf.function(replica_fn))
    for var, value in zip(variables, summed):
        var.assign(strategy.experimental_local_results(value)[0])


def _reduce(strategy, per_replica: Mapping, op=tf.distribute.ReduceOp.SUM) -> dict:
    if strategy.num_replicas_in_sync == 1:
        return dict(per_replica)
    return {k: strategy.reduce(op, v, axis=None) for k, v in per_replica.items()}


def _sum_stats(strategy, per_replica: Mapping) -> dict:
    return _reduce(strategy, per_replica, tf.distribute.ReduceOp.SUM)


def _read_jsonl(path: str) -> list[dict]:
    """The complete records of a jsonl log (a line cut short by a kill is dropped)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class Trainer:
    """Runs a model's training to ``train_steps`` with checkpoints and logs in work_dir.

    Args:
      strategy: the tf.distribute strategy the model and optimizer were built under.
      model, optimizer: see the module docstring and runtime/optimizer.py.
      work_dir: where checkpoints/, tensorboard/ and the logs go.
      config: the loop's cadence and options.
      metrics_fn: summed stats -> metrics dict (must hold "loss").
      progress: reports a progress line.
      on_checkpoint: called after each checkpoint is written (a gs:// run uploads it then).
      eval_dataset: () -> the held-out dataset evaluated every ``config.eval_every`` steps.
    """

    def __init__(self, strategy: tf.distribute.Strategy, model: tf.Module, optimizer,
                 work_dir: str, config: TrainLoopConfig,
                 metrics_fn: Callable[[Mapping[str, float]], dict],
                 progress: Callable[[str], None] = print,
                 on_checkpoint: Callable[[], None] | None = None,
                 eval_dataset: Callable[[], tf.data.Dataset] | None = None):
        self.strategy = strategy
        self.on_checkpoint = on_checkpoint
        self.model = model
        self.optimizer = optimizer
        self.work_dir = work_dir
        self.config = config
        self.metrics_fn = metrics_fn
        self.progress = progress
        self.eval_dataset = eval_dataset
        replicas = strategy.num_replicas_in_sync
        k = max(int(config.grad_accum_steps), 1)
        if config.batch_size % (replicas * k):
            raise ValueError(
                f"batch_size {config.batch_size} must be a multiple of replicas ({replicas}) "
                f"x grad_accum_steps ({k}): each replica splits its batch into "
                f"{k} micro-batch(es)")
        self._names_and_vars = list(model.google_variables().items())
        with strategy.scope():
            optimizer.build(dict(self._names_and_vars))
            # Batches consumed so far: the data position a resumed run skips to.
            self.batches_consumed = tf.Variable(
                0, dtype=tf.int64, name="batches_consumed",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.loss_scale = (DynamicLossScale() if config.compute_dtype == "mixed_float16"
                               else None)
        # Set by SIGTERM (PreemptionWatcher); the host loop reads it before every step.
        self.stop_requested = tf.Variable(False, trainable=False, name="stop_requested")
        tracked = dict(model=model, optimizer=optimizer, batches_consumed=self.batches_consumed)
        if self.loss_scale is not None:
            tracked["loss_scale"] = self.loss_scale
        self.checkpoint = tf.train.Checkpoint(**tracked)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(work_dir, CHECKPOINT_SUBDIR),
            max_to_keep=config.keep_checkpoints, checkpoint_name="ckpt",
            step_counter=optimizer.iterations)
        self._loop_fn = self._build_loop()
        self._eval_step = None

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def _state_variables(self) -> list:
        """Everything a checkpoint holds: weights, optimizer slots and step, data position."""
        seen, out = set(), []
        for module in (self.model, self.optimizer, self.loss_scale):
            for v in (module.variables if module is not None else ()):
                if id(v) not in seen:
                    seen.add(id(v))
                    out.append(v)
        out.append(self.batches_consumed)
        return out

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
        k = max(int(self.config.grad_accum_steps), 1)
        loss_scale, stop = self.loss_scale, self.stop_requested

        def gradients(features, denominators):
            with tf.GradientTape() as tape:
                stats = model.loss_stats(features, training=True)
                loss = model.objective(stats, denominators)
                if loss_scale is not None:
                    loss *= loss_scale.scale
            return tape.gradient(loss, variables), stats

        # jit_compile on one replica: the whole step is one XLA computation (step_fn below).
        whole_step_xla = self.config.jit_compile and replicas == 1
        apply = optimizer.apply
        if replicas == 1 and not whole_step_xla:
            # The update compiled by XLA even without jit_compile: ~10 elementwise passes
            # over every variable and its slots become one (3-5% of a step on CPU). Under
            # MirroredStrategy the update stays as it is: its variables are mirrored.
            apply = tf.function(optimizer.apply, jit_compile=True)
        if self.config.jit_compile and replicas > 1:
            gradients = tf.function(gradients, jit_compile=True)

        def accumulated(features, denominators):
            # [b, ...] -> [k, b / k, ...]: micro-batch j holds examples j*b/k .. (j+1)*b/k-1.
            split = {}
            for name, t in features.items():
                b = t.shape[0] if t.shape[0] is not None else tf.shape(t)[0]
                split[name] = tf.reshape(t, tf.concat([[k, b // k], tf.shape(t)[1:]], 0))
            grads, stats = gradients({n: t[0] for n, t in split.items()}, denominators)
            grads = [tf.convert_to_tensor(g) for g in grads]
            for j in tf.range(1, k):
                g, s = gradients({n: t[j] for n, t in split.items()}, denominators)
                grads = [a + tf.convert_to_tensor(b) for a, b in zip(grads, g)]
                stats = {n: stats[n] + s[n] for n in stats}
            return grads, stats

        def step_fn(features):
            denominators = model.loss_denominators(features)
            ctx = tf.distribute.get_replica_context()
            if replicas > 1:
                denominators = ctx.all_reduce(tf.distribute.ReduceOp.SUM, denominators)
            grads, stats = (gradients if k == 1 else accumulated)(features, denominators)
            if replicas > 1:
                grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            finite = None
            extras = {}
            # Dense first: the norm of an IndexedSlices (a gather's gradient) is the norm of
            # its values, wrong when an index repeats.
            grads = [tf.convert_to_tensor(g) for g in grads]
            if loss_scale is not None:
                extras["loss_scale"] = loss_scale.scale.read_value()
                grads = [g / extras["loss_scale"] for g in grads]
            norm = tf.linalg.global_norm(grads)
            if loss_scale is not None:
                finite = tf.math.is_finite(norm)
            apply(grads, variables, global_norm=norm, update_if=finite)
            if loss_scale is not None:
                loss_scale.update(finite)
                extras["skipped_steps"] = 1.0 - tf.cast(finite, tf.float32)
            extras["grad_norm"] = norm
            return stats, extras

        if whole_step_xla:
            step_fn = tf.function(step_fn, jit_compile=True)

        def one_step(iterator):
            stats, extras = strategy.run(step_fn, args=(next(iterator),))
            return (_reduce(strategy, stats, tf.distribute.ReduceOp.SUM),
                    _reduce(strategy, extras, tf.distribute.ReduceOp.MEAN))

        extra_keys = ["grad_norm"] + (["loss_scale", "skipped_steps"] if loss_scale else [])

        @tf.function
        def loop(iterator, num_steps):
            # One traced step in the graph (totals start at zero, not at a first step).
            totals = {name: tf.zeros([]) for name in model.STAT_KEYS}
            extras = {name: tf.zeros([]) for name in extra_keys}
            done = tf.constant(0, tf.int32)
            while tf.logical_and(done < num_steps, tf.logical_not(stop.read_value())):
                stats, more = one_step(iterator)
                totals = {n: totals[n] + stats[n] for n in totals}
                extras = {n: extras[n] + more[n] for n in extras}
                done += 1
            return totals, extras, done

        return loop

    def run_steps(self, iterator, num_steps: int) -> dict:
        """Runs ``num_steps`` training steps on ``iterator`` (from ``distribute``) with the
        compiled host loop, and nothing else (no logs, checkpoints or signal handling):
        for benchmarks. Returns the summed stats and ``steps``."""
        totals, extras, done = self._loop_fn(iterator, tf.constant(num_steps))
        self.batches_consumed.assign_add(tf.cast(done, tf.int64))
        return {**{k: float(v) for k, v in totals.items()},
                **{k: float(v) for k, v in extras.items()}, "steps": int(done)}

    def _evaluate(self) -> dict:
        if self._eval_step is None:
            strategy, model = self.strategy, self.model

            @tf.function(reduce_retracing=True)
            def step(features):
                return _sum_stats(strategy, strategy.run(
                    lambda f: model.loss_stats(f, training=False), args=(features,)))

            self._eval_step = step
        totals: dict = {}
        for features in distribute(self.strategy, self.eval_dataset()):
            for k, v in self._eval_step(features).items():
                totals[k] = totals.get(k, 0.0) + float(v)
        return totals

    def _trim_logs(self, step: int) -> None:
        # A run killed between a log line and its checkpoint logged steps it will redo.
        for name in (TRAIN_LOG, EVAL_LOG):
            path = os.path.join(self.work_dir, name)
            if os.path.exists(path):
                kept = [r for r in _read_jsonl(path) if r.get("step", 0) <= step]
                with open(path, "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in kept)

    def _save(self, step: int) -> float:
        """Writes ckpt-<step> and syncs it; returns the seconds it took."""
        t0 = time.perf_counter()
        self.manager.save(checkpoint_number=step)
        if self.on_checkpoint is not None:
            self.on_checkpoint()
        return time.perf_counter() - t0

    def train(self, make_dataset: Callable[[int], tf.data.Dataset]) -> dict:
        """Trains from the latest checkpoint (or from scratch) to ``train_steps``.

        Args:
          make_dataset: skip_batches -> the deterministic, repeated, batched dataset with
            that many batches skipped.

        Returns:
          Summary: step, the last window's metrics, examples_per_second (steady state, the
          first call's tracing excluded), resumed_from (checkpoint prefix or None),
          steps_trained, checkpoint, and ``eval`` (the last held-out metrics) if any.

        Raises:
          FloatingPointError: the loss became NaN or Inf.
          Preempted: SIGTERM arrived; a checkpoint at the step reached was written.
          DeadlineReached: ``config.deadline`` came; a checkpoint was written.
        """
        cfg = self.config
        os.makedirs(self.work_dir, exist_ok=True)
        resumed_from = self.restore_latest()
        if cluster.is_multi_worker():
            # Only the chief reads the stage's checkpoints (the others work in private dirs).
            broadcast_from_first_replica(self.strategy, self._state_variables())
        start = self.step
        self._trim_logs(start)
        if resumed_from:
            self.progress(f"resuming from {resumed_from} at step {start}/{cfg.train_steps} "
                          f"({int(self.batches_consumed.numpy())} batches consumed)")
        if start >= cfg.train_steps:
            last = (_read_jsonl(os.path.join(self.work_dir, TRAIN_LOG)) or [{}])[-1]
            return {**last, "step": start, "resumed_from": resumed_from, "steps_trained": 0}
        if cfg.deadline is not None and time.time() >= cfg.deadline:
            raise DeadlineReached(start, resumed_from)

        self.stop_requested.assign(False)
        skip = int(self.batches_consumed.numpy())
        iterator = iter(distribute(self.strategy, make_dataset(skip)))
        writer = tf.summary.create_file_writer(os.path.join(self.work_dir, TENSORBOARD_SUBDIR))
        try:
            with PreemptionWatcher(self.stop_requested) as watcher:
                return self._run(iterator, writer, watcher, start, resumed_from)
        finally:
            writer.close()

    def _next_call_steps(self, step: int) -> int:
        cfg = self.config
        n = min(cfg.steps_per_loop, cfg.train_steps - step,
                cfg.log_every - step % cfg.log_every,
                cfg.checkpoint_every - step % cfg.checkpoint_every)
        if cfg.eval_every and self.eval_dataset is not None:
            n = min(n, cfg.eval_every - step % cfg.eval_every)
        return n

    def _run(self, iterator, writer, watcher, start, resumed_from) -> dict:
        cfg = self.config
        log_path = os.path.join(self.work_dir, TRAIN_LOG)
        window: dict = {}
        extras_window: dict = {}
        window_start, window_steps, window_compute = time.perf_counter(), 0, 0.0
        steady_time, steady_steps, first_call = 0.0, 0, True
        step, metrics, eps, eval_metrics = start, {}, float("nan"), None
        saved_step = checkpoint_step(resumed_from) if resumed_from else None
        params = sum(v.shape.num_elements() for _, v in self._names_and_vars)
        step_seconds, save_seconds = None, 1.0 + 12.0 * params / _ASSUMED_SAVE_BYTES_PER_SECOND

        def stop(error_cls, **kw):
            nonlocal saved_step
            if step != saved_step:
                self._save(step)
                saved_step = step
            writer.flush()
            error = error_cls(step, self.manager.latest_checkpoint, **kw)
            self.progress(str(error))
            raise error

        while step < cfg.train_steps:
            if watcher.requested:
                stop(Preempted, reason=watcher.requested)
            n = self._next_call_steps(step)
            if cfg.deadline is not None:
                if step_seconds is None:
                    n = 1  # time a step (the first call's is tracing) before planning
                else:
                    left = cfg.deadline - time.time() - 2.0 * save_seconds - step_seconds
                    n = min(n, int(left // step_seconds))
                    if n <= 0:
                        stop(DeadlineReached)
            t0 = time.perf_counter()
            totals, extras, done = self._loop_fn(iterator, tf.constant(n))
            totals = {k: float(v) for k, v in totals.items()}
            extras = {k: float(v) for k, v in extras.items()}
            done = int(done)
            elapsed = time.perf_counter() - t0
            if done == 0:  # SIGTERM came before the first step of the call
                stop(Preempted, reason=watcher.requested or "SIGTERM")
            if first_call:  # tracing and compiling: not a step time
                first_call = False
            else:
                step_seconds = elapsed / done
                steady_time += elapsed
                steady_steps += done
            step += done
            self.batches_consumed.assign_add(done)
            window = {k: window.get(k, 0.0) + v for k, v in totals.items()}
            extras_window = {k: extras_window.get(k, 0.0) + v for k, v in extras.items()}
            window_steps += done
            window_compute += elapsed
            if not all(math.isfinite(v) for v in totals.values()):
                raise FloatingPointError(
                    f"loss became NaN/Inf between steps {step - done} and {step}; the last "
                    f"good checkpoint is "
                    f"{self.manager.latest_checkpoint or 'none (none saved yet)'}"
                    ": lower the learning rate or check the data, then re-run to resume")
            if watcher.requested:
                stop(Preempted, reason=watcher.requested)
            at_end = step >= cfg.train_steps
            if step % cfg.log_every == 0 or at_end:
                now = time.perf_counter()
                metrics = self.metrics_fn(window)
                window_eps = window_steps * cfg.batch_size / max(now - window_start, 1e-9)
                eps = (steady_steps * cfg.batch_size / steady_time) if steady_time else window_eps
                lr = float(self.optimizer.schedule(step - 1))
                extra_means = {k: v / window_steps for k, v in extras_window.items()}
                extra_means["step_time"] = window_compute / window_steps
                self._log(writer, log_path, step, metrics, lr, window_eps, extra_means)
                remaining = (cfg.train_steps - step) * cfg.batch_size / eps if eps else math.inf
                accs = " ".join(f"{k} {v:.3f}" for k, v in metrics.items()
                                if k.endswith("accuracy"))
                self.progress(f"step {step}/{cfg.train_steps} loss {metrics['loss']:.4f} "
                              f"{accs} lr {lr:.2e} grad_norm {extra_means['grad_norm']:.3f} "
                              f"{window_eps:.1f} ex/s ETA {_format_eta(remaining)}")
                window, extras_window = {}, {}
                window_start, window_steps, window_compute = now, 0, 0.0
            if cfg.eval_every and self.eval_dataset is not None and (
                    step % cfg.eval_every == 0):
                t_eval = time.perf_counter()
                eval_metrics = self.metrics_fn(self._evaluate())
                self._log_eval(writer, step, eval_metrics)
                self.progress(f"step {step}: held-out " + " ".join(
                    f"{k} {v:.4f}" for k, v in eval_metrics.items()))
                window_start += time.perf_counter() - t_eval  # not training time
            if step % cfg.checkpoint_every == 0 or at_end:
                writer.flush()
                save_seconds = self._save(step)
                saved_step = step
                window_start += save_seconds
        out = {"step": step, **metrics, "examples_per_second": eps,
               "resumed_from": resumed_from, "steps_trained": step - start,
               "checkpoint": self.manager.latest_checkpoint}
        if eval_metrics is not None:
            out["eval"] = eval_metrics
        return out

    def _log(self, writer, log_path, step, metrics, lr, eps, extras) -> None:
        with writer.as_default(step=step):
            for k, v in metrics.items():
                write_scalar(k, v, step)
            write_scalar("learning_rate", lr, step)
            write_scalar("examples_per_second", eps, step)
            for k, v in extras.items():
                write_scalar(k, v, step)
        writer.flush()
        record = {"step": step, **{k: round(v, 6) for k, v in metrics.items()},
                  "learning_rate": lr, "examples_per_second": round(eps, 2),
                  **{k: round(v, 6) for k, v in extras.items()},
                  "batches_consumed": int(self.batches_consumed.numpy()),
                  "time": round(time.time(), 3)}
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def _log_eval(self, writer, step, metrics) -> None:
        with writer.as_default(step=step):
            for k, v in metrics.items():
                write_scalar(f"eval/{k}", v, step)
        writer.flush()
        record = {"step": step, **{k: round(v, 6) for k, v in metrics.items()},
                  "time": round(time.time(), 3)}
        with open(os.path.join(self.work_dir, EVAL_LOG), "a") as f:
            f.write(json.dumps(record) + "\n")


def evaluate_totals(strategy: tf.distribute.Strategy, model: tf.Module,
                    dataset: tf.data.Dataset) -> dict:
    """Sums ``model.loss_stats(features, training=False)`` over one pass of ``dataset``."""

    @tf.function(reduce_retracing=True)
    def step(features):
        return _sum_stats(strategy, strategy.run(lambda f: model.loss_stats(f, training=False),
                                                 args=(features,)))

    totals: dict = {}
    for features in distribute(strategy, dataset):
        for k, v in step(features).items():
            totals[k] = totals.get(k, 0.0) + float(v)
    return totals
