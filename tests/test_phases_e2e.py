"""Pretraining in two phases through the `runexp` command, on the quickstart scaled down:
32 tokens, then 64 from the first phase's weights.

- the corpus is read and tokenised once (the preprocess MANIFESTs' input_bytes_read);
- phase 2's first state is phase 1's final weights (the checkpoints, by value);
- evaluation, fine-tuning and export follow phase 2;
- killed -9 in phase 2, a rerun resumes phase 2 from its own checkpoint (phase 1 reused) and
  ends where the uninterrupted run ended.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.support.cli import cli_args

pytestmark = pytest.mark.e2e

# tests.support.cli's QUICKSTART_SMALL, with two phases instead of one length. Phase 2 keeps a
# checkpoint at every step: its first one shows where it started from.
PHASES = ("train.phases=[{'max_seq_length': 32, 'max_predictions_per_seq': 5, 'steps': 24}, "
          "{'max_seq_length': 64, 'max_predictions_per_seq': 10, 'steps': 12, "
          "'checkpoint_every': 1}]")
SMALL = [
    "VOCAB_SIZE=2000", "DUPE_FACTOR=1", "WARMUP_STEPS=4", "CHECKPOINT_EVERY=8",
    "KEEP_CHECKPOINTS=20", "train.log_every=4", "evaluate.max_examples=256",
    "FINETUNE_STEPS=10", "finetune.warmup_steps=2", "vocab.max_sentences=20000", PHASES,
]
STAGES = ["corpus", "vocab", "preprocess.pretrain", "preprocess.pretrain.phase2", "pretrain",
          "pretrain.phase2", "evaluate", "finetune.stdlib_package", "export"]


def _args(root, *params):
    return cli_args(gin_file="quickstart.gin", root=root, params=[*SMALL, *params])


def _manifest(root, stage):
    with open(os.path.join(root, stage, "MANIFEST.json")) as f:
        return json.load(f)


def _checkpoint(root, stage, step=None):
    import tensorflow as tf

    directory = os.path.join(root, stage, "checkpoints")
    prefix = (os.path.join(directory, f"ckpt-{step}") if step is not None
              else tf.train.latest_checkpoint(directory))
    reader = tf.train.load_checkpoint(prefix)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if not n.startswith("save_counter") and not n.startswith("_CHECKPOINTABLE")}


def _weights(state):
    return {n: v for n, v in state.items()
            if n.startswith("model/") and "/generator/" not in n}


def _latest_step(root, stage):
    steps = [int(p.rsplit("-", 1)[1].split(".")[0])
             for p in glob.glob(os.path.join(root, stage, "checkpoints", "ckpt-*.index"))]
    return max(steps) if steps else 0


# `python -c` code running `runexp ARGS` with the trainer killing its own process right
# after it saved a checkpoint of {stage} at step {step} or later.
_KILLED_AFTER_CHECKPOINT = """
import os, signal, sys
from runexp.runtime import checkpoint_cadence
save = checkpoint_cadence.CheckpointCadence._save
def _save(self, step, background=False):
    saved = save(self, step, background)
    if step >= {step} and os.sep + "{stage}" + os.sep in self.manager.directory + os.sep:
        os.kill(os.getpid(), signal.SIGKILL)
    return saved
checkpoint_cadence.CheckpointCadence._save = _save
from runexp.compiler.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("phases"))
    proc = subprocess.run(_args(root), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return root, proc


@pytest.mark.slow
def test_two_phases_run_through_and_the_rest_follows_the_last(finished):
    root, proc = finished
    for stage in STAGES:
        assert os.path.isfile(os.path.join(root, stage, "COMPLETED")), stage
    assert proc.stdout.index("+ preprocess.pretrain.phase2: creating") < \
        proc.stdout.index("+ pretrain: creating") < proc.stdout.index("+ pretrain.phase2:")

    # The corpus is read and tokenised once: phase 2 makes its examples from phase 1's tokens.
    one, two = (_manifest(root, s)["summary"] for s in ("preprocess.pretrain",
                                                         "preprocess.pretrain.phase2"))
    assert one["input_bytes_read"] >= one["input_bytes"] > 100_000
    assert two["input_bytes_read"] == 0 and two["input_bytes"] == one["input_bytes"]
    assert one["split_index_bytes"] > 0
    assert "no corpus file is read" in proc.stdout
    assert two["train"]["instances"] < one["train"]["instances"]  # longer examples

    # Phase 2 trained 12 steps from phase 1's final checkpoint, with a fresh optimizer.
    summary = _manifest(root, "pretrain.phase2")["summary"]
    assert summary["step"] == 12 and summary["resumed_from"] is None
    assert summary["previous_phase"]["step"] == 24
    assert summary["previous_phase"]["optimizer_state"] == "reset"
    assert summary["previous_phase"]["checkpoint"] == os.path.join(root, "pretrain",
                                                                   "checkpoints", "ckpt-24")
    # By value: its first step's learning rate is 0 (its warmup starts again), so its first
    # checkpoint holds exactly phase 1's final weights, and moments of one gradient alone.
    final, first = _checkpoint(root, "pretrain"), _checkpoint(root, "pretrain.phase2", 1)
    weights = _weights(final)
    assert len(weights) > 20
    for name, value in weights.items():
        np.testing.assert_array_equal(first[name], value, err_msg=name)
    moments = [n for n in first if n.startswith("optimizer/m/")]
    assert len(moments) > 20
    for name in moments:  # m = 0.1 g and v = 0.001 g^2 after one gradient: m^2 / v = 10
        m, v = first[name], first[name.replace("optimizer/m/", "optimizer/v/")]
        kept = v > 1e-20
        np.testing.assert_allclose(m[kept] ** 2 / v[kept], 10.0, rtol=1e-3, err_msg=name)
    # ... and it learned on from there.
    last = _weights(_checkpoint(root, "pretrain.phase2"))
    assert sum(not np.array_equal(last[n], w) for n, w in weights.items()) > len(weights) / 2

    # Evaluation, fine-tuning and export follow the last phase: its model, its length.
    phase2 = os.path.join(root, "pretrain.phase2")
    evaluate = _manifest(root, "evaluate")
    assert evaluate["inputs"]["checkpoint_dir"] == phase2 and evaluate["summary"]["step"] == 12
    assert evaluate["params"]["max_seq_length"] == 64
    assert _manifest(root, "finetune.stdlib_package")["inputs"]["checkpoint_dir"] == phase2
    export = _manifest(root, "export")  # the fine-tuned model, on phase 2's encoder
    assert export["inputs"]["checkpoint_dir"] == phase2 and "pretrain" not in export["inputs"]

    # Run again: everything is reused.
    dry = subprocess.run(_args(root) + ["--dry_run"], capture_output=True, text=True,
                         timeout=300)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert f"Plan: {len(STAGES)} to reuse." in dry.stdout

    # A seqio user gets the last phase's examples under the task's name.
    code = ("import sys, seqio\n"
            "from runexp.tasks import register\n"
            "print(register(sys.argv[1]))\n"
            "ds = seqio.get_mixture_or_task('pretrain').get_dataset(\n"
            "    split='validation', sequence_length=None, use_cached=True, shuffle=False)\n"
            "print(len(next(ds.as_numpy_iterator())['input_ids']))\n")
    registered = subprocess.run([sys.executable, "-c", code, root], capture_output=True,
                                text=True, timeout=300)
    assert registered.returncode == 0, registered.stderr[-3000:]
    assert registered.stdout.split()[-3:] == ["['pretrain',", "'stdlib_package']", "64"]

    # Each phase's examples can be inspected.
    args = _args(root)
    for phase, length in ((1, 32), (2, 64)):
        shown = subprocess.run(args[:3] + ["inspect"] + args[3:] + ["--phase", str(phase),
                                                                     "-n", "1"],
                               capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert "example 1: " in shown.stdout and "[MASK→" in shown.stdout
        assert f"at max_seq_length ({length}): " in shown.stdout, shown.stdout[-1500:]


@pytest.mark.slow
def test_killed_in_phase_2_a_rerun_resumes_phase_2_exactly(finished, tmp_path):
    root, _ = finished
    # The same experiment elsewhere, phase 1 done: its stage directories, as a run killed in
    # phase 2 leaves them.
    other = str(tmp_path / "killed")
    for stage in STAGES[:5]:
        shutil.copytree(os.path.join(root, stage), os.path.join(other, stage))
    until = "--until=pretrain.phase2"
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        # The real command, killed (SIGKILL, as a preempted VM is) right after phase 2's
        # first checkpoint at step 5 or later is written: at that step however fast or busy
        # the machine is.
        code = _KILLED_AFTER_CHECKPOINT.format(stage="pretrain.phase2", step=5)
        run = subprocess.run([sys.executable, "-c", code] + _args(other)[3:] + [until],
                             stdout=out, stderr=subprocess.STDOUT, timeout=900)
    assert run.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    killed_at = _latest_step(other, "pretrain.phase2")
    assert 5 <= killed_at < 12, (killed_at, log.read_text()[-3000:])
    assert not os.path.exists(os.path.join(other, "pretrain.phase2", "COMPLETED"))

    dry = subprocess.run(_args(other) + [until, "--dry_run"], capture_output=True, text=True,
                         timeout=300)
    assert "= pretrain  (pretrain)  will be reused" in dry.stdout
    assert "> pretrain.phase2  (pretrain)  will be resumed" in dry.stdout
    proc = subprocess.run(_args(other) + [until], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "= pretrain: reused" in proc.stdout
    assert "> pretrain.phase2: resuming" in proc.stdout
    resumed_at = int(proc.stdout.split("resuming from ")[1].split(" at step ")[1]
                     .split("/")[0])
    assert killed_at - 1 <= resumed_at <= killed_at  # the latest complete checkpoint
    assert f"at step {resumed_at}/12 ({resumed_at} batches consumed)" in proc.stdout
    assert "starting from the previous phase" not in proc.stdout  # never restarted from 1
    summary = _manifest(other, "pretrain.phase2")["summary"]
    assert summary["step"] == 12 and summary["steps_trained"] == 12 - resumed_at
    # Exactly where the uninterrupted run ended: weights, optimizer state, data position.
    expected, got = _checkpoint(root, "pretrain.phase2"), _checkpoint(other, "pretrain.phase2")
    assert set(got) == set(expected) and len(got) > 40
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert summary["loss"] == _manifest(root, "pretrain.phase2")["summary"]["loss"]


@pytest.mark.slow
def test_on_gcs_a_later_phase_reads_the_first_phases_tokens_from_the_bucket(gcs_prefix,
                                                                             tmp_path):
    """Phase 1's tokenised splits are uploaded with its stage; phase 2's preprocess stage,
    run from a fresh cache (another machine), reads them through the mirror, not the corpus.
    """
    from runexp.compiler.planner import compile_experiment
    from runexp.runtime import storage

    def run(cache, *extra):
        env = dict(os.environ, RUNEXP_CACHE_DIR=str(tmp_path / cache))
        return subprocess.run(_args(gcs_prefix) + list(extra), capture_output=True, text=True,
                              timeout=600, env=env)

    first = run("cache1", "--until=preprocess.pretrain")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert storage.glob(f"{gcs_prefix}/preprocess.pretrain/split_index/train/*")
    assert not storage.exists(f"{gcs_prefix}/preprocess.pretrain.phase2/COMPLETED")

    second = run("cache2", "--until=preprocess")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "= preprocess.pretrain: reused" in second.stdout
    assert "+ preprocess.pretrain.phase2: creating" in second.stdout
    manifest = json.loads(storage.read_text(
        f"{gcs_prefix}/preprocess.pretrain.phase2/MANIFEST.json"))
    assert manifest["summary"]["input_bytes_read"] == 0
    assert manifest["summary"]["train"]["instances"] > 0
    assert manifest["inputs"]["split_index_dir"] == f"{gcs_prefix}/preprocess.pretrain/split_index"
    # No corpus file was downloaded into the second cache: only stage directories.
    downloaded = [os.path.relpath(os.path.join(d, f), tmp_path / "cache2")
                  for d, _, files in os.walk(tmp_path / "cache2") for f in files]
    assert not any("/inputs/" in f"/{p}" for p in downloaded), downloaded[:10]
    assert not any(p.split(os.sep)[2:3] == ["corpus"] for p in downloaded)
    # The same fingerprints as the experiment on local disk.
    local = compile_experiment(["quickstart.gin"], [f"OUTPUT_ROOT='{tmp_path}/local'", *SMALL])
    for stage_id in ("preprocess.pretrain", "preprocess.pretrain.phase2"):
        remote = json.loads(storage.read_text(f"{gcs_prefix}/{stage_id}/MANIFEST.json"))
        assert remote["fingerprint"] == local.plan.stage(stage_id).fingerprint, stage_id
