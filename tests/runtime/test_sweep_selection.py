"""The sweep stage: each point scored, mean and standard deviation over the seeds, the
selected setting and the exported point; and the export stage taking that point."""

import json
import os
import statistics

import pytest

from runexp.compiler.specs import SweepSpec
from runexp.runtime.stages import sweep
from runexp.runtime.stages.export import selected_dir
from tests.support.runtime import make_ctx

POINTS = {f"lr{lr}.s{s}": {"learning_rate": float(lr), "seed": s}
          for lr in ("1e-4", "3e-5") for s in (1, 2, 3)}
# Dev accuracy per point: 3e-5 has the better mean (0.70 vs 0.6667), 1e-4 the best single
# seed (0.80): the selection is by the mean, not by a lucky seed.
ACCURACY = {"lr1e-4.s1": 0.80, "lr1e-4.s2": 0.60, "lr1e-4.s3": 0.60,
            "lr3e-5.s1": 0.68, "lr3e-5.s2": 0.72, "lr3e-5.s3": 0.70}


def _metrics(accuracy, f1=None, mismatched=None):
    dev_sets = {"dev": {"accuracy": accuracy, "majority_baseline": 0.5, "examples": 100}}
    names = ["accuracy"] if f1 is None else ["f1", "accuracy"]
    if f1 is not None:
        dev_sets["dev"]["f1"] = f1
    if mismatched is not None:
        dev_sets["mismatched"] = {"accuracy": mismatched, "majority_baseline": 0.5,
                                  "examples": 50}
    return {"kind": "single_sentence", "metrics": names, "dev_sets": dev_sets,
            "num_labels": 2, "labels": ["neg", "pos"], "dev_examples": 100,
            "accuracy": accuracy}


def _params(points=POINTS, **overrides):
    params = {"grid": {}, "task": "sst", "points": points, "varied": ["learning_rate"],
              "select_metric": None, "export_point": None, "rule": SweepSpec.default("rule")}
    params.update(overrides)
    return params


def _run(tmp_path, metrics, **overrides):
    dirs = {}
    for name, m in metrics.items():
        d = tmp_path / f"finetune.sst.{name}"
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps(m))
        dirs[name] = str(d)
    messages = []
    ctx = make_ctx("sweep", _params(**overrides), {"finetune_dirs": dirs},
                   str(tmp_path / "sweep.sst"), messages)
    summary = sweep.run(ctx)
    out = tmp_path / "sweep.sst"
    return (summary, json.loads((out / "sweep.json").read_text()),
            json.loads((out / "metrics.json").read_text()), messages, dirs)


def test_the_selection_is_the_best_mean_over_seeds_exported_at_its_best_seed(tmp_path):
    summary, result, metrics, messages, _ = _run(
        tmp_path, {n: _metrics(a) for n, a in ACCURACY.items()})
    by_name = {g["name"]: g for g in result["settings"]}
    assert list(by_name) == ["lr1e-4", "lr3e-5"]
    low, high = by_name["lr3e-5"], by_name["lr1e-4"]
    assert low["scores"] == [0.68, 0.72, 0.70] and low["seeds"] == [1, 2, 3]
    assert low["mean"] == pytest.approx(statistics.fmean([0.68, 0.72, 0.70]))
    assert low["std"] == pytest.approx(statistics.stdev([0.68, 0.72, 0.70]))  # sample std
    assert high["mean"] == pytest.approx(2.0 / 3.0)
    assert result["selected"]["setting"] == "lr3e-5"
    assert result["selected"]["point"] == "lr3e-5.s2"  # its best seed
    assert result["exported"] == "lr3e-5.s2"
    assert result["at_edge"] == ["learning_rate 3e-5 is the smallest value tried: the best "
                                 "may lie beyond it"]
    assert summary.selected == "lr3e-5" and summary.points == 6
    # metrics.json: the selected setting's mean over its seeds, in the finetune layout.
    assert metrics["dev_sets"]["dev"]["accuracy"] == pytest.approx(0.70)
    assert metrics["std"]["dev"]["accuracy"] == pytest.approx(0.02)
    assert metrics["seeds"] == 3 and metrics["point"] == "lr3e-5"
    assert metrics["kind"] == "single_sentence" and metrics["num_labels"] == 2
    assert any("<- selected" in m and m.startswith("lr3e-5:") for m in messages)
    png = (tmp_path / "sweep.sst" / sweep.GRID_FILE).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_ties_go_to_the_first_in_the_grid_and_a_named_point_is_exported(tmp_path):
    even = {n: _metrics(0.5) for n in POINTS}
    _, result, _, _, _ = _run(tmp_path, even, export_point="lr3e-5.s3")
    assert result["selected"]["setting"] == "lr1e-4"
    assert result["exported"] == "lr3e-5.s3"
    assert result["exported_why"] == "finetune.export_point"


def test_the_score_is_the_task_score_or_the_declared_metric(tmp_path):
    # Two metrics and two dev sets: the task score is their mean (GLUE's rule); select_metric
    # takes one metric's mean over the dev sets.
    points = {"lr1.s1": {"learning_rate": 1.0, "seed": 1},
              "lr2.s1": {"learning_rate": 2.0, "seed": 1}}
    metrics = {"lr1.s1": _metrics(0.9, f1=0.1, mismatched=0.9),
               "lr2.s1": _metrics(0.5, f1=0.7, mismatched=0.5)}
    metrics["lr1.s1"]["dev_sets"]["mismatched"]["f1"] = 0.1
    metrics["lr2.s1"]["dev_sets"]["mismatched"]["f1"] = 0.7
    _, result, _, _, _ = _run(tmp_path, metrics, points=points)
    assert result["points"]["lr1.s1"]["score"] == pytest.approx(0.5)
    assert result["points"]["lr2.s1"]["score"] == pytest.approx(0.6)
    assert result["selected"]["setting"] == "lr2"
    assert result["metric"] == "task score (mean of f1, accuracy)"
    assert result["settings"][0]["std"] is None  # one seed: no spread
    (tmp_path / "sweep.sst").rename(tmp_path / "first")
    for d in points:
        (tmp_path / f"finetune.sst.{d}").rename(tmp_path / f"first.{d}")
    _, result, _, _, _ = _run(tmp_path, metrics, points=points, select_metric="accuracy")
    assert result["selected"]["setting"] == "lr1" and result["metric"] == "accuracy"


def test_the_export_reads_the_exported_point_of_sweep_json(tmp_path):
    _, result, _, _, dirs = _run(tmp_path, {n: _metrics(a) for n, a in ACCURACY.items()})
    inputs = {"finetune_dirs": dirs, "sweep_dir": str(tmp_path / "sweep.sst")}
    assert selected_dir(inputs) == dirs["lr3e-5.s2"] == dirs[result["exported"]]
    assert selected_dir({"finetune_dir": dirs["lr1e-4.s1"]}) is None
    assert os.path.isdir(selected_dir(inputs))


def test_a_suite_scores_a_swept_task_by_its_selected_settings_mean(tmp_path):
    from runexp.runtime.stages import suite

    _, _, metrics, _, _ = _run(tmp_path, {n: _metrics(a) for n, a in ACCURACY.items()})
    summary = suite.summarise({"sst": metrics}, [])
    assert summary["tasks"]["sst"]["score"] == pytest.approx(0.70)
    assert summary["tasks"]["sst"]["dev_sets"] == {"dev": {"accuracy": pytest.approx(0.70)}}
