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
  and, for float16, the loss scale; ``on_checkpoint`` makes each durable (a gs:// run
  uploads it): in the background while training goes on when it can (it has ``start()``,
  see runtime/context.py), at most one upload in flight, except the last checkpoint and a
  stop's, which are complete when training returns or raises;
- resumes from the latest checkpoint in ``work_dir``: the step continues and the data
  stream skips the batches already consumed;
- on SIGTERM (checked before every step), saves a checkpoint at the step reached and raises
  ``preemption.Preempted``;
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
from typing import Callable, Mapping

import tensorflow as tf

from runexp.compiler import wall_time
from runexp.runtime.checkpoints import CHECKPOINT_SUBDIR, checkpoint_step
from runexp.runtime import cluster
from runexp.runtime.distributed import (broadcast_from_first_replica, distribute,  # noqa: F401
                                        eval_step, evaluate_totals, reduce_per_replica)
from runexp.runtime.optimizer import DynamicLossScale
from runexp.runtime.preemption import DeadlineReached, Preempted, PreemptionWatcher
from runexp.runtime.stop_planner import StopPlanner
from runexp.runtime.train_log import (TENSORBOARD_SUBDIR, RunLog,  # noqa: F401
                                      classification_metrics, format_eta,
                                      last_metrics, pretraining_metrics, trim_logs,
                                      write_scalar)
from runexp.runtime.train_loop_config import TrainLoopConfig
from runexp.runtime.train_step import build_loop


@dataclasses.dataclass(frozen=True)
class _Saved:
    """What ``Trainer._save`` did: ``seconds`` training waited for it, ``own_seconds`` of them
    for this checkpoint (not waiting for the upload before); ``previous``, the background
    upload before if it ended during this save (its ``seconds``), else None; ``in_flight``:
    this checkpoint's upload goes on in the background."""

    seconds: float
    own_seconds: float
    previous: object
    in_flight: bool


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
        If it also has ``start()`` (-> True when the upload runs in the background),
        ``poll()`` and ``wait()`` (-> the ended upload with its ``seconds``, or None; raising
        its error), as ``ctx.sync`` of a gs:// stage has (gcs_mirror.StageSync), each
        checkpoint but the last and a stop's is uploaded in the background: a new one first
        waits for the one before, and an upload's error is raised in the training thread
        (between two calls of the loop, at the next checkpoint or at the end).
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

    def _save(self, step: int, background: bool = False) -> "_Saved":
        """Writes ckpt-<step>; waits for the background upload of the checkpoint before, if
        still in flight (this save may just have deleted that one's files, keep-last-K: the
        upload reads a snapshot); then syncs ckpt-<step>, or with ``background`` starts its
        upload if ``on_checkpoint`` can (class docstring)."""
        t0 = time.perf_counter()
        self.manager.save(checkpoint_number=step)
        t1 = time.perf_counter()
        previous = self._upload_ended(block=True)
        waited = time.perf_counter() - t1
        in_flight = False
        if self.on_checkpoint is not None:
            start = getattr(self.on_checkpoint, "start", None) if background else None
            if start is not None:
                in_flight = bool(start())
            else:
                self.on_checkpoint()
        seconds = time.perf_counter() - t0
        return _Saved(seconds, seconds - waited, previous, in_flight)

    def _upload_ended(self, block: bool):
        """The background upload that ended (``block``: waits for the one in flight), or
        None; raises its error."""
        ended = getattr(self.on_checkpoint, "wait" if block else "poll", None)
        return ended() if ended is not None else None

    def _settle_upload(self) -> None:
        """Training failed: lets the upload in flight end, so the last good checkpoint is
        durable; its own error is reported, not raised over the one that ends training."""
        try:
            self._upload_ended(block=True)
        except Exception as e:  # noqa: BLE001 - reported; the first error goes on
            self.progress(f"the checkpoint upload in flight failed too: {e}")

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
        cfg = self.config
        os.makedirs(self.work_dir, exist_ok=True)
        resumed_from = self.restore_latest()
        if cluster.is_multi_worker():
            # Only the chief reads the stage's checkpoints (the others work in private dirs).
            broadcast_from_first_replica(self.strategy, self._state_variables())
        start = self.step
        trim_logs(self.work_dir, start)
        if resumed_from:
            self.progress(f"resuming from {resumed_from} at step {start}/{cfg.train_steps} "
                          f"({int(self.batches_consumed.numpy())} batches consumed)")
        if start >= cfg.train_steps:
            return {**last_metrics(self.work_dir), "step": start, "resumed_from": resumed_from,
                    "steps_trained": 0}
        planner = self._stop_planner()
        if planner is not None and planner.next_call_steps(1) == 0:
            error = DeadlineReached(start, resumed_from)  # nothing trained, nothing to save
            self.progress(
                f"wall-time budget: {planner.seconds_left():.1f} s left when training starts "
                f"(the start-up took the rest), not enough for a step and a checkpoint "
                f"(~{planner.save_seconds:.1f} s) with the {planner.margin_s:.1f} s margin: "
                f"stopping without training or saving anything. {error}")
            raise error

        self.stop_requested.assign(False)
        skip = int(self.batches_consumed.numpy())
        iterator = iter(distribute(self.strategy, make_dataset(skip)))
        writer = tf.summary.create_file_writer(os.path.join(self.work_dir, TENSORBOARD_SUBDIR))
        try:
            with PreemptionWatcher(self.stop_requested) as watcher:
                return self._run(iterator, RunLog(self.work_dir, writer), watcher, start,
                                 resumed_from, planner)
        except Exception:
            self._settle_upload()
            raise
        finally:
            writer.close()

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

    def _deadline_stop_record(self, log: RunLog, planner: StopPlanner, step: int,
                              unsaved_steps: int) -> float | None:
        """Logs (and, on gs://, uploads) how much time was left when the last checkpoint of
        this run was complete (None: it wrote none); returns it. ``step``: the checkpoint's,
        ``unsaved_steps``: the steps trained after it that no checkpoint holds."""
        left = planner.seconds_left_at_save() if planner.last_save_done is not None else None
        log.event(step, "deadline_stop",
                  deadline_seconds_left=round(left, 2) if left is not None else None,
                  margin_s=round(planner.margin_s, 2),
                  checkpoint=os.path.basename(self.manager.latest_checkpoint or ""),
                  **({"unsaved_steps": unsaved_steps} if unsaved_steps else {}))
        if self.on_checkpoint is not None and planner.seconds_left() > 0:
            try:  # the checkpoint is complete already: a failure costs only this record
                self.on_checkpoint()
            except Exception as e:  # noqa: BLE001 - reported, then the stop goes on
                self.progress(f"the stop record was not uploaded: {e}")
        return left

    def _no_time_to_save(self, planner: StopPlanner, step: int, kept: int) -> str:
        """The line saying why the stop at ``step`` writes no checkpoint (``kept``: the step
        a rerun continues from)."""
        after = (f"from {os.path.basename(self.manager.latest_checkpoint)}"
                 if self.manager.latest_checkpoint else "from the start")
        redone = f"step {step}" if step == kept + 1 else f"steps {kept + 1}-{step}"
        wait = planner.upload_wait_s()
        return (f"wall-time budget: {planner.seconds_left():.1f} s left at step {step}, not "
                f"enough to complete a checkpoint (~{planner.save_seconds:.1f} s"
                + (f", after {wait:.1f} s of the upload in flight" if wait else "")
                + f"): stopping without one rather than finishing it after the deadline; the "
                f"next run continues {after} and trains {redone} again")

    def _next_call_steps(self, step: int) -> int:
        cfg = self.config
        n = min(cfg.steps_per_loop, cfg.train_steps - step,
                cfg.log_every - step % cfg.log_every,
                cfg.checkpoint_every - step % cfg.checkpoint_every)
        if cfg.eval_every and self.eval_dataset is not None:
            n = min(n, cfg.eval_every - step % cfg.eval_every)
        return n

    def _run(self, iterator, log: RunLog, watcher, start, resumed_from,
             planner: StopPlanner | None) -> dict:
        cfg = self.config
        window: dict = {}
        extras_window: dict = {}
        window_start, window_steps, window_compute = time.perf_counter(), 0, 0.0
        steady_time, steady_steps, first_call = 0.0, 0, True
        step, metrics, eps, eval_metrics = start, {}, float("nan"), None
        saved_step = checkpoint_step(resumed_from) if resumed_from else None
        uploading = None  # the seconds the checkpoint uploading in the background took here

        def upload_ended(job) -> None:
            """The background upload ended (``job``, None: not yet): the planner learns what
            its checkpoint took, written and uploaded."""
            nonlocal uploading
            if job is not None and uploading is not None:
                if planner is not None:
                    planner.record_save(uploading + job.seconds)
                uploading = None

        def save(background: bool = False) -> float:
            """A checkpoint at ``step``; returns the seconds training waited for it."""
            nonlocal saved_step, uploading
            saved = self._save(step, background)
            saved_step = step
            upload_ended(saved.previous)
            if saved.in_flight:
                uploading = saved.own_seconds
                if planner is not None:
                    planner.record_upload_started()
            elif planner is not None:  # complete: written and uploaded
                planner.record_save(saved.seconds)
            return saved.seconds

        def stop(error_cls, **kw):
            at_deadline = error_cls is DeadlineReached
            if step != saved_step and (not at_deadline or planner.checkpoint_fits()):
                save()
            else:  # the checkpoint before is complete once uploaded
                if step != saved_step:
                    self.progress(self._no_time_to_save(planner, step, saved_step or start))
                upload_ended(self._upload_ended(block=True))
            log.writer.flush()
            kept = saved_step if saved_step is not None else start  # where a rerun resumes
            if at_deadline:
                kw["seconds_left"] = self._deadline_stop_record(log, planner, kept,
                                                                step - kept)
            error = error_cls(kept, self.manager.latest_checkpoint, **kw)
            self.progress(str(error))
            raise error

        while step < cfg.train_steps:
            upload_ended(self._upload_ended(block=False))
            if watcher.requested:
                stop(Preempted, reason=watcher.requested)
            n = self._next_call_steps(step)
            if planner is not None:
                n = planner.next_call_steps(n)
                if n == 0:
                    stop(DeadlineReached)
            t0 = time.perf_counter()
            totals, extras, done = self._loop_fn(iterator, tf.constant(n))
            totals = {k: float(v) for k, v in totals.items()}
            extras = {k: float(v) for k, v in extras.items()}
            done = int(done)
            elapsed = time.perf_counter() - t0
            if done == 0:  # SIGTERM came before the first step of the call
                stop(Preempted, reason=watcher.requested or "SIGTERM")
            tracing, first_call = first_call, False  # the first call traces and compiles
            if not tracing:
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
                log.train(step, metrics, lr, window_eps, extra_means,
                          int(self.batches_consumed.numpy()))
                remaining = (cfg.train_steps - step) * cfg.batch_size / eps if eps else math.inf
                accs = " ".join(f"{k} {v:.3f}" for k, v in metrics.items()
                                if k.endswith("accuracy"))
                self.progress(f"step {step}/{cfg.train_steps} loss {metrics['loss']:.4f} "
                              f"{accs} lr {lr:.2e} grad_norm {extra_means['grad_norm']:.3f} "
                              f"{window_eps:.1f} ex/s ETA {format_eta(remaining)}")
                window, extras_window = {}, {}
                window_start, window_steps, window_compute = now, 0, 0.0
            if planner is not None:  # the call and the host work after it
                planner.record_call(done, time.perf_counter() - t0, tracing=tracing)
                if steady_steps == done and not tracing:  # the first steady call: a forecast
                    self.progress(planner.describe(step, cfg.train_steps, cfg.checkpoint_every))
            if cfg.eval_every and self.eval_dataset is not None and (
                    step % cfg.eval_every == 0):
                if planner is None or planner.eval_fits():
                    t_eval = time.perf_counter()
                    eval_metrics = self.metrics_fn(self._evaluate())
                    log.eval(step, eval_metrics)
                    self.progress(f"step {step}: held-out " + " ".join(
                        f"{k} {v:.4f}" for k, v in eval_metrics.items()))
                    eval_seconds = time.perf_counter() - t_eval
                    window_start += eval_seconds  # not training time
                    if planner is not None:
                        planner.record_eval(eval_seconds)
                else:
                    self.progress(f"step {step}: held-out evaluation skipped: it would end too "
                                  "close to the wall-time deadline")
            if step % cfg.checkpoint_every == 0 or at_end:
                if planner is not None and not planner.checkpoint_fits():
                    stop(DeadlineReached)  # after a call that overran: keep the one before
                log.writer.flush()
                # The last one is complete when train() returns; the others upload while
                # training goes on.
                window_start += save(background=not at_end)
        upload_ended(self._upload_ended(block=True))  # none after the last save: certainty
        out = {"step": step, **metrics, "examples_per_second": eps,
               "resumed_from": resumed_from, "steps_trained": step - start,
               "checkpoint": self.manager.latest_checkpoint}
        if eval_metrics is not None:
            out["eval"] = eval_metrics
        if planner is not None:
            out["deadline_seconds_left"] = round(planner.seconds_left_at_save(), 2)
        return out
