"""export stage: the model for each of its consumers.

Contract (docs/STAGES.md): params ``model``; inputs ``checkpoint_dir`` (pretrain stage dir),
``vocab_dir``, optionally ``finetune_dir`` (then the fine-tuned encoder is exported, with its
classifier), or a sweep's ``finetune_dirs`` (point -> dir) and ``sweep_dir`` (then the point
its ``sweep.json`` names ``exported``). Writes the rows of runtime/export/artifacts.py that
apply (what each is, how it is loaded and how it is written are there): ``encoder/``,
``preprocessing/``, ``classifier/`` (fine-tuned only), ``bert_model.ckpt.*``,
``bert_config.json``, ``huggingface/``, the vocabulary, and ``README.md`` on loading each.

The preprocessing length is the fine-tune's ``max_seq_length`` when there is a finetune stage
(the classifier was trained and is served at it), else the pretraining ``max_seq_length`` (the
longest inputs the encoder was trained on; positions past it were never trained), both read
from the upstream stages' params in the plan (or their MANIFEST.json).
"""

from __future__ import annotations

import json
import os

from runexp.compiler.plan import MANIFEST_FILE
from runexp.compiler.specs import ExportSpec, FinetuneSpec
from runexp.compiler.specs.export import ExportSummary
from runexp.compiler.specs.finetune import FinetuneMetrics
from runexp.compiler.specs.train import TrainSpec
from runexp.runtime import checkpoints
from runexp.runtime.bert_config import BertConfig
from runexp.runtime.export import artifacts, readme
from runexp.runtime.model import BertClassifier, BertPretrainer, count_parameters
from runexp.tasks.vocabulary.tokenizer import SPECIAL_TOKENS, load_tokenizer

METRICS_FILE = "metrics.json"  # the finetune stage's
SWEEP_FILE = "sweep.json"  # the sweep stage's (runtime/stages/sweep.py)


def _upstream_params(ctx, kind: str, stage_dir: str | None) -> dict:
    """The params of the ``kind`` stage this one depends on: from the plan, else from the
    MANIFEST.json the executor wrote into its directory; {} when neither has them."""
    for dep in ctx.stage.deps:
        try:
            stage = ctx.upstream(dep)
        except KeyError:
            continue
        # Of a sweep's points, the one exported (the others are deps too).
        if stage.kind == kind and (not stage_dir or kind != "finetune" or
                                   stage.output_dir.rstrip("/") == stage_dir.rstrip("/")):
            return dict(stage.params)
    if stage_dir:
        try:
            with open(os.path.join(stage_dir, MANIFEST_FILE), encoding="utf-8") as f:
                return dict(json.load(f).get("params") or {})
        except (OSError, ValueError):
            pass
    return {}


def _finetuned(config: BertConfig, finetune_dir: str):
    """The classifier of a finetune stage dir, restored from its latest checkpoint, and its
    metrics.json (``labels``, ``num_labels``)."""
    with open(os.path.join(finetune_dir, METRICS_FILE), encoding="utf-8") as f:
        metrics = FinetuneMetrics.read(json.load(f))
    model = BertClassifier(config, int(metrics.num_labels),
                           regression=metrics.kind == "regression")
    return model, checkpoints.restore_model(model, finetune_dir), metrics


def selected_dir(inputs: dict):
    """Of a sweep (inputs ``finetune_dirs`` and ``sweep_dir``), the directory of the point
    its sweep.json exports (runtime/stages/sweep.py); None without a sweep."""
    if not inputs.get("sweep_dir"):
        return None
    with open(os.path.join(inputs["sweep_dir"], SWEEP_FILE), encoding="utf-8") as f:
        point = json.load(f)["exported"]
    return inputs["finetune_dirs"][point]


def _special_ids(vocab_dir: str) -> dict:
    tokenizer = load_tokenizer(vocab_dir)
    return {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}


def _model(ctx, config: BertConfig, finetune_dir):
    """(model, its step, the fine-tune's spec and metrics or None, the preprocessing length
    and why): the fine-tuned classifier, else the pretrained model."""
    if not finetune_dir:
        model = BertPretrainer(config)
        step = checkpoints.restore_model(model, ctx.inputs["checkpoint_dir"])
        params = _upstream_params(ctx, "pretrain", ctx.inputs["checkpoint_dir"])
        seq_length, why = TrainSpec.pick(params).max_seq_length, "the pretraining max_seq_length"
        finetune = metrics = None
    else:
        model, step, metrics = _finetuned(config, finetune_dir)
        # The task's text fields and length: metrics.json's if it records them, else the
        # finetune stage's params.
        params = _upstream_params(ctx, "finetune", finetune_dir)
        if metrics.text_fields is not None:
            params.update(text_fields=metrics.text_fields)
        if metrics.max_seq_length is not None:
            params.update(max_seq_length=metrics.max_seq_length)
        finetune = FinetuneSpec.pick(params)
        seq_length, why = finetune.max_seq_length, "the fine-tune's max_seq_length"
    if not params:
        ctx.progress(f"WARNING: the {'finetune' if finetune_dir else 'pretrain'} stage's "
                     "params are neither in the plan nor in its MANIFEST.json: its defaults "
                     "are assumed (sequence length"
                     + (", one text field" if finetune_dir else "") + ")")
    if seq_length > config.max_position_embeddings:
        seq_length, why = config.max_position_embeddings, "the model's max_position_embeddings"
    return model, step, (finetune, metrics), seq_length, why


def _labels(ctx, model, finetune, metrics, finetune_dir: str) -> list[str]:
    labels = [str(label) for label in metrics.labels or finetune.data.labels or
              range(model.num_labels)]
    if metrics.labels is None and not finetune.data.labels:
        ctx.progress(f"WARNING: {finetune_dir}/{METRICS_FILE} names no labels: the "
                     "classifier's labels are the class numbers")
    return labels


def run(ctx) -> ExportSummary:
    # tensorflow_text: imported when the stage runs.
    from runexp.runtime.export.preprocessing import vocab_file, vocab_report

    spec, inputs = ExportSpec.from_stage(ctx), ctx.inputs
    config = BertConfig.from_dict(spec.model)
    finetune_dir = inputs.get("finetune_dir") or selected_dir(inputs)
    model, step, (finetune, metrics), seq_length, why = _model(ctx, config, finetune_dir)
    # The vocabulary the model was trained with (each SavedModel keeps a copy as an asset).
    vocab_dir = inputs["vocab_dir"]
    report = vocab_report(vocab_dir)
    parameters = count_parameters(model.google_variables())
    facts = readme.ExportFacts(
        step=step, parameters=parameters, layers=config.num_hidden_layers,
        hidden=config.hidden_size, vocab_type=report["type"],
        do_lower_case=bool(report["do_lower_case"]), seq_length=seq_length,
        seq_length_source=why, task=finetune.task if finetune else "",
        vocab_files=[n for n in artifacts.VOCAB_FILES
                     if os.path.exists(os.path.join(vocab_dir, n))],
        labels=_labels(ctx, model, finetune, metrics, finetune_dir) if finetune else None,
        text_fields=list(finetune.data.text_fields) if finetune else None,
        special_ids=_special_ids(vocab_dir))
    job = artifacts.ExportJob(model, config, ctx.work_dir, vocab_dir, vocab_file(vocab_dir),
                              facts)
    written = artifacts.write_all(job)
    dirs = [a for a in written if a.key]
    ctx.progress(f"exported step {step}: {parameters:,} parameters; "
                 f"{', '.join(a.path for a in dirs)} (seq_length {seq_length}, {why}), "
                 + ", ".join(a.said if a.said is not None else a.path for a in written
                             if not a.key and a.said != ""))
    return ExportSummary(
        artifacts={a.key: job.path(a) for a in dirs},
        point=os.path.basename(finetune_dir.rstrip("/")) if inputs.get("sweep_dir") else None,
        parameters=parameters, step=step, seq_length=seq_length, vocab_type=facts.vocab_type,
        do_lower_case=facts.do_lower_case,
        google_checkpoint=os.path.join(ctx.work_dir, artifacts.GoogleCheckpoint.prefix),
        vocab_files=list(facts.vocab_files))
