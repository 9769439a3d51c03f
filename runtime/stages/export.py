"""export stage: the model for each of its consumers.

Contract (docs/STAGES.md): params ``model``; inputs ``checkpoint_dir`` (pretrain stage dir),
``vocab_dir``, optionally ``finetune_dir`` (then the fine-tuned encoder is exported, with its
classifier), or a sweep's ``finetune_dirs`` (point -> dir) and ``sweep_dir`` (then the point
its ``sweep.json`` names ``exported``). Writes:

- ``encoder/``: TF Hub-style encoder SavedModel (runtime/export/encoder.py): int32
  ``input_word_ids``, ``input_mask``, ``input_type_ids`` [batch, seq] -> ``pooled_output``,
  ``sequence_output``, ``encoder_outputs`` (per layer), ``default``; the vocabulary as the
  asset ``vocab_file``, ``do_lower_case``.
- ``preprocessing/``: strings -> those inputs, tokenised in the graph exactly as runexp does
  (runtime/export/preprocessing.py), with ``tokenize`` and ``bert_pack_inputs``.
- ``classifier/`` (fine-tuned only): text -> ``logits``, ``probabilities``, ``label``
  (runtime/export/classifier.py).
- ``huggingface/``: a transformers BERT directory (runtime/export/huggingface.py):
  ``config.json`` (BertForPreTraining, or BertForSequenceClassification with the labels),
  ``model.safetensors``, and the tokenizer files.
- ``bert_model.ckpt.*`` (google-research/bert's layout; a fine-tuned one also holds the
  classifier's ``output_weights``/``output_bias``), ``bert_config.json``, ``vocab.txt`` (and
  ``spm.model``), ``README.md`` (how to load each, runtime/export/readme.py).

The preprocessing length is the fine-tune's ``max_seq_length`` when there is a finetune stage
(the classifier was trained and is served at it), else the pretraining ``max_seq_length`` (the
longest inputs the encoder was trained on; positions past it were never trained), both read
from the upstream stages' params in the plan (or their MANIFEST.json).
"""

from __future__ import annotations

import json
import os
import shutil

from runexp.compiler.plan import MANIFEST_FILE
from runexp.compiler.specs import ExportSpec, FinetuneSpec
from runexp.compiler.specs.train import TrainSpec
from runexp.runtime import checkpoints
from runexp.runtime.bert_config import BertConfig, write_bert_config
from runexp.runtime.model import BertClassifier, BertPretrainer, count_parameters
from runexp.runtime.export import huggingface as huggingface_lib, readme
from runexp.tasks.tokenizer import SPECIAL_TOKENS, load_tokenizer

ENCODER_DIR = "encoder"
PREPROCESSING_DIR = "preprocessing"
CLASSIFIER_DIR = "classifier"
GOOGLE_CHECKPOINT = "bert_model.ckpt"
README = "README.md"
VOCAB_FILES = ("vocab.txt", "spm.model")
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
        metrics = json.load(f)
    model = BertClassifier(config, int(metrics["num_labels"]),
                           regression=metrics.get("kind") == "regression")
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


def _copy_vocab(vocab_dir: str, out_dir: str) -> list[str]:
    copied = []
    for name in VOCAB_FILES:
        src = os.path.join(vocab_dir, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(out_dir, name))
            copied.append(name)
    return copied


def run(ctx) -> dict:
    # TensorFlow, tensorflow_text: imported when the stage runs.
    from runexp.runtime.export import classifier as classifier_lib
    from runexp.runtime.export import encoder as encoder_lib
    from runexp.runtime.export import preprocessing as preprocessing_lib

    spec, inputs = ExportSpec.from_stage(ctx), ctx.inputs
    config = BertConfig.from_dict(spec.model)
    out = ctx.work_dir
    finetune_dir = inputs.get("finetune_dir") or selected_dir(inputs)
    metrics = finetune = None
    if finetune_dir:
        model, step, metrics = _finetuned(config, finetune_dir)
        # The task's text fields and length: metrics.json's if it records them, else the
        # finetune stage's params.
        params = _upstream_params(ctx, "finetune", finetune_dir)
        params.update({k: metrics[k] for k in ("text_fields", "max_seq_length")
                       if k in metrics})
        finetune = FinetuneSpec.pick(params)
        seq_length, why = finetune.max_seq_length, "the fine-tune's max_seq_length"
    else:
        model = BertPretrainer(config)
        step = checkpoints.restore_model(model, inputs["checkpoint_dir"])
        params = _upstream_params(ctx, "pretrain", inputs["checkpoint_dir"])
        seq_length, why = TrainSpec.pick(params).max_seq_length, \
            "the pretraining max_seq_length"
    if not params:
        ctx.progress(f"WARNING: the {'finetune' if finetune_dir else 'pretrain'} stage's "
                     "params are neither in the plan nor in its MANIFEST.json: its defaults "
                     "are assumed (sequence length"
                     + (", one text field" if finetune_dir else "") + ")")
    if seq_length > config.max_position_embeddings:
        seq_length, why = config.max_position_embeddings, "the model's max_position_embeddings"
    variables = model.google_variables()

    # The vocabulary the model was trained with (each SavedModel keeps a copy as an asset).
    vocab_dir = inputs["vocab_dir"]
    report = preprocessing_lib.vocab_report(vocab_dir)
    copied = _copy_vocab(vocab_dir, out)
    sentencepiece = report["type"] == "sentencepiece"
    lower = bool(report["do_lower_case"])
    vocab_path = preprocessing_lib.vocab_file(vocab_dir)

    paths = {"encoder": os.path.join(out, ENCODER_DIR),
             "preprocessing": os.path.join(out, PREPROCESSING_DIR)}
    encoder_lib.save_encoder(model.encoder, paths["encoder"], vocab_path, sentencepiece, lower)
    preprocessing_lib.save_preprocessing(vocab_dir, seq_length, paths["preprocessing"])
    labels = text_fields = None
    if finetune_dir:
        labels = [str(label) for label in metrics.get("labels") or finetune.data.labels or
                  range(model.num_labels)]
        if "labels" not in metrics and not finetune.data.labels:
            ctx.progress(f"WARNING: {finetune_dir}/{METRICS_FILE} names no labels: the "
                         "classifier's labels are the class numbers")
        text_fields = list(finetune.data.text_fields)
        paths["classifier"] = os.path.join(out, CLASSIFIER_DIR)
        classifier_lib.save_classifier(model, vocab_dir, seq_length, labels, text_fields,
                                       paths["classifier"])
    special_ids = _special_ids(vocab_dir)
    paths["huggingface"] = os.path.join(out, huggingface_lib.HUGGINGFACE_DIR)
    huggingface_files = huggingface_lib.save_huggingface(
        model, paths["huggingface"], vocab_dir=vocab_dir, seq_length=seq_length,
        pad_token_id=special_ids.get("[PAD]"), labels=labels)
    checkpoints.save_google_checkpoint(variables, os.path.join(out, GOOGLE_CHECKPOINT))
    write_bert_config(config, out)
    parameters = count_parameters(variables)
    facts = readme.ExportFacts(
        step=step, parameters=parameters, layers=config.num_hidden_layers,
        hidden=config.hidden_size, vocab_type=report["type"], do_lower_case=lower,
        seq_length=seq_length, seq_length_source=why, vocab_files=copied, labels=labels,
        text_fields=text_fields, task=finetune.task if finetune else "",
        special_ids=special_ids, huggingface_files=huggingface_files)
    with open(os.path.join(out, README), "w", encoding="utf-8") as f:
        f.write(readme.render(facts))
    ctx.progress(f"exported step {step}: {parameters:,} parameters; "
                 f"{', '.join(name + '/' for name in paths)} (seq_length {seq_length}, {why}), "
                 f"{GOOGLE_CHECKPOINT}, {', '.join(copied)}, {README}")
    point = ({"point": os.path.basename(finetune_dir.rstrip("/"))} if inputs.get("sweep_dir")
             else {})  # the sweep's point exported
    return {**paths, **point, "parameters": parameters, "step": step, "seq_length": seq_length,
            "vocab_type": report["type"], "do_lower_case": lower,
            "google_checkpoint": os.path.join(out, GOOGLE_CHECKPOINT), "vocab_files": copied}
