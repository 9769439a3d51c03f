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
  ``train_log.jsonl`` line, and reports progress with an ETA (runtime/log_window.py; an
  example is what the model's ``examples`` stat counts, instances on packed rows:
  runtime/throughput.py);
- every ``eval_every`` steps evaluates the held-out set (``eval_dataset``), written as
  ``eval/*`` scalars and ``eval_log.jsonl`` lines;
- saves ``checkpoints/ckpt-<step>`` every ``checkpoint_every`` steps and at the end, with
  model, optimizer (slots and step), the number of batches consumed (the data position)
  and, for float16, the loss scale; ``on_checkpoint`` makes each durable (a gs:// run
  uploads it): in the background while training goes on when it can (it has ``start()``,
  see runtime/checkpoint_cadence.py), at most one upload in flight, except the last
  checkpoint and a stop's, which are complete when training returns or raises;
- resumes from the latest checkpoint in ``work_dir``: the step continues and the data
  stream skips the batches already consumed;
- on SIGTERM (checked before every step), saves a checkpoint at the step reached and raises
  ``preemption.Preempted`` (runtime/stop_policy.py);
- with a ``deadline``, sizes each call so that the last checkpoint is complete before it
  (runtime/stop_planner.py: measured step and checkpoint times and a margin), then saves and
  raises ``preemption.DeadlineReached``, logging the seconds that were left
  (``deadline_seconds_left``, also in the summary of a run that finished in time). A
  checkpoint that would be complete only after the deadline (a call overran: a slow
  start-up's tracing call on a busy machine) is not started: the stop says so and keeps the
  one before, and the next run trains the steps since again;
- stops on a NaN/Inf loss, naming the last good checkpoint, before saving anything bad.

Usage:
    trainer = Trainer(strategy, model, optimizer, work_dir, TrainLoopConfig(...),
                      metrics_fn=pretraining_metrics, progress=ctx.progress)
    summary = trainer.train(lambda skip: make_dataset(skip_batches=skip))
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable, Mapping, NamedTuple

import tensorflow as tf

from runexp.compiler import wall_time
from runexp.runtime.checkpoint_cadence import CheckpointCadence
from runexp.runtime.checkpoints import CHECKPOINT_SUBDIR, checkpoint_step
from runexp.runtime import cluster
from runexp.runtime.distributed import (broadcast_from_first_replica, distribute, eval_step,
                                        evaluate_totals)
from runexp.runtime.log_window import LogWindow
from runexp.runtime.optimizer import DynamicLossScale
from runexp.runtime.preemption import PreemptionWatcher
from runexp.runtime.stop_planner import StopPlanner
from runexp.runtime.stop_policy import StopPolicy, refuse_a_start_without_time
from runexp.runtime.throughput import Throughput, examples_in
from runexp.runtime.train_log import (TENSORBOARD_SUBDIR, RunLog, format_eta, last_metrics,
                                      trim_logs)
# runtime/stages/evaluate.py, tests and bench import the pretrainer's metrics from here.
from runexp.runtime.train_loop_config import TrainLoopConfig
from runexp.runtime.train_step import build_loop


class _Call(NamedTuple):
    """A call of the compiled loop: the steps it ran, whether it was the first (which traces
    and compiles), and its perf_counter start."""

    steps: int
    tracing: bool
    started: float


@dataclasses.dataclass
class _Run:
    """One ``Trainer.train``: where it started and what its loop has reached."""

    iterator: object
    log: RunLog
    stops: StopPolicy
    checkpoints: CheckpointCadence
    window: LogWindow
    start: int
    resumed_from: str | None
    step: int
    throughput: Throughput = dataclasses.field(default_factory=Throughput)
    calls: int = 0
    metrics: dict = dataclasses.field(default_factory=dict)
    examples_per_second: float = float("nan")
    eval_metrics: dict | None = None


class Trainer:
    """Runs a model's training to ``train_steps`` with checkpoints and logs in work_dir.

    Args:
      strategy: the tf.distribute strategy the model and optimizer were built under.
      model, optimizer: see the module docstring and runtime/optimizer.py.
      work_dir: where checkpoints/, tensorboard/ and the logs go.
      config: the loop's cadence and options.
      metrics_fn: summed stats -> metrics dict (must hold "loss").
      progress: reports a progress line.
      on_checkpoint: called after each checkpoint is written (a gs:// run uploads it then);
        with ``start()``, ``poll()`` and ``wait()`` (as ``ctx.sync`` of a gs:// stage has)
        it uploads in the background (runtime/checkpoint_cadence.py).
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
        return build_loop(self.strategy, self.model, self.optimizer,
                          [v for _, v in self._names_and_vars], self.config,
                          self.loss_scale, self.stop_requested)

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
            self._eval_step = eval_step(self.strategy, self.model)
        return evaluate_totals(self.strategy, self.model, self.eval_dataset(), self._eval_step)

    def train(self, make_dataset: Callable[[int], tf.data.Dataset]) -> dict:
        """Trains from the latest checkpoint (or from scratch) to ``train_steps``.

        Args:
          make_dataset: skip_batches -> the deterministic, repeated, batched dataset with
            that many batches skipped.

        Returns:
          Summary: step, the last window's metrics, examples_per_second (steady state, the
          first call's tracing excluded), resumed_from (checkpoint prefix or None),
          steps_trained, checkpoint, ``eval`` (the last held-out metrics) if any, and with a
          deadline ``deadline_seconds_left`` (when the last checkpoint was complete).

        Raises:
          FloatingPointError: the loss became NaN or Inf.
          Preempted: SIGTERM arrived; a checkpoint at the step reached was written.
          DeadlineReached: ``config.deadline`` came; a checkpoint was written.
        """
        start, resumed_from = self._resume()
        if start >= self.config.train_steps:
            return {**last_metrics(self.work_dir), "step": start, "resumed_from": resumed_from,
                    "steps_trained": 0}
        planner = self._stop_planner()
        refuse_a_start_without_time(planner, start, resumed_from, self.progress)
        self.stop_requested.assign(False)
        skip = int(self.batches_consumed.numpy())
        iterator = iter(distribute(self.strategy, make_dataset(skip)))
        writer = tf.summary.create_file_writer(os.path.join(self.work_dir, TENSORBOARD_SUBDIR))
        # Timed with this module's clock (time.perf_counter), as the loop's calls are.
        checkpoints = CheckpointCadence(
            self.manager, self.on_checkpoint, self.config.checkpoint_every, planner,
            checkpoint_step(resumed_from) if resumed_from else None, time.perf_counter)
        try:
            with PreemptionWatcher(self.stop_requested) as watcher:
                log = RunLog(self.work_dir, writer)
                stops = StopPolicy(watcher, planner, checkpoints, log, self.progress, start,
                                   self.config.train_steps, self.config.checkpoint_every)
                return self._run(_Run(iterator, log, stops, checkpoints,
                                      LogWindow(time.perf_counter()), start, resumed_from,
                                      step=start))
        except Exception:
            checkpoints.settle_after_failure(self.progress)
            raise
        finally:
            writer.close()

    def _resume(self) -> tuple[int, str | None]:
        """Restores the latest checkpoint, if any: (the step training starts at, its
        prefix or None)."""
        os.makedirs(self.work_dir, exist_ok=True)
        resumed_from = self.restore_latest()
        if cluster.is_multi_worker():
            # Only the chief reads the stage's checkpoints (the others work in private dirs).
            broadcast_from_first_replica(self.strategy, self._state_variables())
        start = self.step
        trim_logs(self.work_dir, start)
        if resumed_from:
            self.progress(f"resuming from {resumed_from} at step {start}/"
                          f"{self.config.train_steps} "
                          f"({int(self.batches_consumed.numpy())} batches consumed)")
        return start, resumed_from

    def _stop_planner(self) -> StopPlanner | None:
        """The stop plan for ``config.deadline`` (None without one)."""
        cfg = self.config
        if cfg.deadline is None:
            return None
        params = sum(v.shape.num_elements() for _, v in self._names_and_vars)
        margin = cfg.deadline_margin
        if margin is None:
            margin = wall_time.default_margin_s(cfg.deadline - time.time(), params)
        return StopPlanner(cfg.deadline, margin, wall_time.assumed_save_seconds(params))

    def _next_call_steps(self, step: int) -> int:
        """The steps the next call runs: up to the next log, evaluation or checkpoint."""
        cfg = self.config
        n = min(cfg.steps_per_loop, cfg.train_steps - step,
                cfg.log_every - step % cfg.log_every,
                cfg.checkpoint_every - step % cfg.checkpoint_every)
        if self._evaluates():
            n = min(n, cfg.eval_every - step % cfg.eval_every)
        return n

    def _evaluates(self) -> bool:
        return bool(self.config.eval_every) and self.eval_dataset is not None

    def _run(self, run: _Run) -> dict:
        """The loop: a call, then what is due after it (log, evaluation, checkpoint)."""
        cfg = self.config
        while run.step < cfg.train_steps:
            run.checkpoints.poll()
            run.stops.on_signal(run.step)
            steps = run.stops.call_steps(self._next_call_steps(run.step), run.step)
            call = self._call(run, steps)
            at_end = run.step >= cfg.train_steps
            if run.step % cfg.log_every == 0 or at_end:
                self._log(run)
            # The call and the host work after it.
            run.stops.record_call(call.steps, time.perf_counter() - call.started,
                                  call.tracing, run.step)
            if self._evaluates() and run.step % cfg.eval_every == 0:
                self._evaluate_held_out(run)
            if run.checkpoints.due(run.step, at_end):
                run.stops.before_checkpoint(run.step)  # a call that overran: keep the last
                run.log.writer.flush()
                # The last one is complete when train() returns; the others upload while
                # training goes on.
                run.window.exclude(run.checkpoints.save(run.step, background=not at_end))
        run.checkpoints.settle()  # none after the last save: certainty
        return self._summary(run)

    def _call(self, run: _Run, steps: int) -> _Call:
        """Runs a call of ``steps`` steps; adds it to the window and the step count."""
        started = time.perf_counter()
        totals, extras, done = self._loop_fn(run.iterator, tf.constant(steps))
        totals = {k: float(v) for k, v in totals.items()}
        extras = {k: float(v) for k, v in extras.items()}
        done = int(done)
        elapsed = time.perf_counter() - started
        if done == 0:
            run.stops.interrupted(run.step)
        tracing = run.calls == 0  # the first call traces and compiles
        run.calls += 1
        examples = examples_in(totals, done, self.config.batch_size)
        if not tracing:
            run.throughput.add(done, examples, elapsed)
        run.step += done
        self.batches_consumed.assign_add(done)
        run.window.add(totals, extras, done, examples, elapsed)
        if not all(math.isfinite(v) for v in totals.values()):
            raise FloatingPointError(
                f"loss became NaN/Inf between steps {run.step - done} and {run.step}; the "
                f"last good checkpoint is "
                f"{self.manager.latest_checkpoint or 'none (none saved yet)'}"
                ": lower the learning rate or check the data, then re-run to resume")
        run.stops.on_signal(run.step)
        return _Call(done, tracing, started)

    def _log(self, run: _Run) -> None:
        """The window's train log line, TensorBoard scalars and progress line."""
        cfg, now = self.config, time.perf_counter()
        run.metrics = self.metrics_fn(run.window.stats)
        window_rate = run.window.examples_per_second(now)
        run.examples_per_second = run.throughput.examples_per_second(run.window, now)
        lr = float(self.optimizer.schedule(run.step - 1))
        means = run.window.extra_means()
        run.log.train(run.step, run.metrics, lr, window_rate, means,
                      int(self.batches_consumed.numpy()))
        remaining = (cfg.train_steps - run.step) * run.throughput.seconds_per_step(
            run.window, now)
        accs = " ".join(f"{k} {v:.3f}" for k, v in run.metrics.items()
                        if k.endswith("accuracy"))
        self.progress(f"step {run.step}/{cfg.train_steps} loss {run.metrics['loss']:.4f} "
                      f"{accs} lr {lr:.2e} grad_norm {means['grad_norm']:.3f} "
                      f"{window_rate:.1f} ex/s ETA {format_eta(remaining)}")
        run.window = LogWindow(now)

    def _evaluate_held_out(self, run: _Run) -> None:
        """Evaluates the held-out set, unless it would end too close to the deadline."""
        if not run.stops.eval_fits():
            self.progress(f"step {run.step}: held-out evaluation skipped: it would end too "
                          "close to the wall-time deadline")
            return
        started = time.perf_counter()
        run.eval_metrics = self.metrics_fn(self._evaluate())
        run.log.eval(run.step, run.eval_metrics)
        self.progress(f"step {run.step}: held-out " + " ".join(
            f"{k} {v:.4f}" for k, v in run.eval_metrics.items()))
        seconds = time.perf_counter() - started
        run.window.exclude(seconds)  # not training time
        run.stops.record_eval(seconds)

    def _summary(self, run: _Run) -> dict:
        out = {"step": run.step, **run.metrics, "examples_per_second": run.examples_per_second,
               "resumed_from": run.resumed_from, "steps_trained": run.step - run.start,
               "checkpoint": self.manager.latest_checkpoint}
        if run.eval_metrics is not None:
            out["eval"] = run.eval_metrics
        left = run.stops.seconds_left_at_save()
        if left is not None:
            out["deadline_seconds_left"] = left
        return out
