"""finetune stage: a classification head on the pretrained encoder, trained and scored.

Contract (docs/STAGES.md): inputs ``train_file``, ``dev_files`` (name -> file; one
scored set each; ``dev_file`` is the set named "dev"), ``vocab_dir``, and the encoder to start
from: ``checkpoint_dir`` (a pretrain stage's directory) or ``init_checkpoint`` (a checkpoint
prefix in Google's layout, e.g. a released BERT, or a Hugging Face BERT directory:
config.json + model.safetensors). Writes ``checkpoints/``, ``metrics.json``
(per dev set under ``dev_sets``: each of the task's metrics (``metrics``: their names,
compiler/specs/task_kinds.py), ``examples``, and for a classification
``majority_baseline``; at the top level the first set's metrics and baseline, ``kind``,
``num_labels`` (1 for a regression), ``dev_examples``, ``train_examples``),
``predictions.<dev set>.tsv`` (gold label, prediction, its probability — a regression's
predicted score has none — and the texts), ``curves.png`` (runtime/report/curves.py, with
the dev scores and the majority class).

Heads: a classification's softmax over its labels (cross-entropy), or a regression's one
output (mean squared error on the float labels), both in google-research/bert's variable
layout (runtime/model.py ``BertClassifier``).

Params are a ``FinetuneSpec`` (compiler/specs/finetune.py); the optimizer is BERT's
run_classifier one (AdamW, linear decay, clipping at 1.0).

Data: the classification task is a seqio task (tasks/cache/seqio_tasks.py
``register_classification_task``: "train" and one split per dev set), read with
``get_dataset``: training takes each input host's share in order (``seqio.ShardInfo``),
shuffled with the seed and repeated (runtime/distributed.py ``PerHostDataset``); dev sets are
read whole, in order. The files are still parsed here for the texts of the predictions and
the majority label.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import seqio
import tensorflow as tf

from runexp.compiler import globs
from runexp.compiler.specs import FinetuneSpec
from runexp.compiler.specs.finetune import DevScores, FinetuneSummary, Scores
from runexp.runtime import checkpoints
from runexp.compiler.errors import Problem, UserError
from runexp.runtime.bert_config import BertConfig
from runexp.runtime.distributed import PerHostDataset
from runexp.runtime.model import BertClassifier
from runexp.runtime.optimizer import optimizer_from_spec
from runexp.runtime.task_metrics import score
from runexp.runtime.train_log import classification_metrics, regression_metrics
from runexp.runtime.train_loop_config import TrainLoopConfig
from runexp.runtime.trainer import Trainer
from runexp.runtime.training_stage import TrainingKind, run_training
from runexp.tasks.cache import seqio_tasks
from runexp.compiler.formats.classification_files import DataFileError, load_examples
from runexp.tasks.sources.classification import labels_of
from runexp.tasks.vocabulary.tokenizer import load_tokenizer

METRICS_FILE = "metrics.json"

# The loop of a fine-tune, a short run (FinetuneSpec.train_steps: 1000 by default): about
# LOG_LINES train log lines, at most LOG_EVERY_AT_MOST steps apart, one call of the
# compiled loop per line; one checkpoint, at the end (and at a stop), and only the latest
# kept: a resume needs no other.
LOG_LINES = 5
LOG_EVERY_AT_MOST = 100
KEEP_CHECKPOINTS = 1


def predictions_file(dev_set: str) -> str:
    return f"predictions.{dev_set}.tsv"


def _one_file(value) -> str:
    """An input given as a path, a glob or a list of them, resolved to one file."""
    patterns = [value] if isinstance(value, str) else list(value)
    files = sorted({f for pattern in patterns for f in (globs.expand_local(pattern) or [pattern])})
    if len(files) != 1 or not os.path.exists(files[0]):
        raise FileNotFoundError(f"expected one existing file for {value!r}, found {files}")
    return files[0]


GOLD_FEATURES = ("label_ids", "label_values")  # a classification's, a regression's


def _predict(model: BertClassifier, arrays: dict, batch_size: int) -> np.ndarray:
    """Class probabilities [n, num_labels] for encoded examples; a regression's predicted
    scores [n, 1]."""
    features = {k: v for k, v in arrays.items() if k not in GOLD_FEATURES}
    ds = tf.data.Dataset.from_tensor_slices(features).batch(batch_size)
    output = (lambda f: model(f, training=False)) if model.regression else \
        (lambda f: tf.nn.softmax(model(f, training=False)))
    predict = tf.function(output, reduce_retracing=True)
    out = [predict(batch).numpy() for batch in ds]
    return np.concatenate(out) if out else np.zeros([0, model.num_labels], np.float32)


def _arrays(task: seqio.Task, split: str) -> dict:
    """A split's encoded examples, in order, as numpy arrays (seqio's get_dataset)."""
    ds = task.get_dataset(split=split, sequence_length=None, shuffle=False, num_epochs=1)
    batches = list(ds.batch(4096).as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) if batches
            else np.zeros([0, *ds.element_spec[k].shape], ds.element_spec[k].dtype.as_numpy_dtype)
            for k in ds.element_spec}


def _clean(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ")


def _dev_sets(inputs) -> dict:
    """Named dev files, in the plan's order."""
    named = dict(inputs.get("dev_files") or {})
    if inputs.get("dev_file"):
        named = {"dev": inputs["dev_file"], **named}
    if not named:
        raise ValueError("the finetune stage has no dev set (inputs dev_files / dev_file)")
    return named


def _start_encoder(ctx, model: BertClassifier, trainer: Trainer) -> str:
    """Initialises the encoder of a fresh run: from the pretrain stage's latest checkpoint,
    a Google-layout checkpoint or a Hugging Face directory. A resumed run keeps its own
    weights."""
    inputs = ctx.inputs
    if trainer.manager.latest_checkpoint is not None:
        return f"this stage's own {trainer.manager.latest_checkpoint} (resumed)"
    if inputs.get("init_checkpoint"):
        prefix = inputs["init_checkpoint"]
        report = checkpoints.load_init_checkpoint(model.google_variables(), prefix,
                                                  model.config)
        head = [n for n in report.missing if n.startswith("bert/")]
        if report.source == "huggingface":
            # A BertForMaskedLM directory has no pooler: it starts fresh, as the classifier.
            head = [n for n in head if not n.startswith("bert/pooler/")]
        if head:
            layout = ("a transformers BERT" if report.source == "huggingface"
                      else "a BERT checkpoint in Google's variable layout")
            raise UserError(Problem(f"init_checkpoint {prefix} lacks {len(head)} encoder "
                                    f"variables (e.g. {head[0]}): it is not {layout}",
                                    hint="give a google-research/bert checkpoint, the export "
                                         "stage's bert_model.ckpt of a runexp run, or a "
                                         "Hugging Face BERT directory (e.g. an export's huggingface/)"))
        ctx.progress(f"init_checkpoint {prefix}: {len(report.loaded)} variables loaded; the "
                     f"classifier ({', '.join(report.missing) or 'none'}) starts fresh; "
                     f"{len(report.unused)} unused (pretraining heads)")
        return prefix
    return checkpoints.restore_encoder(model.encoder, inputs["checkpoint_dir"])


def _score(model, dev, dev_arrays, labels, batch_size, majority_label,
           metrics: tuple) -> tuple[dict, list]:
    """(scores, prediction rows) of one dev set: the task's metrics (runtime/task_metrics.py)
    and, for a classification, the majority label's accuracy."""
    outputs = _predict(model, dev_arrays, batch_size)
    if model.regression:
        predicted = outputs[:, 0]
        rows = [(label, f"{value:.4f}", "", texts) for (texts, label), value in zip(dev, predicted)]
        return {**score(metrics, dev_arrays["label_values"], predicted),
                "examples": len(dev)}, rows
    predicted = outputs.argmax(axis=1) if len(dev) else np.zeros([0], np.int64)
    majority = (sum(label == majority_label for _, label in dev) / len(dev)) if dev else 0.0
    rows = [(label, labels[k], f"{row[k]:.4f}", texts)
            for (texts, label), k, row in zip(dev, predicted, outputs)]
    return {**score(metrics, dev_arrays["label_ids"], predicted), "majority_baseline": majority,
            "examples": len(dev)}, rows


def _describe(scores: dict) -> str:
    """"accuracy 0.8123, f1 0.7012 (majority baseline 0.5000, 64 examples)"."""
    values = ", ".join(f"{k} {v:.4f}" for k, v in scores.items()
                       if k not in ("majority_baseline", "examples"))
    baseline = (f"majority baseline {scores['majority_baseline']:.4f}, "
                if "majority_baseline" in scores else "")
    return f"{values} ({baseline}{scores['examples']} examples)"


def loop_config(spec: FinetuneSpec) -> TrainLoopConfig:
    """The training loop of a fine-tune (the constants above). ``jit_compile`` False: the
    step is not compiled with XLA as a whole (on a TPU the model's layers are,
    runtime/training_stage.py)."""
    log_every = max(1, min(LOG_EVERY_AT_MOST, spec.train_steps // LOG_LINES))
    return TrainLoopConfig(
        train_steps=spec.train_steps, batch_size=spec.batch_size, steps_per_loop=log_every,
        log_every=log_every, checkpoint_every=spec.train_steps,
        keep_checkpoints=KEEP_CHECKPOINTS, jit_compile=False,
        compute_dtype=spec.compute_dtype, deadline=spec.deadline_unix,
        deadline_margin=spec.deadline_margin_s)


def run(ctx) -> dict:
    return run_training(ctx, FinetuneSpec.from_stage(ctx), FineTuning)


class FineTuning(TrainingKind):
    """The finetune stage's data, classifier, starting encoder and scored summary
    (runtime/training_stage.py runs them). Reads and checks every file before any model is
    built."""

    def __init__(self, ctx, spec: FinetuneSpec):
        self.ctx, self.spec = ctx, spec
        self.kind, self.metric_names = spec.data.task_kind(), spec.data.scored_by()
        self.regression = self.kind.regression
        self.metrics_fn = regression_metrics if self.regression else classification_metrics
        tokenizer = load_tokenizer(ctx.inputs["vocab_dir"])
        self._read_data()
        self.config = BertConfig.from_dict(spec.model)
        if tokenizer.vocab_size > self.config.vocab_size:
            raise ValueError(f"model.vocab_size {self.config.vocab_size} is smaller than the "
                             f"vocab's {tokenizer.vocab_size} tokens")
        self.loop = loop_config(spec)
        self.started_from = None  # start's

    def _read(self, path: str) -> list:
        data = self.spec.data
        return load_examples(path, data.text_fields, data.label_field, columns=data.columns,
                             numeric_labels=self.regression)

    def _read_data(self) -> None:
        """The train examples, the labels, the seqio task and each dev set (examples and
        encoded arrays); raises on a file the stage could not use."""
        spec, inputs, regression = self.spec, self.ctx.inputs, self.regression
        train_file = _one_file(inputs["train_file"])
        self.train = self._read(train_file)
        if not self.train:
            raise DataFileError(train_file, 0, "no training examples",
                                "the train file has a header but no rows")
        self.labels = [] if regression else list(spec.data.labels or labels_of(self.train))
        dev_files = {name: _one_file(path) for name, path in _dev_sets(inputs).items()}
        self.task = seqio_tasks.register_classification_task(
            spec.task or "finetune", train_file, dev_files, spec.data.text_fields,
            spec.data.label_field, None if regression else self.labels, inputs["vocab_dir"],
            spec.max_seq_length, columns=spec.data.columns, regression=regression)
        self.dev_sets = {name: (self._read_dev_set(name, path), _arrays(self.task, name))
                         for name, path in dev_files.items()}

    def _read_dev_set(self, name: str, path: str) -> list:
        dev = self._read(path)
        unknown = [] if self.regression else sorted({ex[1] for ex in dev} - set(self.labels))
        if unknown:  # before any training: they could never be scored right
            raise DataFileError(
                path, 0, f"dev set {name!r} has labels the model is never trained on: "
                f"{', '.join(map(repr, unknown[:5]))}",
                f"the task's labels are {', '.join(map(repr, self.labels[:8]))}: fix the dev "
                "labels (spelling, case), or list every label in classification_task.labels")
        return dev

    def build(self, xla: bool):
        spec = self.spec
        model = BertClassifier(self.config,
                               num_labels=1 if self.regression else len(self.labels),
                               compute_dtype=self.loop.compute_dtype, seed=spec.seed, xla=xla,
                               recompute=spec.recompute, regression=self.regression)
        return model, optimizer_from_spec(spec.optimization(), spec.train_steps,
                                          self.config.hidden_size)

    def start(self, trainer: Trainer) -> None:
        self.started_from = _start_encoder(self.ctx, trainer.model, trainer)
        self.ctx.progress(
            f"encoder from {self.started_from}; {len(self.train)} train examples, dev sets "
            + ", ".join(f"{n} ({len(d)})" for n, (d, _) in self.dev_sets.items())
            + ("; a regression" if self.regression else f"; {len(self.labels)} labels")
            + f", scored by {', '.join(self.metric_names)}")

    def make_dataset(self, skip_batches: int) -> PerHostDataset:
        task, spec, examples = self.task, self.spec, len(self.train)

        def host_dataset(context: tf.distribute.InputContext):
            # This host's share, in order, then shuffled with the seed, at the per-replica
            # batch size; its replicas take consecutive batches.
            replicas = context.num_replicas_in_sync // context.num_input_pipelines
            ds = task.get_dataset(split="train", sequence_length=None, shuffle=False,
                                  num_epochs=1, shard_info=seqio.ShardInfo(
                                      context.input_pipeline_id, context.num_input_pipelines))
            ds = ds.cache().shuffle(examples, seed=spec.seed, reshuffle_each_iteration=True)
            ds = ds.repeat().batch(context.get_per_replica_batch_size(spec.batch_size),
                                   drop_remainder=True)
            return ds.skip(skip_batches * replicas).prefetch(2)
        return PerHostDataset(host_dataset)

    def summary(self, result: dict, trainer: Trainer) -> FinetuneSummary:
        """Scores every dev set, writes its predictions and metrics.json."""
        model = trainer.model
        majority_label = None if self.regression else \
            collections.Counter(label for _, label in self.train).most_common(1)[0][0]
        scores = {name: DevScores.read(self._score_dev_set(model, name, dev, dev_arrays,
                                                           majority_label))
                  for name, (dev, dev_arrays) in self.dev_sets.items()}
        first = scores[next(iter(scores))]
        summary = FinetuneSummary(
            scores=Scores(values=first.values, majority_baseline=first.majority_baseline),
            kind=self.kind.name, metrics=list(self.metric_names), dev_sets=scores,
            num_labels=model.num_labels,
            dev_examples=sum(s.examples for s in scores.values()),
            train_examples=len(self.train), step=result["step"])
        metrics = dict(summary.to_dict(), majority_label=majority_label, labels=self.labels,
                       train_loss=result.get("loss"), initialised_from=self.started_from)
        with open(os.path.join(self.ctx.work_dir, METRICS_FILE), "w") as f:
            json.dump(metrics, f, indent=2, sort_keys=True)
            f.write("\n")
        return summary

    def _score_dev_set(self, model: BertClassifier, name: str, dev: list, dev_arrays: dict,
                       majority_label) -> dict:
        """A dev set's scores; writes its predictions file."""
        scores, rows = _score(model, dev, dev_arrays, self.labels, self.spec.batch_size,
                              majority_label, self.metric_names)
        with open(os.path.join(self.ctx.work_dir, predictions_file(name)), "w",
                  encoding="utf-8") as f:
            f.write("\t".join(["label", "prediction", "probability",
                               *self.spec.data.text_fields]) + "\n")
            for label, prediction, probability, texts in rows:
                f.write("\t".join([label, prediction, probability,
                                   *(_clean(t) for t in texts)]) + "\n")
        self.ctx.progress(f"dev set {name}: {_describe(scores)}")
        return scores
