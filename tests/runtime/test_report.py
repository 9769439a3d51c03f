"""Training curves (runtime/report/curves.py) and `runexp report` (runtime/report/).

The curves of a real pretrain stage come from the session's ``pretrained`` fixture (its
handler drew ``curves.png``); the report's structure is checked on an experiment compiled
from the quickstart whose stage outputs are written here (no training), and on gs:// through
the storage emulator. The report of a real finished quickstart is checked in
tests/test_pipeline_e2e.py, which has that run.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import struct
import subprocess
import sys

import pytest

from runexp.runtime.report import curves, report
from tests.support.cli import run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails unless ``data`` is a PNG."""
    assert data[:8] == PNG_SIGNATURE, data[:16]
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def curve_pixels(data: bytes) -> int:
    """Pixels in the colour of the training curves: 0 for axes with nothing drawn."""
    import numpy as np
    from matplotlib import colors, image

    pixels = image.imread(io.BytesIO(data), format="png")[..., :3]
    train = np.array(colors.to_rgb(curves._TRAIN_COLOR))
    return int((np.abs(pixels - train).max(axis=-1) < 0.08).sum())


def check_png(data: bytes, min_width=1000, min_height=600) -> None:
    width, height = png_size(data)
    assert width >= min_width and height >= min_height, (width, height)
    assert curve_pixels(data) > 1000  # curves in the panels, not empty axes


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


# --- a real pretrain stage (the pretrained fixture trains 120 steps, evaluates at 60, 120) ---

def test_pretrain_stage_draws_its_curves_from_its_logs(pretrained):
    from runexp.runtime import log_reader

    work_dir, summary = pretrained

    with open(os.path.join(work_dir, curves.CURVES_FILE), "rb") as f:
        check_png(f.read(), min_width=1400, min_height=800)

    train = [r for r in log_reader.forward(log_reader.source(
        os.path.join(work_dir, "train_log.jsonl"))) if "event" not in r]
    evals = list(log_reader.forward(log_reader.source(os.path.join(work_dir, "eval_log.jsonl"))))
    assert [r["step"] for r in train] == [30, 60, 90, 120]
    assert [r["step"] for r in evals] == [60, 120]
    logs = curves.read_logs(work_dir)
    fig = curves.curves_figure("pretrain", logs, total_steps=120)
    panels = {ax.runexp_key: ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == {"loss", "mlm_accuracy", "nsp_accuracy", "learning_rate",
                           "examples_per_second", "grad_norm"}
    for key, ax in panels.items():
        line = lines_by_label(ax)[{"learning_rate": "schedule",
                                   "examples_per_second": "per log window"}.get(key, "train")]
        assert list(line.get_xdata()) == [r["step"] for r in train], key
        assert list(line.get_ydata()) == pytest.approx([r[key] for r in train]), key
        assert ax.get_xlim()[1] >= 120 and ax.get_title() and ax.get_ylabel()
    for key in ("loss", "mlm_accuracy", "nsp_accuracy"):
        held = lines_by_label(panels[key])["held-out"]
        assert list(held.get_xdata()) == [60, 120]
        assert list(held.get_ydata()) == pytest.approx([r[key] for r in evals])
    # The bottom row names the shared step axis.
    assert [ax.get_xlabel() for ax in fig.axes[3:]] == ["step"] * 3


# --- an experiment compiled from the quickstart, its outputs written here ---------------------

TRAIN_STEPS = 200


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _finish(stage, seconds: float, summary: dict) -> None:
    _write(os.path.join(stage.output_dir, "STARTED.json"), "{}")
    _write(os.path.join(stage.output_dir, "MANIFEST.json"), json.dumps(
        {"stage": stage.id, "kind": stage.kind, "fingerprint": stage.fingerprint,
         "seconds": seconds, "summary": summary}))
    _write(os.path.join(stage.output_dir, "COMPLETED"), stage.fingerprint + "\n")


def _pretrain_logs(directory: str) -> None:
    train, evals = [], []
    for step in range(10, TRAIN_STEPS + 1, 10):
        train.append({"step": step, "loss": 8.0 - step / 100, "mlm_loss": 7.3 - step / 100,
                      "mlm_accuracy": 0.02 + step / 2000, "nsp_loss": 0.69,
                      "nsp_accuracy": 0.5 + step / 4000, "learning_rate": 1e-3 * step / 200,
                      "examples_per_second": 400.0, "grad_norm": 1.5 - step / 400,
                      "step_time": 0.08, "batches_consumed": step, "time": 1e9 + step})
        if step % 50 == 0:
            evals.append({"step": step, "loss": 7.9 - step / 100, "mlm_loss": 7.2,
                          "mlm_accuracy": 0.03 + step / 2500, "nsp_loss": 0.69,
                          "nsp_accuracy": 0.55, "time": 1e9 + step})
    # A cut line (a kill mid-write) and an event: neither is a metrics record.
    lines = [json.dumps(r) for r in train] + [json.dumps(
        {"step": 100, "event": "deadline_stop", "deadline_seconds_left": 3.0})] + ['{"step": 2']
    _write(os.path.join(directory, "train_log.jsonl"), "\n".join(lines))
    _write(os.path.join(directory, "eval_log.jsonl"),
           "".join(json.dumps(r) + "\n" for r in evals))


@pytest.fixture
def experiment(tmp_path):
    """A quickstart experiment with corpus..evaluate done (outputs written as the stages
    write them), finetune started and export not started: (root, plan)."""
    from runexp.compiler.planner import compile_experiment

    root = str(tmp_path / "quickstart")
    plan = compile_experiment(["quickstart.gin"], [
        f"OUTPUT_ROOT='{root}'", f"TRAIN_STEPS={TRAIN_STEPS}", "train.eval_every=50"]).plan
    _write(os.path.join(root, "plan.json"), plan.to_json())
    by_id = {s.id: s for s in plan.stages}
    _finish(by_id["corpus"], 3.1, {"train": {"bytes": 2129602, "documents": 618,
                                             "sentences": 25548}})
    _finish(by_id["vocab"], 1.4, {"type": "sentencepiece", "vocab_size": 8000,
                                  "unk_rate": 0.001, "pieces_per_word": 1.66})
    issues = {"non_utf8_lines": {"count": 2, "samples": ["/data/a.txt:7", "/data/a.txt:9"]},
              "giant_lines": {"count": 0, "samples": []},
              "empty_files": {"count": 1, "samples": ["/data/empty.txt:0"]},
              "empty_documents": {"count": 0, "samples": []}}
    _finish(by_id["preprocess.pretrain"], 0.4, {
        "train": {"documents": 618, "instances": 11014, "masked": 102303, "tokens": 659087},
        "unk_rate": 0.0017, "bad_input": issues})
    _pretrain_logs(by_id["pretrain"].output_dir)
    _finish(by_id["pretrain"], 91.5, {"step": TRAIN_STEPS, "loss": 6.0, "mlm_accuracy": 0.12,
                                      "nsp_accuracy": 0.55, "resumed_from": None,
                                      "eval": {"mlm_accuracy": 0.11, "loss": 5.9,
                                               "nsp_accuracy": 0.55}})
    _finish(by_id["evaluate"], 2.5, {"examples": 256, "majority_token_accuracy": 0.0449,
                                     "mlm_accuracy": 0.1311, "mlm_loss": 5.83,
                                     "nsp_accuracy": 0.5703, "step": TRAIN_STEPS})
    _write(os.path.join(by_id["finetune.stdlib_package"].output_dir, "STARTED.json"), "{}")
    return root, plan


def _images(html_text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in
            re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html_text)]


def test_report_of_an_unfinished_experiment(experiment):
    root, plan = experiment
    r = report.collect(root)
    assert [s.status for s in r.stages] == ["done"] * 5 + ["started", "not started"]
    html_text = report.render(r)
    for stage in plan.stages:
        assert f"<b>{stage.id}</b>" in html_text
    assert html_text.count('class="badge ok">done<') >= 5
    assert "5 of 7 done" in html_text
    # Estimated against actual: the pretrain estimate beside the MANIFEST's 91.5 s.
    est = r.estimates["pretrain"].hours * 3600
    time_section = html_text.split("id='time'")[1].split("<h2")[0]
    row = re.search(r"<tr><td>pretrain</td>(.*?)</tr>", time_section).group(1)
    assert report.duration(est) in row and "1 min 31 s" in row
    assert f"{91.5 / est:.2g}×" in row
    # Metrics against their baselines.
    assert "held-out MLM accuracy" in html_text and "13.1%" in html_text
    assert "most frequent token: 4.5%" in html_text and "+8.6 points (2.9×)" in html_text
    assert "chance: 50.0%" in html_text
    # Bad input counted by the preprocess stage, with its samples.
    assert "3 skipped or repaired" in html_text and "/data/a.txt:7" in html_text
    # The curves: one figure, for the one training stage with logs.
    (png,) = _images(html_text)
    check_png(png, min_width=1400)
    assert "No curves: no training log yet" in html_text  # finetune: started, no log yet
    artifacts = html_text.split("id='artifacts'")[1].split("<h2")[0]
    assert "<b>export</b>" in artifacts and "not done" in artifacts
    assert "tensorboard --logdir " + root in html_text
    assert "pip install &#x27;runexp[tensorboard]&#x27;" in html_text \
        or "pip install 'runexp[tensorboard]'" in html_text


def test_the_stage_table_shows_the_params_each_kind_declares(experiment):
    """Key params are declared where the settings are (`setting(..., shown=True)`): the
    table shows those set, in declaration order, the model first for training stages."""
    from runexp.compiler.kinds import KINDS

    root, plan = experiment
    html_text = report.render(report.collect(root))
    for stage in plan.stages:
        row = re.search(rf"<tr id='stage-{re.escape(stage.id)}'>(.*?)</tr>", html_text).group(1)
        shown = re.findall(r"<span class='k'>([^<]+)</span>", row)
        declared = [n for n in KINDS[stage.kind].spec.shown_params()
                    if stage.params.get(n) is not None]
        expected = (["model"] if KINDS[stage.kind].trains else []) + declared
        assert shown == expected, stage.id
    assert [k for k, kind in KINDS.items() if not kind.spec.shown_params()] == ["export"]
    pretrain = re.search(r"<tr id='stage-pretrain'>(.*?)</tr>", html_text).group(1)
    assert f"<span class='k'>train_steps</span> {TRAIN_STEPS}<" in pretrain


def test_report_curves_carry_the_baselines_and_the_stop(experiment):
    root, plan = experiment
    r = report.collect(root, draw=False)
    pre = r.get("pretrain")
    assert len(pre.logs.train) == TRAIN_STEPS // 10 and len(pre.logs.evals) == 4
    assert [e["event"] for e in pre.logs.events] == ["deadline_stop"]
    refs = curves.references(plan, pre.stage, {s.stage.id: s.summary for s in r.stages})
    fig = curves.curves_figure("pretrain", pre.logs, refs, total_steps=TRAIN_STEPS)
    mlm = next(ax for ax in fig.axes if ax.runexp_key == "mlm_accuracy")
    labels = [t.get_text() for t in mlm.get_legend().get_texts()]
    assert "most frequent token (baseline): 4.5%" in labels
    assert "evaluate stage: 13.1%" in labels
    baseline = lines_by_label(mlm)["most frequent token (baseline): 4.5%"]
    assert list(baseline.get_ydata()) == [0.0449, 0.0449]
    nsp = next(ax for ax in fig.axes if ax.runexp_key == "nsp_accuracy")
    assert any(t.get_text().startswith("chance") for t in nsp.get_legend().get_texts())
    # The wall-time stop: a vertical line at step 100 in every panel, named once.
    for ax in fig.axes:
        stops = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [100, 100]]
        assert len(stops) == 1
    first = fig.axes[0].get_legend().get_texts()
    assert "stopped at the wall-time budget" in [t.get_text() for t in first]


def test_finetune_curves_mark_the_dev_score_and_the_majority_class():
    from runexp.compiler.plan import Stage

    logs = curves.parse_logs("".join(json.dumps(
        {"step": s, "loss": 1.8 - s / 100, "accuracy": 0.2 + s / 200,
         "learning_rate": 1e-4, "examples_per_second": 500.0, "grad_norm": 1.0}) + "\n"
        for s in (4, 8, 12, 16, 20)), None)

    stage = Stage(id="finetune.x", kind="finetune", params={"model": {}}, inputs={},
                  output_dir="/nowhere")
    summary = {"accuracy": 0.4, "majority_baseline": 0.23, "num_labels": 6, "step": 20,
               "dev_sets": {"dev": {"accuracy": 0.4, "majority_baseline": 0.23}}}
    refs = curves.references(None, stage, {"finetune.x": summary})
    fig = curves.curves_figure("finetune", logs, refs, total_steps=20)
    assert [ax.runexp_key for ax in fig.axes] == ["loss", "accuracy", "learning_rate",
                                                  "examples_per_second"]
    acc = lines_by_label(fig.axes[1])
    assert list(acc["train"].get_xdata()) == [4, 8, 12, 16, 20]
    assert list(acc["dev accuracy: 40.0%"].get_xdata()) == [20]
    assert list(acc["majority class: 23.0%"].get_ydata()) == [0.23, 0.23]
    check_png(curves.figure_png(fig), min_width=1100, min_height=700)


def test_drawing_never_fails_a_stage(tmp_path, monkeypatch):
    from runexp.compiler.plan import Plan, Stage
    from runexp.runtime.context import StageContext

    work = str(tmp_path / "pretrain")
    _pretrain_logs(work)
    stage = Stage(id="pretrain", kind="pretrain", params={"train_steps": TRAIN_STEPS},
                  inputs={}, output_dir=work)
    messages = []
    ctx = StageContext(stage=stage, plan=Plan("x", str(tmp_path), (stage,)), work_dir=work,
                       progress=messages.append)
    assert curves.draw_stage_curves(ctx) == os.path.join(work, "curves.png")
    assert messages == ["training curves: curves.png"]

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts today")
    monkeypatch.setattr(curves, "curves_figure", broken)
    messages.clear()
    assert curves.draw_stage_curves(ctx) is None
    assert len(messages) == 1 and messages[0].startswith("warning: the training curves")
    assert "no fonts today" in messages[0]
    assert not os.path.exists(os.path.join(work, "curves.png.tmp"))
    # No logs (a stage stopped before its first log line): nothing drawn, nothing said.
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    messages.clear()
    assert curves.draw_stage_curves(StageContext(stage, ctx.plan, empty,
                                                 progress=messages.append)) is None
    assert messages == []


def test_report_command_writes_html_without_tensorflow(experiment, tmp_path):
    root, _ = experiment
    out = str(tmp_path / "elsewhere" / "r.html")
    code = ("import sys\nfrom runexp.compiler.cli import main\n"
            f"rc = main(['report', {root!r}, '--out', {out!r}])\n"
            "heavy = [m for m in ('tensorflow', 'seqio') if m in sys.modules]\n"
            "assert not heavy, heavy\nsys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"report written: {out}" in proc.stdout
    with open(out) as f:
        assert "runexp report: quickstart" in f.read()
    proc = run_cli("report", root)  # the default place
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(os.path.join(root, "report.html"))


def test_report_of_a_root_without_a_plan_is_a_user_error(tmp_path):
    proc = run_cli("report", str(tmp_path))
    assert proc.returncode == 1
    assert f"error: {tmp_path} holds no runexp experiment (no plan.json)" in proc.stderr
    assert "hint: " in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("report")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert not os.path.exists(os.path.join(tmp_path, "report.html"))


def test_report_of_a_moved_experiment_reads_it_where_it_is(experiment, tmp_path):
    import shutil

    root, _ = experiment
    moved = str(tmp_path / "moved")
    shutil.copytree(root, moved)
    shutil.rmtree(root)
    r = report.collect(moved, draw=False)
    assert [s.status for s in r.stages][:5] == ["done"] * 5
    assert r.get("pretrain").dir == os.path.join(moved, "pretrain")


def test_report_of_a_gcs_root(experiment, gcs_prefix):
    from runexp.runtime import storage

    root, plan = experiment
    export = plan.stage("export")
    for name, size in (("encoder/saved_model.pb", 3000), ("encoder/variables/v", 7000),
                       ("bert_model.ckpt.index", 100), ("vocab.txt", 50)):
        _write(os.path.join(export.output_dir, name), "x" * size)
    _finish(export, 0.5, {"step": TRAIN_STEPS})
    storage.upload_dir(root, gcs_prefix)
    proc = run_cli("report", gcs_prefix, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert f"report written: {gcs_prefix}/report.html" in proc.stdout
    html_text = storage.read_text(f"{gcs_prefix}/report.html")
    assert "6 of 7 done" in html_text and len(_images(html_text)) == 1
    assert f"tensorboard --logdir {gcs_prefix}" in html_text
    # The export stage's objects, listed from the bucket, a directory as one row.
    assert re.search(r"<code>encoder/</code></td><td class='num'>9\.8 KB</td>", html_text)
    assert f'tf.saved_model.load(&quot;{gcs_prefix}/export/encoder&quot;)' in html_text


def test_a_stopped_pretrain_stage_draws_its_curves_and_syncs_them(pretrain_data, tmp_path,
                                                                  monkeypatch):
    """At a preemption or the wall-time stop the curves so far are drawn and made durable
    (ctx.sync: the executor syncs only stages that finish), then the stop goes on."""
    from tests.support.runtime import make_ctx, pretrain_params

    from runexp.runtime.preemption import DeadlineReached
    from runexp.runtime.stages import pretrain

    def stopped_training(trainer, make_dataset):
        _pretrain_logs(trainer.work_dir)
        raise DeadlineReached(100, "ckpt-100", seconds_left=3.0)
    monkeypatch.setattr(pretrain.Trainer, "train", stopped_training)
    data_dir, vocab_dir = pretrain_data
    work_dir, synced, messages = str(tmp_path / "pretrain"), [], []
    ctx = make_ctx("pretrain", pretrain_params(train_steps=TRAIN_STEPS),
                   {"data_dir": data_dir, "vocab_dir": vocab_dir}, work_dir, messages)
    ctx.sync = lambda: synced.append(os.path.exists(os.path.join(work_dir, "curves.png")))
    with pytest.raises(DeadlineReached):
        pretrain.run(ctx).to_dict()
    with open(os.path.join(work_dir, "curves.png"), "rb") as f:
        check_png(f.read(), min_width=1400)
    assert synced == [True] and "training curves: curves.png" in messages
