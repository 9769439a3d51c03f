"""Helpers and fixtures for the runtime tests: real pretraining TFRecords in the preprocess
stage's layout (a seqio cache of one task in the stage directory).

The records are synthetic but structured (a token's id depends on its position, Zipfian
otherwise, so a model learns to predict masked tokens better than the majority token) and
written in
google-research/bert's exact feature format with ``tf.io.TFRecordWriter``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)


def write_vocab_dir(vocab_dir: str, vocab_size: int, words: list[str] | None = None) -> str:
    """vocab.txt (specials first, then ``words`` or w5, w6, ...) and a wordpiece report."""
    os.makedirs(vocab_dir, exist_ok=True)
    words = list(words or [f"w{i}" for i in range(len(SPECIAL), vocab_size)])
    tokens = SPECIAL + words
    with open(os.path.join(vocab_dir, "vocab.txt"), "w") as f:
        f.write("\n".join(tokens) + "\n")
    with open(os.path.join(vocab_dir, "report.json"), "w") as f:
        json.dump({"type": "wordpiece", "vocab_size": len(tokens), "do_lower_case": True,
                   "unk_rate": 0.0, "pieces_per_word": 1.0, "sample_words": []}, f)
    return vocab_dir


def _sentence(rng, vocab_size, start, length):
    # A token's id is congruent to its position mod 8 (one "topic" per position class) and
    # Zipfian within its topic: learnable in a few dozen steps from the position embeddings,
    # and much better than always predicting the most frequent token.
    per_topic = (vocab_size - len(SPECIAL)) // _TOPICS
    ranks = np.minimum(rng.zipf(1.5, size=length) - 1, per_topic - 1)
    return [len(SPECIAL) + (start + i) % _TOPICS + _TOPICS * int(r)
            for i, r in enumerate(ranks)]


_TOPICS = 8


def make_instance(rng, vocab_size, max_seq_length, max_predictions):
    """One instance in google-research/bert's layout (dict of lists)."""
    budget = max_seq_length - 3
    len_a = int(rng.integers(budget // 4, budget // 2 + 1))
    len_b = int(rng.integers(budget // 4, budget - len_a + 1))
    a = _sentence(rng, vocab_size, 1, len_a)
    b = _sentence(rng, vocab_size, len_a + 2, len_b)
    tokens = [CLS] + a + [SEP] + b + [SEP]
    segments = [0] * (len_a + 2) + [1] * (len_b + 1)
    candidates = [i for i, t in enumerate(tokens) if t not in (CLS, SEP)]
    num = min(max_predictions, max(1, int(round(len(tokens) * 0.15))))
    positions = sorted(rng.choice(candidates, size=num, replace=False).tolist())
    ids = [tokens[p] for p in positions]
    for p in positions:
        r = rng.random()
        if r < 0.8:
            tokens[p] = MASK
        elif r < 0.9:
            tokens[p] = int(rng.integers(len(SPECIAL), vocab_size))
    pad = max_seq_length - len(tokens)
    ppad = max_predictions - num
    return {
        "input_ids": tokens + [PAD] * pad,
        "input_mask": [1] * len(tokens) + [0] * pad,
        "segment_ids": segments + [0] * pad,
        "masked_lm_positions": positions + [0] * ppad,
        "masked_lm_ids": ids + [0] * ppad,
        "masked_lm_weights": [1.0] * num + [0.0] * ppad,
        "next_sentence_labels": [int(rng.integers(0, 2))],
    }


def write_pretraining_records(data_dir: str, split: str, num_examples: int, vocab_size: int,
                              max_seq_length: int, max_predictions: int, seed: int = 0,
                              num_shards: int = 2, task: str | None = None) -> list[str]:
    """Writes a preprocess stage directory's seqio cache of ``task`` (default: the data
    dir's name): ``<data_dir>/<task>/<split>.tfrecord-0000i-of-0000N`` shards of
    tf.train.Examples, ``info.<split>.json``, ``stats.<split>.json`` and ``COMPLETED``."""
    import tensorflow as tf

    from runexp.tasks.cache import records

    cache_dir = records.task_cache_dir(data_dir, task or os.path.basename(data_dir))
    os.makedirs(cache_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = [records.shard_path(cache_dir, split, i, num_shards) for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    for n in range(num_examples):
        inst = make_instance(rng, vocab_size, max_seq_length, max_predictions)
        feature = {
            k: (tf.train.Feature(float_list=tf.train.FloatList(value=v))
                if k == "masked_lm_weights"
                else tf.train.Feature(int64_list=tf.train.Int64List(value=v)))
            for k, v in inst.items()}
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        writers[n % num_shards].write(example.SerializeToString())
    for w in writers:
        w.close()
    records.write_info(cache_dir, split, num_shards, max_seq_length, max_predictions)
    records.write_stats(cache_dir, split, {"examples": num_examples})
    records.write_completed(cache_dir)
    return paths


TINY_MODEL = {
    "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 64, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64,
    "type_vocab_size": 2, "initializer_range": 0.02,
}
TINY_SEQ, TINY_PRED = 32, 5


@pytest.fixture(scope="session")
def pretrain_data(tmp_path_factory):
    """(data_dir, vocab_dir) with train/validation records for TINY_MODEL."""
    root = tmp_path_factory.mktemp("pretrain_data")
    data_dir, vocab_dir = str(root / "preprocess"), str(root / "vocab")
    write_vocab_dir(vocab_dir, TINY_MODEL["vocab_size"])
    write_pretraining_records(data_dir, "train", 1200, TINY_MODEL["vocab_size"], TINY_SEQ,
                              TINY_PRED, seed=1)
    write_pretraining_records(data_dir, "validation", 200, TINY_MODEL["vocab_size"], TINY_SEQ,
                              TINY_PRED, seed=2, num_shards=1)
    return data_dir, vocab_dir


def make_ctx(kind: str, params: dict, inputs: dict, work_dir: str, messages=None):
    """A StageContext for one stage of a one-stage plan; progress lines go to messages."""
    from runexp.compiler.plan import Plan, Stage
    from runexp.runtime.context import StageContext

    os.makedirs(work_dir, exist_ok=True)
    stage = Stage(id=kind, kind=kind, params=params, inputs=inputs, output_dir=work_dir)
    plan = Plan(experiment="test", output_root=os.path.dirname(work_dir), stages=(stage,),
                accelerator={"type": "cpu"})
    sink = messages.append if messages is not None else (lambda _: None)
    return StageContext(stage=stage, plan=plan, work_dir=work_dir, progress=sink)


def pretrain_params(**overrides) -> dict:
    """pretrain params for TINY_MODEL on the pretrain_data fixture."""
    params = {
        "model": dict(TINY_MODEL), "batch_size": 16, "train_steps": 120, "warmup_steps": 10,
        "learning_rate": 3e-3, "weight_decay": 0.01, "checkpoint_every": 60,
        "keep_checkpoints": 3, "init_checkpoint": None, "max_seq_length": TINY_SEQ,
        "max_predictions_per_seq": TINY_PRED, "seed": 7, "steps_per_loop": 10,
        "log_every": 30, "accelerator": {"type": "cpu"},
    }
    params.update(overrides)
    return params


@pytest.fixture(scope="session")
def pretrained(pretrain_data, tmp_path_factory):
    """A pretrain stage dir trained for 120 steps on the tiny data, evaluated on the held-out
    split at steps 60 and 120: (work_dir, summary)."""
    from runexp.runtime.stages import pretrain

    data_dir, vocab_dir = pretrain_data
    work_dir = str(tmp_path_factory.mktemp("pretrained") / "pretrain")
    ctx = make_ctx("pretrain", pretrain_params(eval_every=60),
                   {"data_dir": data_dir, "vocab_dir": vocab_dir}, work_dir)
    return work_dir, pretrain.run(ctx).to_dict()
