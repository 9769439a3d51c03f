"""Packed pretraining rows through the `runexp` command (issue 27): the quickstart scaled down
to two phases, phase 2 packed. Its preprocess stage measures the packing factor, its
pretrain stage trains on the rows that hold the batch's instances, and the dry run then
shows the measured factor in place of the estimate."""

import json
import os
import subprocess

import pytest

from tests.support.cli import cli_args

pytestmark = pytest.mark.e2e

PHASES = ("train.phases=[{'max_seq_length': 32, 'max_predictions_per_seq': 5, 'steps': 8}, "
          "{'max_seq_length': 128, 'max_predictions_per_seq': 20, 'steps': 6, "
          "'packing': True}]")
SMALL = ["VOCAB_SIZE=2000", "DUPE_FACTOR=1", "WARMUP_STEPS=2", "CHECKPOINT_EVERY=4",
         "BATCH_SIZE=16", "train.log_every=2", "evaluate.max_examples=128",
         "vocab.max_sentences=20000", PHASES]


def _args(root, *extra):
    return cli_args(*extra, gin_file="quickstart.gin", root=root, params=SMALL)


@pytest.mark.slow
def test_a_packed_phase_trains_on_rows_and_the_plan_shows_the_measured_factor(tmp_path):
    root = str(tmp_path / "packed")
    proc = subprocess.run(_args(root, "--until=evaluate"), capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    with open(os.path.join(root, "preprocess.pretrain.phase2", "MANIFEST.json")) as f:
        packing = json.load(f)["summary"]["train"]["packing"]
    assert packing["factor"] > 1.1 and packing["fill"] > packing["unpacked_fill"]
    rows = max(1, round(16 / packing["factor"]))
    assert f"packed rows: {rows} a step hold about 16 instances" in proc.stdout
    with open(os.path.join(root, "pretrain.phase2", "MANIFEST.json")) as f:
        summary = json.load(f)["summary"]
    assert summary["step"] == 6 and summary["loss"] > 0

    dry = subprocess.run(_args(root, "--dry_run", "--until=evaluate"), capture_output=True,
                         text=True, timeout=300)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert (f"packing: {packing['factor']:.2f} instances a row (measured by "
            "preprocess.pretrain.phase2)") in dry.stdout
    assert f"    batch: {rows} rows of 128 a step, about 16 instances" in dry.stdout
