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

# The quickstart, scaled down: same stages, same code paths, fewer steps.
SMALL = [
    "VOCAB_SIZE=2000", "MAX_SEQ_LENGTH=64", "MAX_PREDICTIONS_PER_SEQ=10", "DUPE_FACTOR=1",
    "TRAIN_STEPS=40", "WARMUP_STEPS=4", "CHECKPOINT_EVERY=20", "train.log_every=10",
    "evaluate.max_examples=256", "FINETUNE_STEPS=20", "finetune.warmup_steps=2",
    "vocab.max_sentences=20000",
]
STAGES = ["corpus", "vocab", "preprocess.pretrain", "pretrain", "evaluate",
          "finetune.stdlib_package", "export"]


def _stage_seconds(root, stage=None) -> float:
    """What building the stages (or one) took in the first run, from their manifests: the
    yardstick for durations on this machine, as busy as it is now."""
    return sum(json.load(open(os.path.join(root, s, "MANIFEST.json")))["seconds"]
               for s in ([stage] if stage else STAGES))


def runexp(root, *params, timeout=900):
    args = [sys.executable, "-m", "runexp.compiler.cli", "--gin_file=quickstart.gin",
            f"--gin_param=OUTPUT_ROOT='{root}'"]
    args += [f"--gin_param={p}" for p in list(SMALL) + list(params)]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


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
    start = time.monotonic()
    proc = runexp(root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(": reused (") == len(STAGES)
    # Reusing costs a small part of building, whatever the machine's speed.
    assert time.monotonic() - start < _stage_seconds(root) / 2
    dry = subprocess.run(
        [sys.executable, "-m", "runexp.compiler.cli", "--gin_file=quickstart.gin", "--dry_run",
         f"--gin_param=OUTPUT_ROOT='{root}'"] + [f"--gin_param={p}" for p in SMALL],
        capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout[-2000:]
    assert f"Plan: {len(STAGES)} to reuse." in dry.stdout


@pytest.mark.slow
def test_status_reports_every_stage_done(finished):
    root, _ = finished
    proc = subprocess.run([sys.executable, "-m", "runexp.compiler.cli", "status", root],
                          capture_output=True, text=True)
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

    proc = subprocess.run([sys.executable, "-m", "runexp.compiler.cli", "report", root],
                          capture_output=True, text=True, timeout=300)
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
    proc = subprocess.run(
        [sys.executable, "-m", "runexp.compiler.cli", "inspect", "--gin_file=quickstart.gin",
         "-n", "2", f"--gin_param=OUTPUT_ROOT='{root}'"] + [f"--gin_param={p}" for p in SMALL],
        capture_output=True, text=True)
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
    proc = subprocess.run(
        [sys.executable, "-m", "runexp.compiler.cli", "--gin_file=quickstart.gin", "--dry_run",
         f"--gin_param=OUTPUT_ROOT='{root}'"] + [f"--gin_param={p}" for p in SMALL]
        + ["--gin_param=FINETUNE_STEPS=25"], capture_output=True, text=True)
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
    args = [sys.executable, "-m", "runexp.compiler.cli", "--gin_file=quickstart.gin",
            f"--gin_param=OUTPUT_ROOT='{root}'"] + [f"--gin_param={p}" for p in SMALL]
    # More steps than before: the finished pretrain stage is continued, then killed.
    long_run = subprocess.Popen(args + ["--gin_param=TRAIN_STEPS=100000",
                                        "--gin_param=CHECKPOINT_EVERY=10"],
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
    proc = subprocess.run(args + [f"--gin_param=TRAIN_STEPS={target}",
                                  "--gin_param=CHECKPOINT_EVERY=10"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "> pretrain: resuming" in proc.stdout
    manifest = json.load(open(os.path.join(root, "pretrain", "MANIFEST.json")))
    assert manifest["summary"]["step"] == target
    assert _latest_step(root) == target

    # Asking for fewer steps than the checkpoints hold cannot continue them: it starts over.
    dry = subprocess.run(args + ["--gin_param=TRAIN_STEPS=20", "--dry_run"],
                         capture_output=True, text=True)
    assert "~ pretrain  (pretrain)  will be rebuilt" in dry.stdout
    assert f"train_steps (20) is below the step of the existing checkpoints ({target})" in dry.stdout


@pytest.mark.slow
def test_wall_time_budget_stops_with_a_checkpoint_and_exit_code_124(finished):
    root, _ = finished
    before = _latest_step(root)
    args = [sys.executable, "-m", "runexp.compiler.cli", "--gin_file=quickstart.gin",
            f"--gin_param=OUTPUT_ROOT='{root}'"] + [f"--gin_param={p}" for p in SMALL]
    # A budget already spent when training starts: it must stop at once, with a checkpoint.
    proc = subprocess.run(args + ["--gin_param=TRAIN_STEPS=100000",
                                  "--gin_param=experiment.wall_time_hours=0.0001"],
                          capture_output=True, text=True, timeout=600)
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
    the TF SavedModels' within 1e-4 (tests/hf_testlib.py)."""
    from hf_testlib import check_export_against_runexp

    root, _ = finished
    with open(os.path.join(root, "corpus", "heldout.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][:300]
    figures = check_export_against_runexp(root, lines, str(tmp_path))
    assert figures["equal_lines"] == len(lines) == 300
    assert "classifier_logits" in figures
