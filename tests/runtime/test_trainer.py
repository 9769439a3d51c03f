"""The training loop in one process: gradient accumulation, XLA, compute dtypes, the
deadline, the SIGTERM watcher, held-out evaluation, TensorBoard scalars and what
examples/s counts on packed rows."""

import dataclasses
import glob
import json
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.support.runtime import (TINY_MODEL, TINY_PRED, TINY_SEQ, make_ctx, make_instance,
                      pretrain_params)
from runexp.compiler import wall_time
from runexp.runtime import checkpoints, trainer as trainer_module
from runexp.runtime.model import BertConfig, BertPretrainer
from runexp.compiler.specs import OptimizerSpec
from runexp.runtime.optimizer import optimizer_from_spec
from runexp.runtime.preemption import DeadlineReached, PreemptionWatcher
from runexp.runtime.stages import pretrain
from runexp.runtime.stop_planner import StopPlanner
from runexp.runtime.throughput import examples_in
from runexp.runtime.train_loop_config import TrainLoopConfig
from runexp.runtime.train_log import pretraining_metrics
from runexp.runtime.trainer import Trainer
from runexp.tasks.instances.packing import pack_batch

NO_DROPOUT = dict(TINY_MODEL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _batch(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    rows = [make_instance(rng, TINY_MODEL["vocab_size"], TINY_SEQ, TINY_PRED) for _ in range(n)]
    return {k: np.array([r[k] for r in rows], np.float32 if k == "masked_lm_weights"
                        else np.int32) for k in rows[0]}


def _train_on(batch: dict, work_dir: str, steps: int = 2, optimizer: str = "adamw",
              model_config: dict = NO_DROPOUT, **loop) -> tuple[dict, list]:
    """Trains a fresh seeded tiny model (by default without dropout) on ``batch`` repeated,
    logging every step; (its weights, the train_log records)."""
    tf.random.set_seed(0)
    model = BertPretrainer(BertConfig.from_dict(model_config), xla=loop.get("jit_compile", False))
    opt = optimizer_from_spec(OptimizerSpec(optimizer=optimizer, learning_rate=1e-3), 100, 32)
    config = TrainLoopConfig(**{"train_steps": steps, "batch_size": len(batch["input_ids"]),
                                "steps_per_loop": steps, "log_every": 1,
                                "checkpoint_every": steps, "jit_compile": False, **loop})
    trainer = Trainer(tf.distribute.get_strategy(), model, opt, work_dir, config,
                      pretraining_metrics, progress=lambda _: None)
    trainer.train(lambda skip: tf.data.Dataset.from_tensors(batch).repeat())
    with open(os.path.join(work_dir, "train_log.jsonl")) as f:
        log = [json.loads(line) for line in f]
    return {n: v.numpy() for n, v in model.google_variables().items()}, log


def test_gradient_accumulation_gives_the_whole_batch_update(tmp_path):
    # Masked positions differ per example, so equal updates need the loss of every
    # micro-batch divided by the whole batch's totals.
    batch = _batch(8)
    whole, whole_log = _train_on(batch, str(tmp_path / "k1"))
    for k in (2, 4):
        split, log = _train_on(batch, str(tmp_path / f"k{k}"), grad_accum_steps=k)
        for a, b in zip(log, whole_log):
            # The pre-clipping gradient norm and the loss: the same sums in another order.
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        for name, value in whole.items():
            # Adam turns a gradient error dg into at most lr * (1 - beta1) * dg / epsilon
            # = 100 dg per step; float32 sums in another order differ by dg <~ 1e-7 (the
            # gradient's own scale is <= 0.3), hence 2e-5 for two steps. A wrong split or
            # normalisation moves weights by ~lr = 1e-3.
            np.testing.assert_allclose(split[name], value, atol=2e-5, err_msg=f"k={k} {name}")
    with pytest.raises(ValueError, match="multiple of replicas .1. x grad_accum_steps .3."):
        _train_on(batch, str(tmp_path / "k3"), grad_accum_steps=3)


def test_xla_compiled_step_runs_on_cpu_and_matches(tmp_path):
    batch = _batch(8, seed=1)
    plain, plain_log = _train_on(batch, str(tmp_path / "plain"), optimizer="lamb")
    xla, xla_log = _train_on(batch, str(tmp_path / "xla"), optimizer="lamb", jit_compile=True)
    for a, b in zip(xla_log, plain_log):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for name, value in plain.items():
        # XLA fuses and reorders float32 arithmetic (seen: 2e-7); bound as for accumulation.
        np.testing.assert_allclose(xla[name], value, atol=2e-5, err_msg=name)
    # With dropout: its masks come from ThreeFry keys drawn from the generator, inside the
    # compiled function.
    _, dropped = _train_on(batch, str(tmp_path / "drop"), model_config=TINY_MODEL,
                           jit_compile=True)
    assert np.isfinite(dropped[-1]["loss"]) and dropped[-1]["loss"] != xla_log[-1]["loss"]


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "mixed_float16"])
def test_reduced_precision_trains_on_cpu(compute_dtype, pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    work_dir = str(tmp_path / "pt")
    summary = pretrain.run(make_ctx("pretrain", pretrain_params(
        train_steps=20, log_every=10, checkpoint_every=20, compute_dtype=compute_dtype),
        {"data_dir": data_dir, "vocab_dir": vocab_dir}, work_dir)).to_dict()
    assert summary["step"] == 20 and np.isfinite(summary["loss"])
    with open(os.path.join(work_dir, "train_log.jsonl")) as f:
        log = [json.loads(line) for line in f]
    assert log[-1]["loss"] < log[0]["loss"]
    names = tf.train.load_checkpoint(
        checkpoints.latest_checkpoint(os.path.join(work_dir, "checkpoints"))
    ).get_variable_to_shape_map()
    # Dynamic loss scaling (float16 only) is part of the checkpoint.
    assert any(n.startswith("loss_scale/") for n in names) == (compute_dtype == "mixed_float16")
    if compute_dtype == "mixed_float16":
        assert 0 < log[-1]["loss_scale"] <= 2 ** 15


@pytest.mark.parametrize("optimizer", ["lamb", "amos"])
def test_pretrain_learns_with_lamb_and_amos(optimizer, pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    lr = {"lamb": 0.03, "amos": 0.1}[optimizer]
    summary = pretrain.run(make_ctx("pretrain", pretrain_params(
        train_steps=60, log_every=20, checkpoint_every=60, optimizer=optimizer,
        learning_rate=lr, decay="polynomial", decay_power=0.5),
        {"data_dir": data_dir, "vocab_dir": vocab_dir}, str(tmp_path / "pt"))).to_dict()
    assert summary["step"] == 60
    with open(tmp_path / "pt" / "train_log.jsonl") as f:
        log = [json.loads(line) for line in f]
    assert log[-1]["loss"] < log[0]["loss"] - 0.3, log


def _startup_seconds(params: dict, inputs: dict, work_dir: str) -> float:
    """Trains 3 steps into ``work_dir`` and returns how long building the model, tracing,
    the steps and a checkpoint took, on this machine as busy as it is now: budgets below
    are multiples of it."""
    t0 = time.monotonic()
    pretrain.run(make_ctx("pretrain", dict(params, train_steps=3), inputs, work_dir)).to_dict()
    return time.monotonic() - t0


def _last_record(work_dir: str) -> dict:
    with open(os.path.join(work_dir, "train_log.jsonl")) as f:
        return json.loads(f.read().splitlines()[-1])


def _budget_after_tracing(monkeypatch, budget_s: float) -> list:
    """Makes the trainer's stop planners take their deadline ``budget_s`` after the loop's
    first call (tracing) ended, with the automatic margin of that budget: how long a second
    start-up and its tracing take on a busy machine (which can be many times the first's)
    leaves the budget whole. The run's own deadline only has to let the first call start.
    Returns the planners made, in order."""
    planners = []

    class BudgetAfterTracing(StopPlanner):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            planners.append(self)

        def record_call(self, steps, seconds, tracing=False):
            if tracing:
                self.deadline = self.clock() + budget_s
                self.margin_s = wall_time.default_margin_s(budget_s, None)
            super().record_call(steps, seconds, tracing)

    monkeypatch.setattr(trainer_module, "StopPlanner", BudgetAfterTracing)
    return planners


def test_deadline_stops_with_a_checkpoint_and_resumes(pretrain_data, tmp_path, monkeypatch):
    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    work_dir = str(tmp_path / "pt")
    params = pretrain_params(train_steps=100_000, log_every=1000, checkpoint_every=1000,
                             steps_per_loop=50)
    budget = 2 * _startup_seconds(params, inputs, work_dir)
    planners = _budget_after_tracing(monkeypatch, budget)
    messages = []
    with pytest.raises(DeadlineReached) as info:
        pretrain.run(make_ctx("pretrain", dict(params, deadline_unix=time.time() + 3600),
                              inputs, work_dir, messages)).to_dict()
    stopped_at = time.time()
    deadline = planners[-1].deadline
    e = info.value
    assert stopped_at < deadline and e.exit_code == 124, "\n".join(messages)
    assert e.seconds_left >= deadline - stopped_at > 0  # complete before the stop returned
    # How far it got depends on how busy the machine is (a step may take far longer than
    # while the start-up was timed); what users rely on: it stopped in time, with a whole
    # checkpoint of the step it reached, and continues from it.
    assert e.step >= 3 and e.checkpoint.endswith(f"ckpt-{e.step}")
    assert checkpoints.latest_checkpoint(os.path.join(work_dir, "checkpoints")) == e.checkpoint
    assert any("wall-time budget:" in m and "expected to reach" in m for m in messages)
    assert any("stopped by the wall-time budget" in m and "before the deadline" in m
               for m in messages)
    record = _last_record(work_dir)  # what `runexp status` can show
    assert record["event"] == "deadline_stop" and record["step"] == e.step
    assert record["deadline_seconds_left"] == round(e.seconds_left, 2) > 0
    # A deadline already past stops at once, with nothing new to save.
    with pytest.raises(DeadlineReached) as past:
        pretrain.run(make_ctx("pretrain", dict(params, deadline_unix=time.time() - 1), inputs,
                              work_dir)).to_dict()
    assert (past.value.step, past.value.checkpoint) == (e.step, e.checkpoint)
    resumed = pretrain.run(make_ctx("pretrain", dict(params, train_steps=e.step + 3,
                                                     deadline_unix=None), inputs, work_dir)).to_dict()
    assert resumed["resumed_from"] == e.checkpoint and resumed["steps_trained"] == 3
    assert resumed["batches_consumed"] == e.step + 3
    assert resumed["loss"] is not None  # the stop record is not taken for metrics


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("left_after_first_call, checkpoint_every, saved", [
    (3.0, 1000, False),  # the stop: less left than the 5 s checkpoint takes
    (3.0, 1, False),  # the same at a checkpoint boundary
    (8.0, 1000, True),  # inside the 10 s margin, but the checkpoint still ends in time
], ids=["stop", "boundary", "within-the-margin"])
def test_a_first_call_that_overran_never_checkpoints_after_the_deadline(
        tmp_path, monkeypatch, left_after_first_call, checkpoint_every, saved):
    """A slow start-up on a busy machine: the first call (tracing) ends with less time left
    than the plan allowed. On a fake clock, that call takes all but ``left_after_first_call``
    seconds of a 100 s budget, and a checkpoint's sync 5 s. A checkpoint that would be
    complete only after the deadline is not started: the stop keeps ckpt-2 and says so."""
    clock = FakeClock()
    synced, messages = [], []  # (the latest checkpoint, when its sync ended); progress
    config = TrainLoopConfig(train_steps=2, batch_size=8, jit_compile=False, steps_per_loop=2,
                             log_every=1, checkpoint_every=2)
    trainer = Trainer(tf.distribute.get_strategy(),
                      BertPretrainer(BertConfig.from_dict(NO_DROPOUT), xla=False),
                      optimizer_from_spec(OptimizerSpec(optimizer="adamw", learning_rate=1e-3),
                                          100, 32),
                      str(tmp_path / "pt"), config, pretraining_metrics,
                      progress=messages.append,
                      on_checkpoint=lambda: (clock.advance(5.0), synced.append(
                          (os.path.basename(trainer.manager.latest_checkpoint), clock()))))
    data = lambda skip: tf.data.Dataset.from_tensors(_batch(8)).repeat()  # noqa: E731
    trainer.train(data)  # ckpt-2, before any deadline
    synced.clear()
    planner = StopPlanner(clock() + 100.0, margin_s=10.0, assumed_save_s=5.0, clock=clock)
    monkeypatch.setattr(trainer, "_stop_planner", lambda: planner)
    loop, calls = trainer._loop_fn, []

    def first_call_overruns(iterator, num_steps):
        out = loop(iterator, num_steps)
        calls.append(int(num_steps))
        clock.advance(100.0 - left_after_first_call if len(calls) == 1 else 0.01)
        return out

    trainer._loop_fn = first_call_overruns
    trainer.config = dataclasses.replace(config, train_steps=100, deadline=planner.deadline,
                                         checkpoint_every=checkpoint_every)
    with pytest.raises(DeadlineReached) as info:
        trainer.train(data)
    e, log = info.value, "\n".join(messages)
    assert calls == [1], log  # no call after it
    checkpoints_synced = [(name, t) for name, t in synced if name != "ckpt-2"]
    record = _last_record(str(tmp_path / "pt"))
    assert record["event"] == "deadline_stop"
    if saved:
        assert (e.step, os.path.basename(e.checkpoint)) == (3, "ckpt-3")
        assert checkpoints_synced[0] == ("ckpt-3", planner.deadline - 3.0)
        assert e.seconds_left == pytest.approx(3.0) and "unsaved_steps" not in record
    else:
        # Nothing was started that would end after the deadline; ckpt-2 stays the latest.
        assert checkpoints_synced == []
        assert (e.step, os.path.basename(e.checkpoint)) == (2, "ckpt-2")
        assert checkpoints.latest_checkpoint(str(tmp_path / "pt" / "checkpoints")) == \
            e.checkpoint
        assert e.seconds_left is None  # this run completed no checkpoint
        assert any("not enough to complete a checkpoint" in m and "trains step 3 again" in m
                   for m in messages), log
        assert (record["step"], record["unsaved_steps"]) == (2, 1)
        assert record["deadline_seconds_left"] is None


def test_a_run_that_slows_down_still_checkpoints_before_the_deadline(tmp_path, monkeypatch):
    """Every checkpoint's sync (a gs:// upload) takes 1 s longer than the one before, and
    after each checkpoint steps take 1.5 times as long: the final checkpoint is slower than
    any measured, the last calls slower than any before them. It must still be complete
    before the deadline. The time is a fake clock the trainer and its stop planner read (the
    calls and syncs advance it by the model above), so what is asserted is the plan, not how
    fast this machine happens to be."""
    clock = FakeClock()
    slow = {"step": 0.0, "save": 0.0}  # fake seconds a step and a sync take
    synced, messages = [], []  # (the latest checkpoint, when its sync ended); progress

    def slow_sync():
        clock.advance(slow["save"])
        synced.append((trainer.manager.latest_checkpoint, clock()))
        if slow["save"]:
            slow["save"] += 1.0
            slow["step"] *= 1.5

    tf.random.set_seed(0)
    batch = _batch(8)
    config = TrainLoopConfig(train_steps=20, batch_size=8, jit_compile=False,
                             steps_per_loop=10, log_every=10, checkpoint_every=10,
                             keep_checkpoints=2)
    trainer = Trainer(tf.distribute.get_strategy(),
                      BertPretrainer(BertConfig.from_dict(NO_DROPOUT), xla=False),
                      optimizer_from_spec(OptimizerSpec(optimizer="adamw", learning_rate=1e-3),
                                          100, 32),
                      str(tmp_path / "pt"), config, pretraining_metrics,
                      progress=messages.append, on_checkpoint=slow_sync)
    data = lambda skip: tf.data.Dataset.from_tensors(batch).repeat()  # noqa: E731
    trainer.train(data)  # traced, 20 steps and 2 checkpoints, before any deadline

    loop = trainer._loop_fn

    def timed_loop(iterator, num_steps):
        out = loop(iterator, num_steps)
        clock.advance(slow["step"] * int(out[2]))
        return out

    trainer._loop_fn = timed_loop
    # The trainer times calls and saves with time.perf_counter and sizes the margin with
    # time.time; its planner reads ``clock``: all the fake clock.
    monkeypatch.setattr(trainer_module, "time", type("FakeTime", (), {
        "perf_counter": staticmethod(clock), "time": staticmethod(clock),
        "monotonic": staticmethod(clock)}))
    monkeypatch.setattr(trainer_module, "StopPlanner",
                        lambda *args, **kw: StopPlanner(*args, clock=clock, **kw))
    slow.update(step=0.2, save=2.0)
    synced.clear()
    deadline = clock() + 120.0
    # The same trainer continues (its loop traced already) with a deadline.
    trainer.config = dataclasses.replace(config, train_steps=100_000, deadline=deadline)
    with pytest.raises(DeadlineReached) as info:
        trainer.train(data)
    e, log = info.value, "\n".join(messages)
    complete = min(t for checkpoint, t in synced if checkpoint == e.checkpoint)
    assert complete < deadline, f"complete {complete - deadline:.2f} s after the deadline\n{log}"
    assert 0 < e.seconds_left <= deadline - complete
    assert len({checkpoint for checkpoint, _ in synced}) >= 3, log  # the slow-down ran
    assert _last_record(str(tmp_path / "pt"))["deadline_seconds_left"] == round(
        e.seconds_left, 2)


def _short_instances(n: int, length: int = 10, predictions: int = 2) -> dict:
    """``n`` instances of at most ``length`` tokens, padded to TINY_SEQ: three fit a row."""
    rng = np.random.default_rng(0)
    rows = [make_instance(rng, TINY_MODEL["vocab_size"], length, predictions)
            for _ in range(n)]
    out = {k: np.array([r[k] for r in rows], np.float32 if k == "masked_lm_weights"
                       else np.int32) for k in rows[0]}
    for k in ("input_ids", "input_mask", "segment_ids"):
        out[k] = np.pad(out[k], [(0, 0), (0, TINY_SEQ - length)])
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_examples_per_second_counts_the_instances_of_packed_rows(tmp_path, monkeypatch,
                                                                 packed):
    """Issue 27: a packed row holds up to three instances, and the train log's and the
    summary's examples_per_second count instances (the model's ``examples`` stat, the
    batch's ``next_sentence_weights``), not rows. On a fake clock each one-step call takes
    1 s: 4 rows a step are 4 examples/s unpacked, 9 instances/s packed."""
    instances = _short_instances(9)
    if packed:
        batch = pack_batch(instances, TINY_SEQ, 3 * 2,
                           groups=[(0, 1, 2), (3, 4, 5), (6, 7), (8,)])
    else:
        batch = {k: v[:4] for k, v in instances.items()}
    assert len(batch["input_ids"]) == 4
    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "time", type("FakeTime", (), {
        "perf_counter": staticmethod(clock), "time": staticmethod(clock),
        "monotonic": staticmethod(clock)}))
    config = TrainLoopConfig(train_steps=3, batch_size=4, jit_compile=False, steps_per_loop=1,
                             log_every=1, checkpoint_every=3)
    trainer = Trainer(tf.distribute.get_strategy(),
                      BertPretrainer(BertConfig.from_dict(NO_DROPOUT), xla=False),
                      optimizer_from_spec(OptimizerSpec(optimizer="adamw", learning_rate=1e-3),
                                          100, 32),
                      str(tmp_path / "pt"), config, pretraining_metrics,
                      progress=lambda _: None)
    loop = trainer._loop_fn

    def one_second_a_call(iterator, num_steps):
        out = loop(iterator, num_steps)
        clock.advance(1.0)
        return out

    trainer._loop_fn = one_second_a_call
    summary = trainer.train(lambda skip: tf.data.Dataset.from_tensors(batch).repeat())
    expected = 9.0 if packed else 4.0
    with open(tmp_path / "pt" / "train_log.jsonl") as f:
        assert [json.loads(line)["examples_per_second"] for line in f] == [expected] * 3
    assert summary["examples_per_second"] == expected  # steady: the calls after tracing


def test_a_model_without_an_examples_stat_counts_rows():
    assert examples_in({"loss_sum": 1.0}, steps=3, batch_size=8) == 24
    assert examples_in({"loss_sum": 1.0, "examples": 20.0}, steps=3, batch_size=8) == 20.0


def test_sigterm_watcher_sets_the_flag_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionWatcher() as watcher:
        assert not bool(watcher.stop_requested.numpy())
        os.kill(os.getpid(), signal.SIGTERM)
        # The helper thread sets the flag as soon as it runs; the bound only ends a hang.
        give_up = time.monotonic() + 120
        while not bool(watcher.stop_requested.numpy()) and time.monotonic() < give_up:
            time.sleep(0.01)
        assert bool(watcher.stop_requested.numpy())
        assert watcher.requested == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_tensorboard_has_gradient_norm_step_time_and_heldout_metrics(pretrained):
    work_dir, summary = pretrained
    tags = set()
    for path in glob.glob(os.path.join(work_dir, "tensorboard", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    assert {"loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "grad_norm",
            "step_time", "examples_per_second", "eval/mlm_accuracy", "eval/loss"} <= tags
    with open(os.path.join(work_dir, "eval_log.jsonl")) as f:
        evals = [json.loads(line) for line in f]
    assert [r["step"] for r in evals] == [60, 120]
    assert evals[-1]["mlm_accuracy"] > evals[0]["mlm_accuracy"] - 0.05
    assert summary["eval"]["mlm_accuracy"] == evals[-1]["mlm_accuracy"] or \
        summary["eval"]["mlm_accuracy"] == pytest.approx(evals[-1]["mlm_accuracy"], abs=1e-6)
