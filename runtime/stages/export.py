"""export stage: the encoder as a SavedModel, a Google-layout checkpoint, config and vocab.

Contract (docs/STAGES.md): params ``model``; inputs ``checkpoint_dir`` (pretrain stage dir),
``vocab_dir``, optionally ``finetune_dir`` (then the fine-tuned encoder is exported and the
Google checkpoint also holds the classifier's ``output_weights``/``output_bias``). Writes
``saved_model/`` (serving signature: int32 ``input_ids``, ``input_mask``, ``segment_ids``
[batch, seq] -> ``sequence_output`` [batch, seq, hidden], ``pooled_output``),
``bert_model.ckpt.*``, ``bert_config.json``, ``vocab.txt`` (and ``spm.model``).
"""

from __future__ import annotations

import json
import os
import shutil

import tensorflow as tf

from runexp.compiler.specs import ExportSpec
from runexp.runtime import checkpoints
from runexp.runtime.bert_config import BertConfig, write_bert_config
from runexp.runtime.model import BertClassifier, BertPretrainer, count_parameters

SAVED_MODEL_DIR = "saved_model"
GOOGLE_CHECKPOINT = "bert_model.ckpt"
VOCAB_FILES = ("vocab.txt", "spm.model")

_INT_MATRIX = tf.TensorSpec([None, None], tf.int32)


class EncoderExport(tf.Module):
    """What the SavedModel holds: the encoder and its serving function."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    @tf.function(input_signature=[_INT_MATRIX, _INT_MATRIX, _INT_MATRIX])
    def serve(self, input_ids, input_mask, segment_ids):
        sequence, pooled = self.encoder(input_ids, input_mask, segment_ids, training=False)
        shape = tf.shape(input_ids)
        sequence = tf.reshape(sequence, [shape[0], shape[1], self.encoder.config.hidden_size])
        return {"sequence_output": sequence, "pooled_output": pooled}


def _finetuned(config: BertConfig, finetune_dir: str):
    """The classifier of a finetune stage dir, restored from its latest checkpoint."""
    with open(os.path.join(finetune_dir, "metrics.json")) as f:
        num_labels = int(json.load(f)["num_labels"])
    model = BertClassifier(config, num_labels)
    return model, checkpoints.restore_model(model, finetune_dir)


def run(ctx) -> dict:
    spec, inputs = ExportSpec.from_stage(ctx), ctx.inputs
    config = BertConfig.from_dict(spec.model)
    if inputs.get("finetune_dir"):
        model, step = _finetuned(config, inputs["finetune_dir"])
    else:
        model = BertPretrainer(config)
        step = checkpoints.restore_model(model, inputs["checkpoint_dir"])
    variables = model.google_variables()

    saved_model = os.path.join(ctx.work_dir, SAVED_MODEL_DIR)
    module = EncoderExport(model.encoder)
    tf.saved_model.save(module, saved_model, signatures={"serving_default": module.serve})
    checkpoints.save_google_checkpoint(variables, os.path.join(ctx.work_dir, GOOGLE_CHECKPOINT))
    write_bert_config(config, ctx.work_dir)
    copied = []
    for name in VOCAB_FILES:
        src = os.path.join(inputs["vocab_dir"], name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(ctx.work_dir, name))
            copied.append(name)
    parameters = count_parameters(variables)
    ctx.progress(f"exported step {step}: {parameters:,} parameters, {saved_model}, "
                 f"{GOOGLE_CHECKPOINT}, {', '.join(copied)}")
    return {"saved_model": saved_model, "parameters": parameters, "step": step,
            "google_checkpoint": os.path.join(ctx.work_dir, GOOGLE_CHECKPOINT),
            "vocab_files": copied}
