"""A pretraining ablation run end to end through the `runexp` command, on the quickstart at
its shortest: the masking rate 0.15 vs 0.2, one corpus and one vocab built once, each point's
preprocess and pretrain; a rerun reuses everything; a value added runs only its point;
`status` names the points. Real TensorFlow training, a few steps each."""

import os

import pytest

from tests.support.cli import QUICKSTART_SHORT, output, run_cli

pytestmark = pytest.mark.e2e

GIN = "experiments/quickstart_ablation.gin"
# Pretraining only (no evaluate, fine-tune or export), so the test stays short.
PARAMS = [*QUICKSTART_SHORT, "VOCAB_SIZE=2000", "vocab.max_sentences=20000",
          "evaluate.enabled=False", "FINETUNE_TASK=None", "export.enabled=False"]
TWO = "experiment.ablation = {'MASKED_LM_PROB': [0.15, 0.2]}"
THREE = "experiment.ablation = {'MASKED_LM_PROB': [0.15, 0.2, 0.25]}"


def _run(root, *args, grid=TWO):
    return run_cli(*args, gin_file=GIN, root=root, params=[*PARAMS, grid], timeout=900)


def _actions(stdout: str) -> dict:
    """stage id -> what the run did with it ('creating', 'reused', ...)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("[") and "] " in line and ": " in line:
            stage, _, rest = line.split("] ", 1)[1][2:].partition(": ")
            out[stage] = rest.split(" ", 1)[0]
    return out


@pytest.mark.slow
def test_an_ablation_builds_the_vocab_once_and_grows_by_its_new_point_only(tmp_path):
    root = str(tmp_path / "ablation")
    dry = _run(root, "--dry_run")
    assert dry.returncode == 2, output(dry)  # work pending
    assert "MASKED_LM_PROB 2 = 2 points" in dry.stdout
    assert "shared by every point: corpus, vocab" in dry.stdout

    first = _run(root)
    assert first.returncode == 0, output(first)
    done = _actions(first.stdout)
    points = [f"{sid}.masked_lm_prob{v}" for sid in ("preprocess.pretrain", "pretrain")
              for v in ("0.15", "0.2")]
    assert set(done) == {"corpus", "vocab", *points}, done
    assert set(done.values()) == {"creating"}, done
    for stage in ["vocab", *points]:
        assert os.path.isfile(os.path.join(root, stage, "COMPLETED")), stage
    assert not os.path.exists(os.path.join(root, "pretrain"))

    again = _run(root)
    assert again.returncode == 0, output(again)
    assert set(_actions(again.stdout).values()) == {"reused"}, _actions(again.stdout)

    grown = _run(root, grid=THREE)
    assert grown.returncode == 0, output(grown)
    acted = {s: a for s, a in _actions(grown.stdout).items() if a != "reused"}
    assert set(acted) == {"preprocess.pretrain.masked_lm_prob0.25",
                          "pretrain.masked_lm_prob0.25"}, acted

    status = run_cli("status", root)
    assert status.returncode == 0, output(status)
    assert "pretrain.masked_lm_prob0.25" in status.stdout and "vocab" in status.stdout
