"""The whole pipeline through the `runexp` command, on the quickstart at a small scale.

These train real models for a minute or two: the slowest tests of the suite.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import QUICKSTART_SMALL as SMALL
from tests.support.cli import QUICKSTART_STAGES as STAGES
from tests.support.cli import cli_args, run_cli

pytestmark = pytest.mark.e2e


def _stage_seconds(root, stage=None) -> float:
    """What building the stages (or one) took in the first run, from their manifests: the
    yardstick for durations on this machine, as busy as it is now."""
    return sum(json.load(open(os.path.join(root, s, "MANIFEST.json")))["seconds"]
               for s in ([stage] if stage else STAGES))


def _files(root) -> dict:
    """{path: (size, mtime_ns)} of every file in the stage directories."""
    return {path: (os.stat(path).st_size, os.stat(path).st_mtime_ns)
            for stage in STAGES
            for path in glob.glob(os.path.join(root, stage, "**"), recursive=True)
            if os.path.isfile(path)}


def runexp(root, *args, params=(), timeout=900):
    """The scaled-down quickstart at ``root``: command-line ``args``, gin ``params`` after
    SMALL's (so they win)."""
    return run_cli(*args, gin_file="quickstart.gin", root=root, params=[*SMALL, *params],
                   timeout=timeout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("quickstart"))
    proc = runexp(root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return root, proc


@pytest.mark.slow
def test_every_stage_completes_and_reports_metrics(finished):
    root, proc = finished
    for stage in STAGES:
        assert os.path.isfile(os.path.join(root, stage, "COMPLETED")), stage
        manifest = json.load(open(os.path.join(root, stage, "MANIFEST.json")))
        assert manifest["stage"] == stage and len(manifest["fingerprint"]) == 64
    metrics = json.load(open(os.path.join(root, "evaluate", "metrics.json")))
    assert 0.0 <= metrics["majority_token_accuracy"] < 1.0
    assert 0.0 <= metrics["mlm_accuracy"] <= 1.0
    ft = json.load(open(os.path.join(root, "finetune.stdlib_package", "metrics.json")))
    assert ft["num_labels"] >= 2
    for name in ("encoder", "preprocessing", "classifier"):
        assert os.path.isdir(os.path.join(root, "export", name)), name
    assert os.path.isfile(os.path.join(root, "plan.json"))
    assert "held-out MLM accuracy" in proc.stdout
    assert "dev accuracy" in proc.stdout


@pytest.mark.slow
def test_second_run_reuses_every_stage(finished):
    root, _ = finished
    before = _files(root)
    proc = runexp(root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(": reused (") == len(STAGES)
    # Reused means untouched: no stage's file is written again, none added, none removed
    # (asserted on the files, not on how long the run took).
    assert _files(root) == before
    dry = runexp(root, "--dry_run")
    assert dry.returncode == 0, dry.stdout[-2000:]
    assert f"Plan: {len(STAGES)} to reuse." in dry.stdout


@pytest.mark.slow
def test_status_reports_every_stage_done(finished):
    root, _ = finished
    proc = run_cli("status", root)
    assert proc.returncode == 0, proc.stderr
    assert f"{len(STAGES)} of {len(STAGES)} stages done." in proc.stdout
    assert "= pretrain " in proc.stdout


@pytest.mark.slow
def test_curves_and_report_of_the_finished_run(finished):
    import base64
    import re

    from runexp.compiler.estimates import estimates
    from runexp.compiler.plan import Plan
    from runexp.runtime.report import curves, report

    root, _ = finished
    for stage in ("pretrain", "finetune.stdlib_package"):  # drawn by the training stages
        with open(os.path.join(root, stage, "curves.png"), "rb") as f:
            png = f.read()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, stage
        logs = curves.read_logs(os.path.join(root, stage))
        fig = curves.curves_figure(stage.split(".")[0], logs)
        loss = next(line for line in fig.axes[0].get_lines() if line.get_label() == "train")
        assert list(loss.get_xdata()) == [r["step"] for r in logs.train] and len(logs.train) >= 4
        assert list(loss.get_ydata()) == [r["loss"] for r in logs.train]

    proc = run_cli("report", root, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = open(os.path.join(root, "report.html"), encoding="utf-8").read()
    assert f"{len(STAGES)} of {len(STAGES)} done" in html
    manifests = {s: json.load(open(os.path.join(root, s, "MANIFEST.json"))) for s in STAGES}
    time_section = html.split("id='time'")[1].split("<h2")[0]
    for stage in STAGES:
        assert f"<b>{stage}</b>" in html
        row = re.search(rf"<tr><td>{re.escape(stage)}</td>(.*?)</tr>", time_section).group(1)
        assert report.duration(manifests[stage]["seconds"]) in row, stage
    plan = Plan.from_json(open(os.path.join(root, "plan.json")).read())
    for stage, est in estimates(plan).items():
        assert report.duration(est.hours * 3600) in time_section, stage
    ev = manifests["evaluate"]["summary"]
    ft = manifests["finetune.stdlib_package"]["summary"]
    assert f"<b>{ev['mlm_accuracy']:.1%}</b>" in html
    assert f"most frequent token: {ev['majority_token_accuracy']:.1%}" in html
    assert f"<b>{ft['accuracy']:.1%}</b>" in html
    assert f"majority class: {ft['majority_baseline']:.1%}" in html
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 2
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    for artifact in ("encoder/", "preprocessing/", "classifier/", "bert_model.ckpt.*",
                     "vocab.txt", "bert_config.json", "README.md"):
        assert f"<code>{artifact}</code>" in html
    assert f"tensorboard --logdir {root}" in html


@pytest.mark.slow
def test_inspect_decodes_examples_with_masks_marked(finished):
    root, _ = finished
    proc = run_cli("inspect", "-n", "2", gin_file="quickstart.gin", root=root, params=SMALL)
    assert proc.returncode == 0, proc.stderr
    assert "example 2: " in proc.stdout and "[MASK→" in proc.stdout
    assert "  A: [CLS] " in proc.stdout
    assert "statistics over all" in proc.stdout


@pytest.mark.slow
def test_a_seqio_user_reads_the_cached_examples_after_register(finished):
    """In a fresh process: ``runexp.tasks.register(root)`` then plain seqio."""
    root, _ = finished
    code = (
        "import json, sys\n"
        "from runexp.tasks import register\n"
        "names = register(sys.argv[1])\n"
        "import seqio\n"
        "out = {'names': names}\n"
        "for name in names:\n"
        "    task = seqio.get_mixture_or_task(name)\n"
        "    cached = task.supports_caching\n"
        "    for split in task.splits:\n"
        "        ds = task.get_dataset(split=split, sequence_length=None, use_cached=cached,\n"
        "                              shuffle=False)\n"
        "        examples = list(ds.as_numpy_iterator())\n"
        "        r = out[f'{name}/{split}'] = {\n"
        "            'n': len(examples), 'first': examples[0]['input_ids'][:3].tolist()}\n"
        "        if cached:\n"
        "            r.update(cache_dir=task.cache_dir,\n"
        "                     stats=task.get_cached_stats(split)['examples'],\n"
        "                     masked=int(sum(e['masked_lm_weights'].sum() > 0\n"
        "                                    for e in examples)))\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["names"] == ["pretrain", "stdlib_package"]
    for split in ("train", "validation"):
        r = got[f"pretrain/{split}"]
        assert r["n"] == r["stats"] == r["masked"] > 100, (split, r)
        assert r["cache_dir"] == os.path.join(root, "preprocess.pretrain", "pretrain")
        assert r["first"][0] == 2  # [CLS]
    # The fine-tune task too, read from its files as the finetune stage reads them.
    ft = json.load(open(os.path.join(root, "finetune.stdlib_package", "metrics.json")))
    assert got["stdlib_package/dev"]["n"] == ft["dev_examples"]
    assert got["stdlib_package/train"]["n"] == ft["train_examples"]


@pytest.mark.slow
def test_changing_finetune_steps_rebuilds_only_finetune_and_export(finished):
    root, _ = finished
    proc = runexp(root, "--dry_run", params=["FINETUNE_STEPS=25"])
    assert proc.returncode == 2
    assert "~ finetune.stdlib_package  (finetune)  will be rebuilt" in proc.stdout
    assert "~ train_steps: 20 -> 25" in proc.stdout
    assert "~ export  (export)  will be rebuilt" in proc.stdout
    assert "Plan: 2 to rebuild, 5 to reuse." in proc.stdout


def _latest_step(root):
    steps = [int(p.rsplit("-", 1)[1].split(".")[0])
             for p in glob.glob(os.path.join(root, "pretrain", "checkpoints", "ckpt-*.index"))]
    return max(steps) if steps else 0


@pytest.mark.slow
def test_kill_during_pretraining_then_rerun_resumes(finished):
    root, _ = finished
    # More steps than before: the finished pretrain stage is continued, then killed.
    long_run = subprocess.Popen(
        cli_args(gin_file="quickstart.gin", root=root,
                 params=[*SMALL, "TRAIN_STEPS=100000", "CHECKPOINT_EVERY=10"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Only ends a hang: many times what the first run's 40 steps took.
    give_up = time.monotonic() + max(300.0, 20 * _stage_seconds(root, "pretrain"))
    while _latest_step(root) < 60 and time.monotonic() < give_up and long_run.poll() is None:
        time.sleep(0.5)
    long_run.send_signal(signal.SIGKILL)
    long_run.wait()
    killed_at = _latest_step(root)
    assert killed_at >= 60, "no checkpoint written after the first run's 40 steps"
    assert not os.path.exists(os.path.join(root, "pretrain", "COMPLETED"))

    target = killed_at + 10
    # Up to pretrain: what is tested is the resume; the later stages would only be rebuilt
    # as the first run built them (and the export the tests below read stays the first's).
    proc = runexp(root, "--until=pretrain",
                  params=[f"TRAIN_STEPS={target}", "CHECKPOINT_EVERY=10"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "> pretrain: resuming" in proc.stdout
    manifest = json.load(open(os.path.join(root, "pretrain", "MANIFEST.json")))
    assert manifest["summary"]["step"] == target
    assert _latest_step(root) == target

    # Asking for fewer steps than the checkpoints hold cannot continue them: it starts over.
    dry = runexp(root, "--dry_run", params=["TRAIN_STEPS=20"])
    assert "~ pretrain  (pretrain)  will be rebuilt" in dry.stdout
    assert f"train_steps (20) is below the step of the existing checkpoints ({target})" in dry.stdout


@pytest.mark.slow
def test_wall_time_budget_stops_with_a_checkpoint_and_exit_code_124(finished):
    root, _ = finished
    before = _latest_step(root)
    # A budget already spent when training starts: it must stop at once, with a checkpoint.
    proc = runexp(root, params=["TRAIN_STEPS=100000", "experiment.wall_time_hours=0.0001"],
                  timeout=600)
    assert proc.returncode == 124, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "stopped: training stopped by the wall-time budget" in proc.stderr
    assert not os.path.exists(os.path.join(root, "pretrain", "COMPLETED"))
    # The step reached is checkpointed: the message names that checkpoint.
    latest = _latest_step(root)
    assert latest >= before
    assert f"at step {latest}; latest checkpoint: " in proc.stderr
    assert f"ckpt-{latest}" in proc.stderr


@pytest.mark.slow
def test_huggingface_export_reproduces_runexp_on_held_out_text(finished, tmp_path):
    """export/huggingface/ in a process with only transformers and torch: AutoTokenizer's ids
    equal runexp's on every held-out line; the encoder's and the classifier's outputs equal
    the TF SavedModels' within 1e-4 (tests/support/hf.py)."""
    from tests.support.hf import check_export_against_runexp

    root, _ = finished
    with open(os.path.join(root, "corpus", "heldout.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][:300]
    figures = check_export_against_runexp(root, lines, str(tmp_path))
    assert figures["equal_lines"] == len(lines) == 300
    assert "classifier_logits" in figures
