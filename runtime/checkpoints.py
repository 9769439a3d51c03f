"""Checkpoints: Google's TF1 name layout (export, init_checkpoint), Hugging Face BERT
directories (init_checkpoint) and our training ones.

Three formats, on purpose:

- Google layout (``bert_model.ckpt.index`` / ``.data-*``): a flat bundle keyed by TF1
  variable names, what google-research/bert releases and reads. Written with
  ``tf.raw_ops.SaveV2`` under the names given, read with ``tf.train.load_checkpoint``.
- Hugging Face directory (``config.json`` + ``model.safetensors``, what transformers'
  ``save_pretrained`` writes): read with safetensors' numpy API (no torch), names mapped by
  runtime/huggingface_weights.py, config.json checked to compute what the model computes
  (runtime/huggingface_config.py). The export writes one (runtime/export/huggingface.py).
- Training checkpoints: ``tf.train.Checkpoint`` objects (model, optimizer slots, step, data
  position) in ``<work_dir>/checkpoints/ckpt-<step>``, managed by ``CheckpointManager``.

Usage:
    save_google_checkpoint(model.google_variables(), f"{out}/bert_model.ckpt")
    report = load_google_checkpoint(model.google_variables(), init_prefix)
    report = load_init_checkpoint(model.google_variables(), init, model.config)  # either
    prefix = latest_checkpoint(f"{stage_dir}/checkpoints")
    step = restore_model(BertPretrainer(config), pretrain_stage_dir)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Mapping

import numpy as np
import tensorflow as tf

from runexp.compiler.errors import Problem, UserError
from runexp.runtime import huggingface_config, huggingface_weights
from runexp.runtime.bert_config import BertConfig

CHECKPOINT_SUBDIR = "checkpoints"

# Names in Google's checkpoints that are training state, not model: never reported unused.
_TRAINING_STATE = re.compile(r"(/adam_[mv]$|^global_step$|^good_steps$|^loss_scale$)")


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a Google-layout load did.

    Attributes:
      loaded: names restored.
      missing: model variables the checkpoint lacks (left at their initial values).
      unused: checkpoint variables the model does not have (optimizer slots excluded).
      source: "google" (a TF1 checkpoint prefix) or "huggingface" (a transformers
        directory; ``unused`` then holds transformers names).
    """

    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unused: tuple[str, ...]
    source: str = "google"


def save_google_checkpoint(variables: Mapping[str, tf.Variable], prefix: str) -> str:
    """Writes ``variables`` under their Google names as a TF checkpoint bundle.

    Args:
      variables: {TF1 name: variable}, e.g. ``model.google_variables()``.
      prefix: e.g. ``<dir>/bert_model.ckpt``; writes ``prefix.index`` and
        ``prefix.data-00000-of-00001``.

    Returns:
      The prefix, readable by ``tf.train.load_checkpoint`` and TF1's Saver.
    """
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    names = sorted(variables)
    tensors = [tf.convert_to_tensor(variables[n]) for n in names]
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=tensors)
    return prefix


def load_google_checkpoint(variables: Mapping[str, tf.Variable], prefix: str) -> LoadReport:
    """Assigns every variable found under its Google name in the checkpoint at ``prefix``.

    Raises:
      UserError: no (readable) checkpoint at ``prefix``, the vocabulary sizes differ (the
        checkpoint was trained with another vocab), or any other shape differs.
    """
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.NotFoundError, ValueError) as e:
        raise UserError(Problem(f"init_checkpoint {prefix}: no checkpoint there ("
                                f"{str(e).splitlines()[0][:200]})",
                                hint="INIT_CHECKPOINT is a prefix: the path of the .index file "
                                     "without '.index', e.g. .../bert_model.ckpt")) from None
    except (tf.errors.DataLossError, tf.errors.OpError) as e:
        raise UserError(Problem(f"init_checkpoint {prefix}: the checkpoint cannot be read ("
                                f"{str(e).splitlines()[0][:200]})",
                                hint="copy it again (all of .index and .data-*), or point "
                                     "INIT_CHECKPOINT at another one")) from None
    shapes = reader.get_variable_to_shape_map()
    word = "bert/embeddings/word_embeddings"
    if word in shapes and word in variables:
        ckpt_vocab, model_vocab = shapes[word][0], variables[word].shape[0]
        if ckpt_vocab != model_vocab:
            raise UserError(Problem(
                f"init_checkpoint {prefix} has a vocabulary of {ckpt_vocab} tokens but the "
                f"model's vocab_size is {model_vocab}",
                hint="use the vocab the checkpoint was trained with (VOCAB = its vocab.txt), "
                     "or train from scratch (INIT_CHECKPOINT = None)"))
    mismatched = [f"{n}: checkpoint {shapes[n]} vs model {variables[n].shape.as_list()}"
                  for n in variables
                  if n in shapes and list(shapes[n]) != variables[n].shape.as_list()]
    if mismatched:
        raise UserError(Problem(f"init_checkpoint {prefix} does not fit the model: "
                                + "; ".join(mismatched[:5]),
                                hint="choose the model size of the checkpoint (models/*.gin) "
                                     "or set model.* to its bert_config.json"))
    loaded, missing = [], []
    for name, var in sorted(variables.items()):
        if name in shapes:
            var.assign(reader.get_tensor(name))
            loaded.append(name)
        else:
            missing.append(name)
    unused = sorted(n for n in shapes if n not in variables and not _TRAINING_STATE.search(n))
    return LoadReport(tuple(loaded), tuple(missing), tuple(unused))


def is_huggingface_dir(path: str) -> bool:
    """Whether ``init_checkpoint`` names a Hugging Face directory (it holds config.json)
    rather than a Google checkpoint prefix."""
    return tf.io.gfile.isdir(path) and tf.io.gfile.exists(
        os.path.join(path, huggingface_config.CONFIG_FILE))


def load_init_checkpoint(variables: Mapping[str, tf.Variable], path: str,
                         config: BertConfig) -> LoadReport:
    """``init_checkpoint`` into ``variables``: a Hugging Face directory (config.json +
    model.safetensors) or a Google checkpoint prefix."""
    if is_huggingface_dir(path):
        return load_huggingface_checkpoint(variables, path, config)
    return load_google_checkpoint(variables, path)


def _read_huggingface_config(directory: str) -> dict:
    path = os.path.join(directory, huggingface_config.CONFIG_FILE)
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (tf.errors.OpError, ValueError) as e:
        raise UserError(Problem(f"init_checkpoint {directory}: cannot read its "
                                f"{huggingface_config.CONFIG_FILE} ({str(e)[:200]})")) from None


def _read_safetensors(directory: str) -> dict:
    """{transformers name: array} of ``<directory>/model.safetensors``."""
    from safetensors.numpy import load

    path = os.path.join(directory, huggingface_config.WEIGHTS_FILE)
    if not tf.io.gfile.exists(path):
        present = sorted(tf.io.gfile.listdir(directory))
        raise UserError(Problem(
            f"init_checkpoint {directory} is a Hugging Face directory without "
            f"{huggingface_config.WEIGHTS_FILE} (it holds {', '.join(present[:8])})",
            hint="runexp reads the weights from one model.safetensors, without torch: save "
                 "the model with transformers' save_pretrained(directory) (safetensors is its "
                 "default; a sharded save: save_pretrained(directory, max_shard_size=\"20GB\"))"
        ))
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return load(f.read())
    except Exception as e:  # safetensors' errors (a truncated file, a dtype numpy lacks)
        raise UserError(Problem(
            f"init_checkpoint {path} cannot be read ({type(e).__name__}: {str(e)[:200]})",
            hint="copy it again; a bfloat16 checkpoint must be saved in float32 first "
                 "(model.float().save_pretrained(directory))")) from None


def load_huggingface_checkpoint(variables: Mapping[str, tf.Variable], directory: str,
                                config: BertConfig) -> LoadReport:
    """Assigns a Hugging Face BERT directory's weights to ``variables`` (Google names).

    A BertForPreTraining directory fills the encoder, pooler and both pretraining heads; a
    BertModel one (AutoModel's save_pretrained) the encoder and pooler (the heads are then
    ``missing``); a BertForSequenceClassification one the encoder, pooler and classifier.

    Raises:
      UserError: its config.json computes something other than ``config`` (activation,
        layer-norm epsilon, heads, sizes), model.safetensors is absent or unreadable, or a
        tensor's shape differs from its variable's (named both ways).
    """
    hf_config = _read_huggingface_config(directory)
    problems = huggingface_config.config_problems(hf_config, config)
    if problems:
        fields = huggingface_config.runexp_model_fields(hf_config)
        raise UserError(Problem(
            f"init_checkpoint {directory} computes something other than the model: "
            + "; ".join(problems),
            hint="set model.* to the checkpoint's config.json: "
                 + ", ".join(f"model.{k} = {v!r}" for k, v in sorted(fields.items()))
                 + ("; and VOCAB = the checkpoint's vocab.txt"
                    if any(p.startswith("vocab_size") for p in problems) else "")))
    tensors = _read_safetensors(directory)
    try:
        arrays, unused = huggingface_weights.from_huggingface(tensors, variables)
    except ValueError as e:
        raise UserError(Problem(f"init_checkpoint {directory}: {e}")) from None
    table = huggingface_weights.name_table(variables)
    word = "bert/embeddings/word_embeddings"
    if word in arrays and arrays[word].shape[0] != variables[word].shape[0]:
        raise UserError(Problem(
            f"init_checkpoint {directory} has a vocabulary of {arrays[word].shape[0]} tokens "
            f"but the model's vocab_size is {variables[word].shape[0]}",
            hint="use the vocab the checkpoint was trained with (VOCAB = its vocab.txt)"))
    mismatched = [f"{table[n]} ({n}): checkpoint {list(a.shape)} vs model "
                  f"{variables[n].shape.as_list()}" for n, a in sorted(arrays.items())
                  if list(a.shape) != variables[n].shape.as_list()]
    if mismatched:
        raise UserError(Problem(f"init_checkpoint {directory} does not fit the model: "
                                + "; ".join(mismatched[:5]),
                                hint="set model.* to the checkpoint's config.json"))
    for name, value in sorted(arrays.items()):
        variables[name].assign(np.asarray(value, dtype=np.float32))
    missing = sorted(n for n in variables if n not in arrays)
    return LoadReport(tuple(sorted(arrays)), tuple(missing), tuple(unused), "huggingface")


def latest_checkpoint(checkpoint_dir: str) -> str | None:
    """The newest training checkpoint prefix in ``checkpoint_dir``, or None."""
    if not tf.io.gfile.isdir(checkpoint_dir):
        return None
    return tf.train.latest_checkpoint(checkpoint_dir)


def require_latest_checkpoint(stage_dir: str) -> str:
    """The newest checkpoint under ``<stage_dir>/checkpoints``; a clear error if none."""
    prefix = latest_checkpoint(os.path.join(stage_dir, CHECKPOINT_SUBDIR))
    if prefix is None:
        raise FileNotFoundError(
            f"no checkpoint in {os.path.join(stage_dir, CHECKPOINT_SUBDIR)}: run the "
            "pretrain stage first")
    return prefix


def checkpoint_step(prefix: str) -> int:
    """The step a ``ckpt-<step>`` prefix was saved at."""
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else 0


def restore_model(model, stage_dir: str) -> int:
    """Restores the latest training checkpoint of a stage dir into ``model``; its step.

    ``model`` must have the structure the stage trained (``BertPretrainer`` for pretrain,
    ``BertClassifier`` for finetune); optimizer state in the checkpoint is ignored.
    """
    prefix = require_latest_checkpoint(stage_dir)
    tf.train.Checkpoint(model=model).restore(prefix).expect_partial() \
        .assert_existing_objects_matched()
    return checkpoint_step(prefix)


def restore_encoder(encoder, stage_dir: str) -> str:
    """Restores only the encoder of a stage dir's latest checkpoint; returns its prefix."""
    prefix = require_latest_checkpoint(stage_dir)
    # The checkpoint's "model" node has an "encoder" child: match just that subtree.
    tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=encoder)).restore(prefix) \
        .expect_partial().assert_existing_objects_matched()
    return prefix


def start_from_previous_phase(model, optimizer, stage_dir: str, carry_optimizer: bool) -> str:
    """Starts a pretraining phase from the previous phase's final checkpoint (the latest in
    its stage dir ``stage_dir``); returns its prefix.

    The model's weights (and its dropout generator) are restored. ``carry_optimizer``: the
    optimizer's slots (Adam/LAMB moments, Amos' ``v``, ``b``) are restored too, and its step
    set back to 0, so the phase's schedule and warmup start again (NVIDIA's PyTorch recipe);
    otherwise the optimizer starts fresh (google-research/bert: its ``init_checkpoint``
    restores trainable variables only). The data position is the phase's own (0) either way.
    """
    prefix = require_latest_checkpoint(stage_dir)
    tracked = {"model": model}
    if carry_optimizer:
        tracked["optimizer"] = optimizer
    tf.train.Checkpoint(**tracked).restore(prefix).expect_partial() \
        .assert_existing_objects_matched()
    if carry_optimizer:
        optimizer.iterations.assign(0)
    return prefix
