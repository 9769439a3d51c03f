"""finetune stage: a task's kind and metrics. A sentence-pair classification scored by
accuracy, F1 and Matthews correlation, and a regression (1-output head, MSE, float labels)
scored by Pearson and Spearman correlation, each trained for real on a tiny encoder; the
scores in metrics.json are those scikit-learn and SciPy give on the predictions file."""

import csv
import json
import os

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from tests.support.runtime import TINY_MODEL, make_ctx, write_vocab_dir
from runexp.runtime.stages import finetune

POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "sad"]
FILLER = ["the", "movie", "was", "very", "plot", "acting"]


def _pairs(path, n, seed, regression):
    """sentence1 filler; sentence2 two mood words. Label: "1" when both are positive
    (a skewed binary task, so F1 and MCC differ from accuracy), or the score 2.5 per
    positive word."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["sentence1", "sentence2", "label"])
        for _ in range(n):
            positives = int(rng.integers(0, 3))
            words = list(rng.choice(POSITIVE, positives)) + list(rng.choice(NEGATIVE, 2 - positives))
            rng.shuffle(words)
            label = f"{2.5 * positives:.1f}" if regression else str(int(positives == 2))
            w.writerow([" ".join(rng.choice(FILLER, 3)), " ".join(words), label])


def _run(tmp_path, pretrained, regression, data_params):
    work_dir, _ = pretrained
    words = POSITIVE + NEGATIVE + FILLER
    vocab_dir = write_vocab_dir(str(tmp_path / "vocab"), 64,
                                words + [f"x{i}" for i in range(64 - 5 - len(words))])
    _pairs(tmp_path / "train.tsv", 192, 1, regression)
    _pairs(tmp_path / "dev.tsv", 64, 2, regression)
    params = {"task": "toy", "model": dict(TINY_MODEL), "batch_size": 16, "train_steps": 80,
              "warmup_steps": 8, "learning_rate": 1e-3, "max_seq_length": 16, "seed": 3,
              "text_fields": ["sentence1", "sentence2"], "label_field": "label", **data_params}
    inputs = {"train_file": str(tmp_path / "train.tsv"), "dev_file": str(tmp_path / "dev.tsv"),
              "vocab_dir": vocab_dir, "checkpoint_dir": work_dir}
    out = tmp_path / "finetune"
    summary = finetune.run(make_ctx("finetune", params, inputs, str(out))).to_dict()
    metrics = json.loads((out / "metrics.json").read_text())
    with open(out / "predictions.dev.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return summary, metrics, rows


def test_pair_classification_scored_by_accuracy_f1_and_matthews(tmp_path, pretrained):
    summary, metrics, rows = _run(tmp_path, pretrained, False,
                                  {"labels": ["0", "1"], "metrics": ["accuracy", "f1", "mcc"]})
    assert metrics["kind"] == "sentence_pair" and metrics["metrics"] == ["accuracy", "f1", "mcc"]
    dev = metrics["dev_sets"]["dev"]
    gold = [int(r["label"]) for r in rows]
    predicted = [int(r["prediction"]) for r in rows]
    assert len(rows) == dev["examples"] == 64
    assert dev["accuracy"] == pytest.approx(sk.accuracy_score(gold, predicted), abs=1e-12)
    assert dev["f1"] == pytest.approx(sk.f1_score(gold, predicted), abs=1e-12)
    assert dev["mcc"] == pytest.approx(sk.matthews_corrcoef(gold, predicted), abs=1e-12)
    assert dev["mcc"] > 0.3 and dev["accuracy"] > dev["majority_baseline"], dev
    assert summary["mcc"] == dev["mcc"] and summary["num_labels"] == 2


def test_regression_has_one_output_and_is_scored_by_correlations(tmp_path, pretrained):
    summary, metrics, rows = _run(tmp_path, pretrained, True, {"kind": "regression"})
    assert metrics["kind"] == "regression" and metrics["num_labels"] == 1
    assert metrics["metrics"] == ["pearson", "spearman"] and metrics["labels"] == []
    dev = metrics["dev_sets"]["dev"]
    assert "majority_baseline" not in dev and "accuracy" not in dev
    gold = [float(r["label"]) for r in rows]
    predicted = [float(r["prediction"]) for r in rows]
    # The file rounds to 4 decimals: the correlations of what it shows agree closely.
    assert dev["pearson"] == pytest.approx(stats.pearsonr(gold, predicted)[0], abs=1e-3)
    assert dev["spearman"] == pytest.approx(stats.spearmanr(gold, predicted)[0], abs=1e-3)
    assert dev["pearson"] > 0.5 and dev["spearman"] > 0.5, dev
    assert all(r["probability"] == "" for r in rows)
    assert os.path.exists(os.path.join(tmp_path, "finetune", "checkpoints", "checkpoint"))
    _check_regression_export(tmp_path, pretrained, rows)


def _check_regression_export(tmp_path, pretrained, rows):
    """The export of a regression: the classifier SavedModel's ``score`` is the finetune
    stage's prediction, and transformers reads huggingface/ as a regression with the same
    output (in a process of its own that never imports runexp)."""
    import tensorflow as tf

    from tests.support.export import export_ctx, stage
    from tests.support.hf import max_diff, transformers_outputs
    from runexp.runtime.stages import export

    tuned = stage("finetune", {"model": dict(TINY_MODEL), "max_seq_length": 16,
                               "text_fields": ["sentence1", "sentence2"],
                               "label_field": "label", "kind": "regression"},
                  {}, str(tmp_path / "finetune"))
    out = str(tmp_path / "export")
    export.run(export_ctx(TINY_MODEL, {"checkpoint_dir": pretrained[0],
                                       "vocab_dir": str(tmp_path / "vocab"),
                                       "finetune_dir": tuned.output_dir}, out, [tuned]))
    classifier = tf.saved_model.load(os.path.join(out, "classifier"))
    scores = classifier.classify_pair(tf.constant([r["sentence1"] for r in rows]),
                                      tf.constant([r["sentence2"] for r in rows]))
    assert "probabilities" not in scores and "label" not in scores
    np.testing.assert_allclose(scores["score"].numpy(), [float(r["prediction"]) for r in rows],
                               atol=1e-4)  # the predictions file rounds to 4 decimals
    with open(os.path.join(out, "huggingface", "config.json")) as f:
        config = json.load(f)
    assert config["problem_type"] == "regression" and config["num_labels"] == 1
    preprocess = tf.saved_model.load(os.path.join(out, "preprocessing"))
    packed = preprocess.bert_pack_inputs(
        [preprocess.tokenize(tf.constant([r[f] for r in rows])) for f in ("sentence1",
                                                                          "sentence2")])
    want = classifier.classify_ids(**packed)["logits"].numpy()
    got, _ = transformers_outputs(
        os.path.join(out, "huggingface"),
        {"input_ids": packed["input_word_ids"].numpy(),
         "attention_mask": packed["input_mask"].numpy(),
         "token_type_ids": packed["input_type_ids"].numpy()},
        str(tmp_path / "hf"), "AutoModelForSequenceClassification")
    assert max_diff(got["AutoModelForSequenceClassification.logits"], want) < 1e-4
