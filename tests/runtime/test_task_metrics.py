"""The fine-tune metrics agree with scikit-learn's and SciPy's on the same predictions."""

import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from runexp.compiler.specs.task_kinds import KINDS, METRICS, task_kind
from runexp.runtime import task_metrics


def _reference(name, gold, predicted):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SciPy's constant-input and sklearn's zero-division
        return {"accuracy": lambda: sk.accuracy_score(gold, predicted),
                "f1": lambda: sk.f1_score(gold, predicted),
                "mcc": lambda: sk.matthews_corrcoef(gold, predicted),
                "pearson": lambda: stats.pearsonr(gold, predicted)[0],
                "spearman": lambda: stats.spearmanr(gold, predicted)[0]}[name]()


def _same(ours, theirs):
    assert (np.isnan(ours) and np.isnan(theirs)) or ours == pytest.approx(theirs, abs=1e-12), \
        (ours, theirs)


@pytest.mark.parametrize("seed", range(40))
def test_binary_classification_metrics_match_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    gold = rng.integers(0, 2, n)
    # From random guesses to nearly right, and degenerate ones (all one class).
    predicted = np.where(rng.random(n) < rng.random(), gold, rng.integers(0, 2, n))
    if seed % 10 == 0:
        predicted = np.zeros(n, np.int64)
    for name in ("accuracy", "f1", "mcc"):
        _same(task_metrics.score([name], gold, predicted)[name], _reference(name, gold, predicted))


@pytest.mark.parametrize("seed", range(20))
def test_multiclass_accuracy_and_matthews_match_scikit_learn(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 80))
    gold, predicted = rng.integers(0, 3, n), rng.integers(0, 3, n)
    predicted[: n // 2] = gold[: n // 2]
    for name in ("accuracy", "mcc"):
        _same(task_metrics.score([name], gold, predicted)[name], _reference(name, gold, predicted))


@pytest.mark.parametrize("seed", range(30))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(2, 60))
    gold = np.round(rng.uniform(0, 5, n), 1)  # STS-B-like scores, with ties
    predicted = gold * rng.random() + rng.normal(0, 1, n)
    if seed % 3 == 0:
        predicted = np.round(predicted)  # ties on both sides
    if seed == 3:
        predicted = np.full(n, 2.5)  # constant: NaN, as SciPy
    for name in ("pearson", "spearman"):
        _same(task_metrics.score([name], gold, predicted)[name], _reference(name, gold, predicted))


def test_f1_is_of_the_positive_class_label_id_1():
    gold, predicted = np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0])
    assert task_metrics.f1(gold, predicted) == pytest.approx(2 / 3)
    assert task_metrics.f1(1 - gold, 1 - predicted) == pytest.approx(0.8)


def test_every_kind_declares_metrics_that_exist():
    for kind in KINDS.values():
        assert kind.metrics and set(kind.metrics) <= set(kind.allowed_metrics) <= set(METRICS)
    assert task_kind(None, ["a"]).name == "single_sentence"
    assert task_kind(None, ["a", "b"]).name == "sentence_pair"
    assert task_kind("regression", ["a", "b"]).regression
