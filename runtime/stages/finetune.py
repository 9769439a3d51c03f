"""finetune stage: a classification head on the pretrained encoder, trained and scored.

Contract (docs/STAGES.md): params ``task``, ``labels``, ``model``, ``batch_size``,
``train_steps``, ``warmup_steps``, ``learning_rate``, ``max_seq_length``, ``seed``,
``text_fields``, ``label_field``; inputs ``train_file``, ``dev_file``, ``vocab_dir``,
``checkpoint_dir``. Writes ``checkpoints/``, ``metrics.json`` (``accuracy``,
``majority_baseline``, ``num_labels``, ``dev_examples``, ``train_examples``),
``predictions.tsv``.

Optional params, as the pretrain stage reads them (runtime/stages/pretrain.py):
``optimizer``, ``weight_decay``, ``decay``, ``decay_power``, ``end_learning_rate``,
``clip_norm``, ``grad_accum_steps``, ``compute_dtype``, ``jit_compile``, ``deadline_unix``.
"""

from __future__ import annotations

import collections
import glob
import json
import os

import numpy as np
import tensorflow as tf

from runexp.runtime import checkpoints, strategy as strategy_lib
from runexp.runtime.model import BertClassifier, BertConfig
from runexp.runtime.optimizer import optimizer_from_params
from runexp.runtime.stages.pretrain import training_options
from runexp.runtime.trainer import Trainer, classification_metrics
from runexp.tasks.classification import encode_examples, labels_of, load_examples
from runexp.tasks.tokenizer import load_tokenizer

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.tsv"


def _one_file(value) -> str:
    """An input given as a path, a glob or a list of them, resolved to one file."""
    patterns = [value] if isinstance(value, str) else list(value)
    files = sorted({f for pattern in patterns for f in (glob.glob(pattern) or [pattern])})
    if len(files) != 1 or not os.path.exists(files[0]):
        raise FileNotFoundError(f"expected one existing file for {value!r}, found {files}")
    return files[0]


def _predict(model: BertClassifier, arrays: dict, batch_size: int) -> np.ndarray:
    """Class probabilities [n, num_labels] for encoded examples."""
    features = {k: v for k, v in arrays.items() if k != "label_ids"}
    ds = tf.data.Dataset.from_tensor_slices(features).batch(batch_size)
    predict = tf.function(lambda f: tf.nn.softmax(model(f, training=False)),
                          reduce_retracing=True)
    out = [predict(batch).numpy() for batch in ds]
    return np.concatenate(out) if out else np.zeros([0, model.num_labels], np.float32)


def _clean(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ")


def run(ctx) -> dict:
    p, inputs = ctx.params, ctx.inputs
    strategy_lib.configure_threads()
    seed = int(p.get("seed", 0))
    tf.random.set_seed(seed)
    text_fields = tuple(p.get("text_fields") or ("sentence",))
    label_field = p.get("label_field") or "label"
    seq, batch_size = int(p["max_seq_length"]), int(p["batch_size"])
    train_steps = int(p["train_steps"])

    tokenizer = load_tokenizer(inputs["vocab_dir"])
    train = load_examples(_one_file(inputs["train_file"]), text_fields, label_field)
    dev = load_examples(_one_file(inputs["dev_file"]), text_fields, label_field)
    if not train:
        raise ValueError(f"no training examples in {inputs['train_file']}")
    labels = list(p.get("labels") or labels_of(train))
    unknown = [ex for ex in dev if ex[1] not in labels]
    if unknown:
        ctx.progress(f"{len(unknown)} dev examples have labels not in the label set "
                     f"(e.g. {unknown[0][1]!r}): left out of the score")
    dev = [ex for ex in dev if ex[1] in labels]
    train_arrays = encode_examples(train, tokenizer, labels, seq)
    dev_arrays = encode_examples(dev, tokenizer, labels, seq)

    config = BertConfig.from_dict(p["model"])
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"model.vocab_size {config.vocab_size} is smaller than the vocab's "
                         f"{tokenizer.vocab_size} tokens")
    log_every = int(p.get("log_every") or max(1, min(100, train_steps // 5)))
    loop_config = training_options(p, train_steps, batch_size, steps_per_loop=log_every,
                                   log_every=log_every, checkpoint_every=train_steps,
                                   keep_checkpoints=1)
    strategy = strategy_lib.make_strategy(strategy_lib.accelerator_of(ctx))
    xla = loop_config.jit_compile or strategy_lib.is_tpu(strategy_lib.accelerator_of(ctx))
    with strategy.scope():
        model = BertClassifier(config, num_labels=len(labels),
                               compute_dtype=loop_config.compute_dtype, seed=seed, xla=xla)
        optimizer = optimizer_from_params(p, train_steps, config.hidden_size)
    pretrained = checkpoints.restore_encoder(model.encoder, inputs["checkpoint_dir"])
    ctx.progress(f"encoder from {pretrained}; {len(train)} train / {len(dev)} dev examples, "
                 f"{len(labels)} labels")

    trainer = Trainer(strategy, model, optimizer, ctx.work_dir, loop_config,
                      metrics_fn=classification_metrics, progress=ctx.progress,
                      on_checkpoint=ctx.sync)

    def make_dataset(skip_batches: int):
        ds = tf.data.Dataset.from_tensor_slices(train_arrays)
        ds = ds.shuffle(len(train), seed=seed, reshuffle_each_iteration=True).repeat()
        return ds.batch(batch_size, drop_remainder=True).skip(skip_batches).prefetch(2)

    result = trainer.train(make_dataset)

    probs = _predict(model, dev_arrays, batch_size)
    predicted = probs.argmax(axis=1) if len(dev) else np.zeros([0], np.int64)
    gold = dev_arrays["label_ids"]
    accuracy = float((predicted == gold).mean()) if len(dev) else 0.0
    majority_label = collections.Counter(label for _, label in train).most_common(1)[0][0]
    majority = (sum(label == majority_label for _, label in dev) / len(dev)) if dev else 0.0
    metrics = {
        "accuracy": accuracy,
        "majority_baseline": majority,
        "majority_label": majority_label,
        "num_labels": len(labels),
        "labels": labels,
        "dev_examples": len(dev),
        "train_examples": len(train),
        "train_loss": result.get("loss"),
        "step": result["step"],
    }
    with open(os.path.join(ctx.work_dir, METRICS_FILE), "w") as f:
        json.dump(metrics, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(ctx.work_dir, PREDICTIONS_FILE), "w", encoding="utf-8") as f:
        f.write("\t".join(["label", "prediction", "probability", *text_fields]) + "\n")
        for (texts, label), k, row in zip(dev, predicted, probs):
            f.write("\t".join([label, labels[k], f"{row[k]:.4f}",
                               *(_clean(t) for t in texts)]) + "\n")
    ctx.progress(f"dev accuracy {accuracy:.4f} (majority baseline {majority:.4f})")
    return {"accuracy": accuracy, "majority_baseline": majority, "num_labels": len(labels),
            "dev_examples": len(dev), "train_examples": len(train), "step": result["step"]}
