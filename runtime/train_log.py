"""The metrics a training run computes and what it writes about itself in its work_dir:
``train_log.jsonl`` (one record per ``log_every`` steps: metrics, learning rate, examples/s,
step time, ...; and records with an ``"event"`` key, e.g. ``"deadline_stop"`` with
``deadline_seconds_left``), ``eval_log.jsonl`` (held-out metrics) and TensorBoard scalars
under ``tensorboard/``. The logs are read by runtime/log_reader.py.

Usage:
    log = RunLog(work_dir, tf.summary.create_file_writer(...))
    log.train(step, pretraining_metrics(totals), lr, examples_per_second, extras,
              batches_consumed)
    log.event(step, "deadline_stop", deadline_seconds_left=12.3)
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Mapping

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from runexp.runtime import log_reader
from runexp.runtime.log_reader import EVAL_LOG, TRAIN_LOG

TENSORBOARD_SUBDIR = "tensorboard"

# What tensorboard's own scalar summary writes; tf.summary.scalar needs the tensorboard
# package installed, tf.summary.write with this metadata does not.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


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


def regression_metrics(totals: Mapping[str, float]) -> dict:
    """Metrics of a regression ``BertClassifier``'s stats: the loss is the mean squared
    error."""
    return {"loss": totals["loss_sum"] / max(totals["examples"], 1.0)}


def write_scalar(name: str, value: float, step: int) -> None:
    """One TensorBoard scalar into the default summary writer."""
    tf.summary.write(name, tf.constant(float(value), tf.float32), step=step,
                     metadata=_SCALAR_METADATA)


def format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def last_metrics(work_dir: str) -> dict:
    """The latest metrics record of the train log ({} if none); reads only the log's end."""
    src = log_reader.source(os.path.join(work_dir, TRAIN_LOG))
    return log_reader.last(src, log_reader.is_metrics) or {}


def trim_logs(work_dir: str, step: int) -> None:
    """Drops the records past ``step``: a run killed between a log line and its checkpoint
    logged steps it will redo (log_reader.trim: reads back only over what it cuts)."""
    for name in (TRAIN_LOG, EVAL_LOG):
        log_reader.trim(os.path.join(work_dir, name), step)


def _append(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class RunLog:
    """The train and eval logs of one work_dir, and its TensorBoard ``writer``."""

    def __init__(self, work_dir: str, writer):
        self.work_dir, self.writer = work_dir, writer

    def train(self, step: int, metrics: dict, lr: float, eps: float, extras: dict,
              batches_consumed: int) -> None:
        with self.writer.as_default(step=step):
            for k, v in metrics.items():
                write_scalar(k, v, step)
            write_scalar("learning_rate", lr, step)
            write_scalar("examples_per_second", eps, step)
            for k, v in extras.items():
                write_scalar(k, v, step)
        self.writer.flush()
        _append(os.path.join(self.work_dir, TRAIN_LOG), {
            "step": step, **{k: round(v, 6) for k, v in metrics.items()},
            "learning_rate": lr, "examples_per_second": round(eps, 2),
            **{k: round(v, 6) for k, v in extras.items()},
            "batches_consumed": batches_consumed, "time": round(time.time(), 3)})

    def eval(self, step: int, metrics: dict) -> None:
        with self.writer.as_default(step=step):
            for k, v in metrics.items():
                write_scalar(f"eval/{k}", v, step)
        self.writer.flush()
        _append(os.path.join(self.work_dir, EVAL_LOG), {
            "step": step, **{k: round(v, 6) for k, v in metrics.items()},
            "time": round(time.time(), 3)})

    def event(self, step: int, event: str, **fields) -> None:
        """A record that is not metrics (``last_metrics`` skips it)."""
        _append(os.path.join(self.work_dir, TRAIN_LOG), {
            "step": step, "event": event, **fields, "time": round(time.time(), 3)})
