"""finetune stage: a classifier on the pretrained encoder, on a tiny TSV."""

import csv
import json
import os

import numpy as np
import pytest

from tests.support.runtime import TINY_MODEL, make_ctx, write_vocab_dir
from runexp.compiler.errors import UserError
from runexp.runtime import checkpoints
from runexp.runtime.model import BertConfig, BertPretrainer
from runexp.runtime.stages import finetune

WORDS = ["good", "great", "fine", "nice", "bad", "awful", "poor", "sad", "the", "movie",
         "was", "very", "plot", "acting"]


def _write_tsv(path, n, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["label", "sentence"])
        for _ in range(n):
            label = rng.choice(["pos", "neg"])
            mood = WORDS[:4] if label == "pos" else WORDS[4:8]
            words = list(rng.choice(WORDS[8:], 4)) + list(rng.choice(mood, 2))
            rng.shuffle(words)
            w.writerow([label, " ".join(words)])


def _toy_task(tmp_path):
    """(vocab_dir, params) of a two-label task on the tiny encoder."""
    # The encoder's vocab has 64 ids: a real wordpiece vocab of our words, padded.
    words = WORDS + [f"x{i}" for i in range(64 - 5 - len(WORDS))]
    vocab_dir = write_vocab_dir(str(tmp_path / "vocab"), 64, words)
    _write_tsv(tmp_path / "train.tsv", 160, seed=1)
    _write_tsv(tmp_path / "dev.tsv", 60, seed=2)
    params = {"task": "toy", "labels": None, "model": dict(TINY_MODEL), "batch_size": 16,
              "train_steps": 60, "warmup_steps": 6, "learning_rate": 1e-3,
              "max_seq_length": 16, "seed": 3, "text_fields": ["sentence"],
              "label_field": "label"}
    return vocab_dir, params


def test_finetune_beats_the_majority_label(pretrained, tmp_path):
    work_dir, _ = pretrained
    vocab_dir, params = _toy_task(tmp_path)
    inputs = {"train_file": str(tmp_path / "train.tsv"), "dev_file": str(tmp_path / "dev.tsv"),
              "vocab_dir": vocab_dir, "checkpoint_dir": work_dir}
    out = str(tmp_path / "finetune")
    summary = finetune.run(make_ctx("finetune", params, inputs, out)).to_dict()
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["num_labels"] == 2 and metrics["dev_examples"] == 60
    assert metrics["train_examples"] == 160
    assert metrics["accuracy"] == summary["accuracy"]
    assert metrics["accuracy"] > metrics["majority_baseline"] + 0.2
    with open(os.path.join(out, "predictions.dev.tsv")) as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["label", "prediction", "probability", "sentence"]
    assert len(rows) == 61
    assert os.path.exists(os.path.join(out, "checkpoints", "checkpoint"))


def test_finetune_from_a_google_checkpoint_scores_each_dev_set(pretrained, tmp_path):
    """A fine-tune-only experiment: the encoder comes from a checkpoint in Google's layout
    (as released BERTs are), and each named dev set gets its own score and predictions."""
    work_dir, _ = pretrained
    vocab_dir, params = _toy_task(tmp_path)
    _write_tsv(tmp_path / "dev2.tsv", 40, seed=4)
    source = BertPretrainer(BertConfig.from_dict(TINY_MODEL))
    checkpoints.restore_model(source, work_dir)
    prefix = checkpoints.save_google_checkpoint(source.google_variables(),
                                                str(tmp_path / "google" / "bert_model.ckpt"))
    inputs = {"train_file": str(tmp_path / "train.tsv"),
              "dev_files": {"matched": str(tmp_path / "dev.tsv"),
                            "mismatched": str(tmp_path / "dev2.tsv")},
              "vocab_dir": vocab_dir, "init_checkpoint": prefix}
    out = str(tmp_path / "finetune")
    messages = []
    summary = finetune.run(make_ctx("finetune", params, inputs, out, messages)).to_dict()
    assert list(summary["dev_sets"]) == ["matched", "mismatched"]
    assert summary["dev_sets"]["matched"]["examples"] == 60
    assert summary["dev_sets"]["mismatched"]["examples"] == 40
    for scores in summary["dev_sets"].values():
        assert scores["accuracy"] > scores["majority_baseline"] + 0.2
    assert summary["accuracy"] == summary["dev_sets"]["matched"]["accuracy"]
    for name, rows in (("matched", 61), ("mismatched", 41)):
        with open(os.path.join(out, f"predictions.{name}.tsv")) as f:
            assert len(list(csv.reader(f, delimiter="\t"))) == rows
    assert any(m.startswith(f"init_checkpoint {prefix}") and "classifier (output_bias, "
               "output_weights) starts fresh" in m for m in messages), messages

    # A checkpoint without the encoder is refused, not silently trained from scratch.
    heads = {k: v for k, v in source.google_variables().items() if k.startswith("cls/")}
    other = checkpoints.save_google_checkpoint(heads, str(tmp_path / "heads" / "model.ckpt"))
    with pytest.raises(UserError, match="lacks .* encoder variables"):
        finetune.run(make_ctx("finetune", params, dict(inputs, init_checkpoint=other),
                              str(tmp_path / "bad"))).to_dict()
