"""pretrain stage: trains BERT's MLM + NSP objectives on the preprocess stage's seqio tasks.

Contract (docs/STAGES.md): params are a ``TrainSpec`` (compiler/specs/train.py); inputs
``data_dir``, ``vocab_dir`` (a mixture: ``data_dirs``, task -> dir, with the param
``mixture_rates``, task -> rate); a pretraining phase after the first also
``previous_phase_dir``: a fresh run starts from that stage's final checkpoint (its weights;
its optimizer's moments too with ``optimizer_state`` "carry"), a resumed one from its own.
Writes ``checkpoints/``, ``tensorboard/``, ``bert_config.json``, ``train_log.jsonl``,
``curves.png`` (runtime/report/curves.py: drawn at the end and at a stop; a failure to draw
is only a warning). Re-running with checkpoints present continues from the latest.

The executor adds ``deadline_unix`` and ``deadline_margin_s`` from
``experiment.wall_time_hours`` and ``wall_time_margin_minutes``: training stops with a
checkpoint complete before the deadline and raises ``preemption.DeadlineReached``; the
summary then holds ``deadline_seconds_left``. SIGTERM always stops with a checkpoint at the
next step and raises ``preemption.Preempted``.

Data: the tasks the input stage directories cache, read through seqio
(runtime/pretraining_data.py); each input host reads its own share
(``seqio.ShardInfo(host, hosts)``, runtime/distributed.py ``PerHostDataset``) at the
per-replica batch size. A phase on packed rows (``packing``) trains on the rows that hold
``batch_size`` instances at the measured packing factor (``batch_counts`` 'instances'), or
on ``batch_size`` rows ('rows'); held-out evaluation reads the unpacked validation split. A
resume starts the stream at the position consumed without reading
what came before; ``data_stream.json`` records the stream's version, and a run started with
an older one resumes with it.
"""

from __future__ import annotations

import dataclasses

import seqio
import tensorflow as tf

from runexp.compiler.packing import rows_per_step
from runexp.compiler.specs import TrainSpec
from runexp.compiler.specs.train import (InitCheckpointReport, PackedBatches, PhaseStart,
                                         PretrainSummary, TrainingEval)
from runexp.runtime import checkpoints, cluster, pretraining_data
from runexp.runtime.distributed import PerHostDataset, broadcast_from_first_replica
from runexp.runtime.bert_config import BertConfig, check_vocab, write_bert_config
from runexp.runtime.model import BertPretrainer, count_parameters
from runexp.runtime.optimizer import optimizer_from_spec
from runexp.runtime.train_log import pretraining_metrics
from runexp.runtime.train_loop_config import TrainLoopConfig
from runexp.runtime.trainer import Trainer
from runexp.runtime.training_stage import TrainingKind, run_training


# Examples per in-training held-out evaluation (eval_every), split between a mixture's
# members with a validation split.
EVAL_EXAMPLES = 2048
# The parts of the pretrainer a Hugging Face directory may lack, by variable prefix.
_HUGGINGFACE_PARTS = (("bert/pooler/", "the pooler"),
                      ("cls/predictions/", "the masked-LM head"),
                      ("cls/seq_relationship/", "the next-sentence head"))


def loop_config(spec: TrainSpec) -> TrainLoopConfig:
    """The training loop a pretrain stage asks for."""
    return TrainLoopConfig(
        train_steps=spec.train_steps, batch_size=spec.batch_size,
        steps_per_loop=spec.steps_per_loop, log_every=spec.log_every,
        checkpoint_every=spec.checkpoint_every, keep_checkpoints=spec.keep_checkpoints,
        jit_compile=bool(spec.jit_compile), grad_accum_steps=spec.grad_accum_steps,
        compute_dtype=spec.compute_dtype, eval_every=spec.eval_every,
        deadline=spec.deadline_unix, deadline_margin=spec.deadline_margin_s)


def data_sources(spec: TrainSpec, inputs) -> tuple[list[str], list[float] | None]:
    """The data dirs to train on and their rates: one task's ``data_dir``, or a mixture's
    ``data_dirs`` (task -> dir) with ``mixture_rates`` (task -> rate), sorted by task name so
    the sampling order never depends on how the gin file listed them."""
    if "data_dirs" not in inputs:
        return [inputs["data_dir"]], None
    rates = spec.mixture_rates
    tasks = sorted(inputs["data_dirs"])
    if set(tasks) != set(rates):
        raise ValueError(f"mixture_rates names {sorted(rates)} but data_dirs {tasks}")
    return [inputs["data_dirs"][t] for t in tasks], [float(rates[t]) for t in tasks]


def packed_batch(ctx, spec: TrainSpec, data_dirs: list[str], rates: list[float] | None,
                 replicas: int) -> tuple[int, int]:
    """(rows a step, prediction slots a row) of a phase on packed rows: ``batch_size`` rows
    (``batch_counts`` 'rows'), or the rows that hold ``batch_size`` instances at the packing
    factor the preprocess stage measured ('instances'), rounded to whole micro-batches on
    every replica (compiler/packing.py ``rows_per_step``, as the plan's estimate)."""
    factor = pretraining_data.packing_factor(data_dirs, rates)
    if spec.batch_counts == "rows":
        rows = spec.batch_size
        ctx.progress(f"packed rows: {rows} a step, about {rows * factor:,.0f} instances at "
                     f"{factor:.2f} instances a row (train.batch_counts = 'rows')")
    else:
        rows = rows_per_step(spec.batch_size, factor, replicas * spec.grad_accum_steps)
        ctx.progress(f"packed rows: {rows} a step hold about {spec.batch_size} instances at "
                     f"{factor:.2f} instances a row (train.batch_counts = 'instances')")
    return rows, spec.max_predictions_per_row


def data_stream(strategy: tf.distribute.Strategy, work_dir: str, resumed: bool) -> int:
    """The data stream version this run reads (pretraining_data.stream_of_run); with several
    workers the chief's, which alone sees the stage's checkpoints and file."""
    version = pretraining_data.stream_of_run(work_dir, resumed)
    if cluster.is_multi_worker():
        with strategy.scope():
            shared = tf.Variable(version, dtype=tf.int64, trainable=False,
                                 aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        broadcast_from_first_replica(strategy, [shared])
        version = int(shared.numpy())
    return version


def run(ctx) -> dict:
    return run_training(ctx, TrainSpec.from_stage(ctx), Pretraining)


class Pretraining(TrainingKind):
    """The pretrain stage's model, data, starting weights and summary (runtime/
    training_stage.py runs them)."""

    metrics_fn = staticmethod(pretraining_metrics)

    def __init__(self, ctx, spec: TrainSpec):
        self.ctx, self.spec = ctx, spec
        self.config = BertConfig.from_dict(spec.model)
        check_vocab(self.config, ctx.inputs.get("vocab_dir"))
        self.loop = loop_config(spec)
        self.data_dirs, self.rates = data_sources(spec, ctx.inputs)
        # What a training batch holds: rows a step, prediction slots a row (packed: prepare).
        self.rows, self.predictions = spec.batch_size, spec.max_predictions_per_seq
        self.init_report = self.phase_report = None
        self.strategy = self.stream = None  # prepare's and start's

    def build(self, xla: bool):
        spec = self.spec
        model = BertPretrainer(self.config, compute_dtype=self.loop.compute_dtype,
                               seed=spec.seed, xla=xla, recompute=spec.recompute)
        return model, optimizer_from_spec(spec.optimization, spec.train_steps,
                                          self.config.hidden_size)

    def prepare(self, strategy: tf.distribute.Strategy) -> None:
        self.strategy = strategy
        write_bert_config(self.config, self.ctx.work_dir)
        if self.spec.packing:  # rows of several instances (compiler/packing.py): how many a step
            self.rows, self.predictions = packed_batch(self.ctx, self.spec, self.data_dirs,
                                                       self.rates,
                                                       strategy.num_replicas_in_sync)
            self.loop = dataclasses.replace(self.loop, batch_size=self.rows)
        self.eval_dataset = self._eval_dataset()

    def _eval_dataset(self):
        """The held-out dataset: the validation splits of the data dirs that have one."""
        if not self.loop.eval_every:
            return None
        held = [d for d in self.data_dirs if pretraining_data.has_split(d, "validation")]
        if not held:
            self.ctx.progress(f"eval_every {self.loop.eval_every}: no validation split in "
                              f"{', '.join(self.data_dirs)}; training without held-out "
                              "evaluation")
            return None
        # The examples are split between the members with a validation split.
        eval_examples = max(1, EVAL_EXAMPLES // len(held))
        spec = self.spec
        return lambda: pretraining_data.pretraining_dataset(
            held, "validation", batch_size=spec.batch_size, max_seq_length=spec.max_seq_length,
            max_predictions_per_seq=spec.max_predictions_per_seq, training=False,
            max_examples=eval_examples)

    def start(self, trainer: Trainer) -> None:
        ctx, spec, model = self.ctx, self.spec, trainer.model
        has_checkpoint = trainer.manager.latest_checkpoint is not None
        previous_phase = ctx.inputs.get("previous_phase_dir")
        if previous_phase and not has_checkpoint:
            # A later phase, fresh: the previous phase's final weights; a resumed one has its
            # own checkpoints (the phase is never restarted from the previous one).
            self.phase_report = start_from_previous_phase(ctx, spec, trainer, previous_phase)
        if spec.init_checkpoint and not has_checkpoint:
            # Only a fresh run starts from init_checkpoint; a resumed one has its own weights.
            self.init_report = load_init_checkpoint(ctx, spec, model, self.config)
        ctx.progress(f"model: {count_parameters(model.google_variables()):,} parameters, "
                     f"{self.strategy.num_replicas_in_sync} replica(s), optimizer "
                     f"{spec.optimization.optimizer}, compute {self.loop.compute_dtype}"
                     + (f", {self.loop.grad_accum_steps} micro-batches per step"
                        if self.loop.grad_accum_steps > 1 else "")
                     + (f", recompute {spec.recompute}" if spec.recompute != "none" else ""))
        self.stream = data_stream(self.strategy, ctx.work_dir, has_checkpoint)
        if self.stream != pretraining_data.STREAM_VERSION:
            ctx.progress(f"this run started with data stream version {self.stream} (seqio's "
                         "sequential stream): it resumes with it, replaying the batches "
                         "consumed; a fresh run reads version "
                         f"{pretraining_data.STREAM_VERSION}, resumed by position")

    def make_dataset(self, skip_batches: int) -> PerHostDataset:
        spec, data_dirs, rates = self.spec, self.data_dirs, self.rates

        def host_dataset(context: tf.distribute.InputContext):
            # This host's share of the data, at the per-replica batch size; its replicas take
            # consecutive batches, so it skips skip_batches global batches' worth of them.
            replicas = context.num_replicas_in_sync // context.num_input_pipelines
            return pretraining_data.pretraining_dataset(
                data_dirs if rates else data_dirs[0], "train",
                batch_size=context.get_per_replica_batch_size(self.rows),
                max_seq_length=spec.max_seq_length, max_predictions_per_seq=self.predictions,
                seed=spec.seed, training=True,
                skip_batches=skip_batches * replicas, rates=rates, mixture=spec.mixture,
                shard_info=seqio.ShardInfo(context.input_pipeline_id,
                                           context.num_input_pipelines), stream=self.stream)
        return PerHostDataset(host_dataset)

    def summary(self, result: dict, trainer: Trainer) -> PretrainSummary:
        spec = self.spec
        packing = None
        if spec.packing:  # what a step trained on (compiler/packing.py)
            packing = PackedBatches(rows_per_step=self.rows, batch_counts=spec.batch_counts,
                                    factor=pretraining_data.packing_factor(self.data_dirs,
                                                                           self.rates))
        return PretrainSummary(
            step=result["step"], loss=result.get("loss"),
            mlm_accuracy=result.get("mlm_accuracy"), nsp_accuracy=result.get("nsp_accuracy"),
            examples_per_second=result.get("examples_per_second"),
            steps_trained=result["steps_trained"], resumed_from=result["resumed_from"],
            batches_consumed=int(trainer.batches_consumed.numpy()),
            parameters=count_parameters(trainer.model.google_variables()),
            deadline_seconds_left=result.get("deadline_seconds_left"),
            eval=TrainingEval.read(result["eval"]) if result.get("eval") else None,
            packing=packing, init_checkpoint=self.init_report,
            previous_phase=self.phase_report)


def start_from_previous_phase(ctx, spec: TrainSpec, trainer: Trainer,
                              previous_phase: str) -> PhaseStart:
    """Starts a fresh later phase from the previous phase's final checkpoint (its weights;
    its optimizer moments too with ``optimizer_state`` "carry"); returns the summary's
    ``previous_phase``."""
    carry = spec.optimizer_state == "carry"
    prefix = checkpoints.start_from_previous_phase(trainer.model, trainer.optimizer,
                                                   previous_phase, carry)
    ctx.progress(f"starting from the previous phase's final checkpoint {prefix}: its "
                 + ("weights and optimizer moments (step and schedule start again)" if carry
                    else "weights, with a fresh optimizer (new moments and warmup)"))
    return PhaseStart(checkpoint=prefix, step=checkpoints.checkpoint_step(prefix),
                      optimizer_state=spec.optimizer_state)


def load_init_checkpoint(ctx, spec: TrainSpec, model: BertPretrainer,
                         config: BertConfig) -> InitCheckpointReport:
    """Loads a fresh run's ``init_checkpoint``: a Google checkpoint prefix, or a Hugging
    Face directory (config.json checked); returns the summary's ``init_checkpoint``."""
    # The local copy of a gs:// checkpoint or directory where the storage layer made one
    # (TensorFlow's own gs:// reader ignores the emulator and the listed versions).
    local = ctx.inputs.get("init_checkpoint") or spec.init_checkpoint
    report = checkpoints.load_init_checkpoint(
        model.google_variables(), local[0] if isinstance(local, list) else local, config)
    ctx.progress(f"init_checkpoint {spec.init_checkpoint}: {len(report.loaded)} variables "
                 f"loaded, {len(report.missing)} missing, {len(report.unused)} unused")
    fresh = [part for prefix, part in _HUGGINGFACE_PARTS
             if any(n.startswith(prefix) for n in report.missing)]
    if report.source == "huggingface" and fresh:
        # A BertModel directory (AutoModel) has no heads, a BertForMaskedLM one no pooler
        # and no next-sentence head.
        ctx.progress(f"init_checkpoint {spec.init_checkpoint} is a Hugging Face model "
                     f"without {' and '.join(fresh)}: they start fresh")
    for name in report.missing:
        ctx.progress(f"  missing (left at its initial value): {name}")
    for name in report.unused:
        ctx.progress(f"  unused: {name}")
    return InitCheckpointReport(loaded=len(report.loaded), missing=list(report.missing),
                                unused=list(report.unused), source=report.source)
