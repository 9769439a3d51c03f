"""The suite stage's summary and GLUE's averaging rule."""

import json

import pytest

from tests.support.runtime import make_ctx
from runexp.runtime.glue_score import glue_average, task_score
from runexp.runtime.stages import suite

# BERT-large's GLUE test scores (BERT paper, table 1): MRPC and QQP F1/accuracy, STS-B
# Pearson/Spearman, MNLI matched/mismatched; the leaderboard's score for them is 80.5.
BERT_LARGE = {
    "cola": ({"test": {"mcc": 60.5}}, ["mcc"]),
    "sst2": ({"test": {"accuracy": 94.9}}, ["accuracy"]),
    "mrpc": ({"test": {"f1": 89.3, "accuracy": 85.4}}, ["f1", "accuracy"]),
    "stsb": ({"test": {"pearson": 87.6, "spearman": 86.5}}, ["pearson", "spearman"]),
    "qqp": ({"test": {"f1": 72.1, "accuracy": 89.3}}, ["f1", "accuracy"]),
    "mnli": ({"matched": {"accuracy": 86.7}, "mismatched": {"accuracy": 85.9}}, ["accuracy"]),
    "qnli": ({"test": {"accuracy": 92.7}}, ["accuracy"]),
    "rte": ({"test": {"accuracy": 70.1}}, ["accuracy"]),
    "wnli": ({"test": {"accuracy": 65.1}}, ["accuracy"]),
}


def test_the_rule_gives_the_leaderboards_score_for_bert_large():
    scores = {t: task_score(sets, names) for t, (sets, names) in BERT_LARGE.items()}
    assert scores["mnli"] == pytest.approx(86.3)  # one task: matched and mismatched averaged
    assert round(glue_average(scores), 1) == 80.5
    # Counting MNLI's two sets as two tasks would not give the leaderboard's number.
    split = dict(scores, mnli_m=86.7, mnli_mm=85.9)
    del split["mnli"]
    assert round(glue_average(split), 1) != 80.5


def _metrics(kind, names, dev_sets):
    return {"kind": kind, "metrics": names, "dev_sets": dev_sets, "dev_examples": 10}


def test_suite_json_has_each_tasks_metrics_and_the_glue_average(tmp_path):
    tasks = {
        "mnli": _metrics("sentence_pair", ["accuracy"], {
            "matched": {"accuracy": 0.8, "majority_baseline": 0.4, "examples": 5},
            "mismatched": {"accuracy": 0.6, "majority_baseline": 0.4, "examples": 5}}),
        "stsb": _metrics("regression", ["pearson", "spearman"],
                         {"dev": {"pearson": 0.9, "spearman": 0.7, "examples": 10}}),
        "toy": _metrics("single_sentence", ["accuracy"], {"dev": {"accuracy": 1.0}}),
    }
    dirs = {}
    for name, metrics in tasks.items():
        d = tmp_path / f"finetune.{name}"
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps(metrics))
        dirs[name] = str(d)
    messages = []
    summary = suite.run(make_ctx("suite", {"tasks": ["mnli", "stsb", "toy"],
                                           "glue_tasks": ["mnli", "stsb"]},
                                 {"finetune_dirs": dirs}, str(tmp_path / "suite"), messages))
    written = json.loads((tmp_path / "suite" / "suite.json").read_text())
    assert written["tasks"]["mnli"]["dev_sets"] == {"matched": {"accuracy": 0.8},
                                                    "mismatched": {"accuracy": 0.6}}
    assert written["tasks"]["mnli"]["score"] == pytest.approx(0.7)
    assert written["tasks"]["stsb"]["score"] == pytest.approx(0.8)
    assert written["tasks"]["toy"]["score"] == 1.0  # scored, but not GLUE's
    glue = written["glue"]
    assert glue["average"] == pytest.approx(0.75) and glue["tasks"] == ["mnli", "stsb"]
    assert glue["missing"] == ["qqp", "qnli", "rte", "mrpc", "sst2", "cola"]
    assert "wnli" in glue["left_out"] and "MNLI: matched and mismatched" in glue["rule"]
    assert summary.glue_average == pytest.approx(0.75)
    assert any(m.startswith("GLUE average 0.7500 over mnli, stsb (WNLI left out; without qqp")
               for m in messages), messages
