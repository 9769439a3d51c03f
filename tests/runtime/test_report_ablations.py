"""The report's ablation section (runtime/report/ablations.py) on experiments compiled from
gin/experiments/quickstart_packing.gin (packing False/True x train.seed 1, 2, 3) whose stage
outputs are written here as the stages write them: MANIFEST.json and COMPLETED, and held-out
evaluations through the trainer's own log writer (runtime/train_log.py's RunLog). No
training. The numbers the table shows are computed here again from the logs written.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics

import pytest

from runexp.runtime.report import ablation_figure, ablations, report

GIN = "experiments/quickstart_packing.gin"
STEPS, EVAL_EVERY, BATCH = 600, 200, 32
SEEDS = (1, 2, 3)
# Per seed, the held-out accuracy and loss move by these (the seed noise) ...
ACC_NOISE = {1: -0.004, 2: 0.001, 3: 0.005}
LOSS_NOISE = {1: 0.012, 2: -0.004, 3: -0.010}
# ... and per group by these: the packed runs' accuracy within the noise, their loss not.
ACC_SHIFT = {False: 0.0, True: 0.001}
LOSS_SHIFT = {False: 0.0, True: 0.2}


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _finish(stage, summary: dict, seconds: float = 1.0) -> None:
    _write(os.path.join(stage.output_dir, "STARTED.json"), "{}")
    _write(os.path.join(stage.output_dir, "MANIFEST.json"), json.dumps(
        {"stage": stage.id, "kind": stage.kind, "fingerprint": stage.fingerprint,
         "seconds": seconds, "summary": summary}))
    _write(os.path.join(stage.output_dir, "COMPLETED"), stage.fingerprint + "\n")


def _eval_log(directory: str, packing: bool, seed: int, last_step: int = STEPS) -> None:
    """Held-out evaluations every EVAL_EVERY steps, written by the trainer's RunLog."""
    import tensorflow as tf

    from runexp.runtime.train_log import RunLog

    os.makedirs(directory, exist_ok=True)
    _write(os.path.join(directory, "STARTED.json"), "{}")
    log = RunLog(directory, tf.summary.create_noop_writer())
    for step in range(EVAL_EVERY, last_step + 1, EVAL_EVERY):
        acc = 0.05 + 0.1 * (1 - math.exp(-step / 300)) + ACC_NOISE[seed] + ACC_SHIFT[packing]
        mlm = 7.0 - 1.2 * (1 - math.exp(-step / 300)) + LOSS_NOISE[seed] + LOSS_SHIFT[packing]
        log.eval(step, {"loss": mlm + 0.68, "mlm_loss": mlm, "mlm_accuracy": acc,
                        "nsp_loss": 0.68, "nsp_accuracy": 0.55})


def _read_evals(directory: str) -> list[dict]:
    """The eval log as written, read here without runexp's readers."""
    with open(os.path.join(directory, "eval_log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _compile(root: str, *params: str):
    from runexp.compiler.planner import compile_experiment

    plan = compile_experiment([GIN], [
        f"OUTPUT_ROOT='{root}'", f"TRAIN_STEPS={STEPS}", f"train.eval_every={EVAL_EVERY}",
        "FINETUNE_TASK=None", "export.enabled=False", *params]).plan
    _write(os.path.join(root, "plan.json"), plan.to_json())
    return plan, {s.id: s for s in plan.stages}


def _data_stages(by_id: dict, factor: float = 1.25) -> None:
    _finish(by_id["corpus"], {"train": {"documents": 618, "sentences": 25548, "bytes": 1}})
    _finish(by_id["vocab"], {"type": "sentencepiece", "vocab_size": 8000})
    _finish(by_id["preprocess.pretrain.packingFalse"],
            {"train": {"documents": 618, "instances": 16534, "tokens": 1}})
    _finish(by_id["preprocess.pretrain.packingTrue"],
            {"train": {"documents": 618, "instances": 16534, "tokens": 1,
                       "packing": {"factor": factor, "fill": 0.98, "unpacked_fill": 0.84,
                                   "instances": 16534, "rows": 13227}}})


def _pretrain_id(packing: bool, seed: int) -> str:
    return f"pretrain.packing{packing}.seed{seed}"


@pytest.fixture
def finished(tmp_path):
    """Every pretrain stage done with its held-out log; the evaluate stages done."""
    root = str(tmp_path / "quickstart_packing")
    plan, by_id = _compile(root)
    _data_stages(by_id)
    scores = {}
    for packing in (False, True):
        for seed in SEEDS:
            stage = by_id[_pretrain_id(packing, seed)]
            _eval_log(stage.output_dir, packing, seed)
            _finish(stage, {"step": STEPS})
            ev = by_id[f"evaluate.packing{packing}.seed{seed}"]
            scores[ev.id] = {"mlm_accuracy": 0.14 + ACC_NOISE[seed] + ACC_SHIFT[packing],
                             "mlm_loss": 5.9 + LOSS_NOISE[seed] + LOSS_SHIFT[packing],
                             "nsp_accuracy": 0.56, "majority_token_accuracy": 0.045,
                             "examples": 256, "step": STEPS}
            _finish(ev, scores[ev.id])
    return root, by_id, scores


def _cells(html_text: str, label: str) -> list[str]:
    """The cells of the first table row whose first cell is ``label``."""
    import re

    row = html_text.split(f"<tr><td>{label}</td>", 1)[1].split("</tr>", 1)[0]
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]


def _spread(values: list, percent: bool) -> str:
    m, s = statistics.mean(values), statistics.stdev(values)
    return (f"{m:.2%} ± {s * 100:.2f} (n={len(values)})" if percent
            else f"{m:.4f} ± {s:.4f} (n={len(values)})")


def _diff(first: list, other: list, percent: bool) -> tuple[str, str]:
    diff = statistics.mean(other) - statistics.mean(first)
    pooled = math.sqrt((statistics.variance(first) * (len(first) - 1)
                        + statistics.variance(other) * (len(other) - 1))
                       / (len(first) + len(other) - 2))
    word = "within seed noise" if abs(diff) <= 2 * pooled else "differs"
    if percent:
        return f"{diff * 100:+.2f} points (limit ±{2 * pooled * 100:.2f} points)", word
    return f"{diff:+.4f} (limit ±{2 * pooled:.4f})", word


def _png_size(data: bytes) -> tuple[int, int]:
    import struct

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _pixels_of(data: bytes, color: str) -> int:
    import numpy as np
    from matplotlib import colors, image

    pixels = image.imread(io.BytesIO(data), format="png")[..., :3]
    return int((np.abs(pixels - np.array(colors.to_rgb(color))).max(axis=-1) < 0.08).sum())


def test_groups_compared_at_the_last_common_evaluation(finished):
    root, by_id, _ = finished
    r = report.collect(root, draw=False)
    html_text = ablations.section_ablation(r)

    last = {(p, s): _read_evals(by_id[_pretrain_id(p, s)].output_dir)[-1]
            for p in (False, True) for s in SEEDS}
    assert {rec["step"] for rec in last.values()} == {STEPS}
    for key, percent, first_cell in (("mlm_accuracy", True, 2), ("mlm_loss", False, 5)):
        unpacked = [last[False, s][key] for s in SEEDS]
        packed = [last[True, s][key] for s in SEEDS]
        row0 = _cells(html_text, "packing=False (3 seeds)")
        row1 = _cells(html_text, "packing=True (3 seeds)")
        assert row0[0] == "seed 1, seed 2, seed 3"
        assert row0[first_cell - 1] == _spread(unpacked, percent)
        assert row0[first_cell] == "reference"
        assert row1[first_cell - 1] == _spread(packed, percent)
        diff, word = _diff(unpacked, packed, percent)
        assert row1[first_cell] == diff
        assert row1[first_cell + 1] == word
    # The data were made so: the accuracy equal within the noise, the loss 0.2 higher.
    assert _cells(html_text, "packing=True (3 seeds)")[3] == "within seed noise"
    assert _cells(html_text, "packing=True (3 seeds)")[6] == "differs"
    assert f"{STEPS * BATCH:,} instances seen (step {STEPS})" in html_text
    assert "2 × their pooled sample standard deviation" in html_text
    assert ("Instances a step: packing=False: 32 (batch_size); packing=True: 32 (batch_size; "
            "packed rows") in html_text
    assert "Not drawn" not in html_text and "Not finished" not in html_text

    # The figure: each group's mean line at step x 32 instances, the mean of its seeds.
    (c,) = ablations.comparisons(r, draw=False)
    fig = ablation_figure.figure("t", c.groups, c.at)
    acc_ax, loss_ax = fig.axes
    assert acc_ax.runexp_key == "mlm_accuracy" and loss_ax.runexp_key == "mlm_loss"
    assert acc_ax.get_xlabel() == "instances seen (step × 32 instances a step)"
    for ax in (acc_ax, loss_ax):
        lines = {line.get_label(): line for line in ax.get_lines()}
        for packing in (False, True):
            mean = lines[f"packing={packing} (3 seeds)"]
            logs = [_read_evals(by_id[_pretrain_id(packing, s)].output_dir) for s in SEEDS]
            steps = [rec["step"] for rec in logs[0]]
            assert list(mean.get_xdata()) == [s * BATCH for s in steps]
            assert list(mean.get_ydata()) == pytest.approx(
                [statistics.mean(log[i][ax.runexp_key] for log in logs)
                 for i in range(len(steps))])
            for s in SEEDS:  # a thin line per seed
                assert f"_{_pretrain_id(packing, s)}" in lines
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()][:2] == [
        "packing=False (3 seeds)", "packing=True (3 seeds)"]

    # The PNG, embedded, and the one ablation_figures gives: both groups' colours in it.
    ((name, png),) = ablations.ablation_figures(r)
    assert name == "ablation.png"
    width, height = _png_size(png)
    assert width >= 1200 and height >= 500
    assert _pixels_of(png, "#1f77b4") > 500 and _pixels_of(png, "#d62728") > 500
    assert html_text.count("data:image/png;base64,") == 1


def test_evaluate_stages_compared_as_a_second_table(finished):
    root, by_id, scores = finished
    html_text = ablations.section_ablation(report.collect(root, draw=False))
    table = html_text.split("evaluate: the final checkpoints scored")[1]
    ids = {p: [f"evaluate.packing{p}.seed{s}" for s in SEEDS] for p in (False, True)}
    for key, percent, at in (("mlm_accuracy", True, 0), ("mlm_loss", False, 3)):
        first = [scores[i][key] for i in ids[False]]
        other = [scores[i][key] for i in ids[True]]
        assert _cells(table, "packing=False (3 seeds)")[at] == _spread(first, percent)
        row = _cells(table, "packing=True (3 seeds)")
        assert row[at] == _spread(other, percent)
        assert tuple(row[at + 1:at + 3]) == _diff(first, other, percent)
    assert "6 of 6 evaluate stages done" in table


def test_rows_batches_count_instances_by_the_measured_factor(tmp_path):
    """train.batch_counts = 'rows': a packed step is 32 rows x the factor the preprocess
    stage measured (1.25: 40 instances), so the packed runs are compared, read between two
    evaluations, at the unpacked runs' last instances seen."""
    root = str(tmp_path / "rows")
    _, by_id = _compile(root, "train.batch_counts='rows'")
    _data_stages(by_id, factor=1.25)
    for packing in (False, True):
        for seed in SEEDS:
            stage = by_id[_pretrain_id(packing, seed)]
            _eval_log(stage.output_dir, packing, seed)
            _finish(stage, {"step": STEPS})
    r = report.collect(root, draw=False)
    html_text = ablations.section_ablation(r)
    (c,) = ablations.comparisons(r, draw=False)
    assert c.at == STEPS * BATCH  # the unpacked runs end first: 19,200 instances
    packed_at = []
    for seed in SEEDS:
        recs = _read_evals(by_id[_pretrain_id(True, seed)].output_dir)
        xs = [rec["step"] * BATCH * 1.25 for rec in recs]  # 8,000, 16,000, 24,000
        ys = [rec["mlm_accuracy"] for rec in recs]
        t = (c.at - xs[1]) / (xs[2] - xs[1])
        packed_at.append(ys[1] + t * (ys[2] - ys[1]))
    unpacked = [_read_evals(by_id[_pretrain_id(False, s)].output_dir)[-1]["mlm_accuracy"]
                for s in SEEDS]
    row = _cells(html_text, "packing=True (3 seeds)")
    assert row[1] == _spread(packed_at, True)
    assert (row[2], row[3]) == _diff(unpacked, packed_at, True)
    assert ("packing=True: 32 rows x 1.25 instances a row (measured by "
            "preprocess.pretrain.packingTrue)") in html_text
    assert ("read between the two evaluations around it for pretrain.packingTrue.seed1, "
            "pretrain.packingTrue.seed2, pretrain.packingTrue.seed3") in html_text
    fig = ablation_figure.figure("t", c.groups, c.at)
    line = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}["packing=True (3 seeds)"]
    assert list(line.get_xdata()) == pytest.approx([8000.0, 16000.0, 24000.0])
    assert fig.axes[0].get_xlabel() == "instances seen (step × the stage's instances a step)"

    # Without the measured factor (the preprocess stage not done) the axis says rows.
    os.remove(os.path.join(by_id["preprocess.pretrain.packingTrue"].output_dir, "COMPLETED"))
    r = report.collect(root, draw=False)
    html_text = ablations.section_ablation(r)
    assert "the packing factor is not known" in html_text
    (c,) = ablations.comparisons(r, draw=False)
    assert "rows seen" in ablation_figure.figure("t", c.groups, c.at).axes[0].get_xlabel()


def test_unfinished_stages_are_noted_and_nothing_fails(tmp_path):
    root = str(tmp_path / "partial")
    _, by_id = _compile(root, "evaluate.enabled=False")
    _data_stages(by_id)
    r = report.collect(root, draw=False)
    html_text = ablations.section_ablation(r)  # no pretrain stage has begun
    assert "No held-out evaluation of any pretrain stage yet" in html_text
    assert "pretrain.packingTrue.seed3 (not started)" in html_text
    assert "<img" not in html_text

    _eval_log(by_id[_pretrain_id(False, 1)].output_dir, False, 1)
    _finish(by_id[_pretrain_id(False, 1)], {"step": STEPS})
    _eval_log(by_id[_pretrain_id(False, 2)].output_dir, False, 2, last_step=400)  # running
    _eval_log(by_id[_pretrain_id(True, 1)].output_dir, True, 1, last_step=200)
    _write(os.path.join(by_id[_pretrain_id(True, 2)].output_dir, "STARTED.json"), "{}")
    r = report.collect(root, draw=False)
    html_text = ablations.section_ablation(r)
    assert "packing=False (2 of 3 seeds)" in html_text
    assert "packing=True (1 of 3 seeds)" in html_text
    assert f"{200 * BATCH:,} instances seen (step 200)" in html_text  # the slowest one's last
    assert ("Not finished, compared so far: pretrain.packingFalse.seed2, "
            "pretrain.packingTrue.seed1.") in html_text
    assert "pretrain.packingTrue.seed2 (no held-out evaluation logged yet)" in html_text
    assert "seed 1, seed 2 (not finished)" in html_text
    assert "one seed each: no noise estimate" not in html_text  # 2 and 1 seeds: n - 1 = 1
    assert html_text.count("data:image/png;base64,") == 1


def test_no_ablation_no_section_and_one_seed_each(tmp_path):
    from runexp.compiler.planner import compile_experiment

    root = str(tmp_path / "plain")
    plan = compile_experiment(["quickstart.gin"], [f"OUTPUT_ROOT='{root}'"]).plan
    _write(os.path.join(root, "plan.json"), plan.to_json())
    assert ablations.section_ablation(report.collect(root, draw=False)) == ""

    # Seeds only: one group of every point; a key without seeds: one seed a group.
    root = str(tmp_path / "seeds")
    _, by_id = _compile(root, "experiment.ablation = {'train.seed': [1, 2]}",
                        "evaluate.enabled=False")
    for seed in (1, 2):
        _eval_log(by_id[f"pretrain.seed{seed}"].output_dir, False, seed)
    html_text = ablations.section_ablation(report.collect(root, draw=False))
    assert "every point (2 seeds)" in html_text

    root = str(tmp_path / "packing")
    _, by_id = _compile(root, "experiment.ablation = "
                              "{'bert_pretraining_task.packing': [False, True]}",
                        "evaluate.enabled=False")
    for packing in (False, True):
        _eval_log(by_id[f"pretrain.packing{packing}"].output_dir, packing, 1)
    html_text = ablations.section_ablation(report.collect(root, draw=False))
    assert "packing=True (1 seed)" in html_text
    assert "one seed each: no noise estimate" in html_text


def test_stage_points_come_from_the_plan(tmp_path):
    plan, _ = _compile(str(tmp_path / "p"))
    points = ablations.stage_points(plan)
    assert points["pretrain.packingTrue.seed2"] == (
        "pretrain", {"bert_pretraining_task.packing": True, "train.seed": 2})
    assert points["preprocess.pretrain.packingFalse"] == (
        "preprocess.pretrain", {"bert_pretraining_task.packing": False})
    assert "vocab" not in points and "corpus" not in points
    assert ablations.is_seed("train.seed") and ablations.is_seed("RANDOM_SEED")
    assert not ablations.is_seed("bert_pretraining_task.packing")
