"""evaluate stage: held-out MLM / NSP metrics of a pretrain checkpoint, with a baseline.

Contract (docs/STAGES.md): params ``model``, ``batch_size``, ``max_seq_length``,
``max_predictions_per_seq``, ``max_examples``; inputs ``data_dir`` (the ``validation``
split is read) or, for a mixture, ``data_dirs`` (task -> dir), and ``checkpoint_dir``.
Writes ``metrics.json``, the summary (compiler/specs/evaluate.py ``EvaluateSummary``): the
held-out MLM and NSP metrics and the majority-token baseline; for a mixture these pool every
member's held-out examples, and ``tasks`` holds each member's own.

The baseline always predicts the most frequent masked target token of the train split: a
model that beats it has learned something from context.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from runexp.compiler.specs import EvaluateSpec
from runexp.compiler.specs.evaluate import EvaluateSummary, HeldOutScores
from runexp.runtime import checkpoints, pretraining_data, strategy as strategy_lib
from runexp.runtime.bert_config import BertConfig
from runexp.runtime.model import BertPretrainer
from runexp.runtime.progress import Meter
from runexp.runtime.distributed import evaluate_totals
from runexp.runtime.train_log import pretraining_metrics

METRICS_FILE = "metrics.json"
# Enough train targets to know the most frequent token; reading more changes nothing.
_BASELINE_MAX_EXAMPLES = 200_000


def masked_token_counts(data_dir: str, split: str, max_seq_length: int,
                        max_predictions_per_seq: int, max_examples: int | None) -> np.ndarray:
    """Counts of each masked target id (weight > 0) in a split; index = token id. A split
    masked at training time is masked here as training masks it (one pass); a packed one's
    rows have their own prediction slots."""
    if pretraining_data.has_split(data_dir, split):
        max_predictions_per_seq = pretraining_data.split_predictions(data_dir, split)
    ds = pretraining_data.pretraining_dataset(
        data_dir, split, batch_size=1024, max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq, training=False,
        max_examples=max_examples)
    counts = np.zeros([0], np.int64)
    for batch in ds.as_numpy_iterator():
        ids = batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
        c = np.bincount(ids)
        if len(c) > len(counts):
            counts = np.pad(counts, (0, len(c) - len(counts)))
        counts[:len(c)] += c
    return counts


def _evaluate_data(strategy, model, data_dir: str, spec: EvaluateSpec,
                   say=print) -> tuple[HeldOutScores, dict, int]:
    """(metrics, the loss totals, majority-token hits) on one data dir's validation split."""
    seq, preds = spec.max_seq_length, spec.max_predictions_per_seq
    max_examples = spec.max_examples
    dataset = pretraining_data.pretraining_dataset(
        data_dir, "validation", batch_size=spec.batch_size, max_seq_length=seq,
        max_predictions_per_seq=preds, training=False, max_examples=max_examples)
    with Meter(f"evaluating {os.path.basename(data_dir)}", total=max_examples or None,
               unit="examples", say=say) as meter:
        totals = evaluate_totals(strategy, model, dataset, meter=meter)
    metrics = pretraining_metrics(totals)
    train_counts = masked_token_counts(data_dir, "train", seq, preds, _BASELINE_MAX_EXAMPLES)
    majority = int(np.argmax(train_counts)) if train_counts.size else 0
    heldout_counts = masked_token_counts(data_dir, "validation", seq, preds, max_examples)
    heldout_total = int(heldout_counts.sum())
    hits = int(heldout_counts[majority]) if majority < heldout_counts.size else 0
    result = HeldOutScores(
        mlm_accuracy=metrics["mlm_accuracy"], mlm_loss=metrics["mlm_loss"],
        nsp_accuracy=metrics["nsp_accuracy"], examples=int(totals.get("examples", 0)),
        majority_token_accuracy=hits / heldout_total if heldout_total else 0.0,
        majority_token_id=majority)
    return result, totals, hits


def _say(ctx, step: int, result: EvaluateSummary) -> None:
    ctx.progress(f"step {step}: mlm_accuracy {result.mlm_accuracy:.4f} (majority token "
                 f"{result.majority_token_accuracy:.4f}), nsp_accuracy "
                 f"{result.nsp_accuracy:.4f} on {result.examples} examples")
    for task, m in (result.tasks or {}).items():
        ctx.progress(f"  {task}: mlm_accuracy {m.mlm_accuracy:.4f} (majority token "
                     f"{m.majority_token_accuracy:.4f}), nsp_accuracy "
                     f"{m.nsp_accuracy:.4f} on {m.examples} examples")


def run(ctx) -> EvaluateSummary:
    spec, inputs = EvaluateSpec.from_stage(ctx), ctx.inputs
    strategy_lib.configure_threads()
    config = BertConfig.from_dict(spec.model)
    # Only the chief evaluates: this machine's devices, whatever the cluster.
    strategy = strategy_lib.make_strategy(strategy_lib.accelerator_of(ctx), multi_worker=False)
    with strategy.scope():
        model = BertPretrainer(config)
    step = checkpoints.restore_model(model, inputs["checkpoint_dir"])

    if "data_dirs" not in inputs:  # one task
        scores, _, _ = _evaluate_data(strategy, model, inputs["data_dir"], spec, ctx.progress)
        result = EvaluateSummary(**dataclasses.asdict(scores), step=step)
    else:  # a mixture: each member's held-out split, then all of them together
        per_task, totals, hits = {}, {}, 0
        for task, data_dir in sorted(inputs["data_dirs"].items()):
            per_task[task], task_totals, task_hits = _evaluate_data(strategy, model, data_dir,
                                                                    spec, ctx.progress)
            for k, v in task_totals.items():
                totals[k] = totals.get(k, 0.0) + v
            hits += task_hits
        overall = pretraining_metrics(totals)
        weight = totals.get("mlm_weight", 0.0)
        result = EvaluateSummary(
            mlm_accuracy=overall["mlm_accuracy"], mlm_loss=overall["mlm_loss"],
            nsp_accuracy=overall["nsp_accuracy"], examples=int(totals.get("examples", 0)),
            # each task's own majority token, pooled over the masked positions
            majority_token_accuracy=hits / weight if weight else 0.0, tasks=per_task,
            step=step)
    with open(os.path.join(ctx.work_dir, METRICS_FILE), "w") as f:
        json.dump(result.to_dict(), f, indent=2, sort_keys=True)
        f.write("\n")
    _say(ctx, step, result)
    return result
