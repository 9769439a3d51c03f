"""Checkpoints: Google's TF1 name layout (export, init_checkpoint) and our training ones.

Two formats, on purpose:

- Google layout (``bert_model.ckpt.index`` / ``.data-*``): a flat bundle keyed by TF1
  variable names, what google-research/bert releases and reads. Written with
  ``tf.raw_ops.SaveV2`` under the names given, read with ``tf.train.load_checkpoint``.
- Training checkpoints: ``tf.train.Checkpoint`` objects (model, optimizer slots, step, data
  position) in ``<work_dir>/checkpoints/ckpt-<step>``, managed by ``CheckpointManager``.

Usage:
    save_google_checkpoint(model.google_variables(), f"{out}/bert_model.ckpt")
    report = load_google_checkpoint(model.google_variables(), init_prefix)
    prefix = latest_checkpoint(f"{stage_dir}/checkpoints")
    step = restore_model(BertPretrainer(config), pretrain_stage_dir)
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping

import tensorflow as tf

from runexp.compiler.errors import Problem, UserError

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
    """

    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unused: tuple[str, ...]


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
