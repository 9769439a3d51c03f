"""finetune stage: a classifier on the pretrained encoder, on a tiny TSV."""

import csv
import json
import os

import numpy as np

from runtime_testlib import TINY_MODEL, make_ctx, write_vocab_dir
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


def test_finetune_beats_the_majority_label(pretrained, tmp_path):
    work_dir, _ = pretrained
    # The encoder's vocab has 64 ids: a real wordpiece vocab of our words, padded.
    words = WORDS + [f"x{i}" for i in range(64 - 5 - len(WORDS))]
    vocab_dir = write_vocab_dir(str(tmp_path / "vocab"), 64, words)
    _write_tsv(tmp_path / "train.tsv", 160, seed=1)
    _write_tsv(tmp_path / "dev.tsv", 60, seed=2)
    params = {"task": "toy", "labels": None, "model": dict(TINY_MODEL), "batch_size": 16,
              "train_steps": 60, "warmup_steps": 6, "learning_rate": 1e-3,
              "max_seq_length": 16, "seed": 3, "text_fields": ["sentence"],
              "label_field": "label"}
    inputs = {"train_file": str(tmp_path / "train.tsv"), "dev_file": str(tmp_path / "dev.tsv"),
              "vocab_dir": vocab_dir, "checkpoint_dir": work_dir}
    out = str(tmp_path / "finetune")
    summary = finetune.run(make_ctx("finetune", params, inputs, out))
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["num_labels"] == 2 and metrics["dev_examples"] == 60
    assert metrics["train_examples"] == 160
    assert metrics["accuracy"] == summary["accuracy"]
    assert metrics["accuracy"] > metrics["majority_baseline"] + 0.2
    with open(os.path.join(out, "predictions.tsv")) as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["label", "prediction", "probability", "sentence"]
    assert len(rows) == 61
    assert os.path.exists(os.path.join(out, "checkpoints", "checkpoint"))
