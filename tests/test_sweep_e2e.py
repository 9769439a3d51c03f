"""A fine-tuning sweep run end to end through the `runexp` command, on the quickstart at its
shortest: one pretrain, every point fine-tuned, the selected point exported, the report's
grid table; a rerun reuses everything; a learning rate added runs only its points (and the
selection and export again); `status` names the points. Real TensorFlow training of each
point, a few steps each."""

import json
import os

import pytest

from tests.support.cli import QUICKSTART_SHORT, output, run_cli

pytestmark = pytest.mark.e2e

GIN = "experiments/quickstart_sweep.gin"
# Two learning rates, one seed, at the quickstart's shortest (the checked-in grid is three
# learning rates x two seeds; here fewer points, so the test stays short: the selection over
# seeds is tested on its own in tests/runtime/test_sweep_selection.py).
TWO = "finetune.sweep = {'learning_rate': [1e-4, 3e-4], 'seed': [1]}"
THREE = "finetune.sweep = {'learning_rate': [1e-4, 3e-4, 1e-3], 'seed': [1]}"
PARAMS = [*QUICKSTART_SHORT, "VOCAB_SIZE=2000", "vocab.max_sentences=20000",
          "evaluate.enabled=False"]


def _run(root, *args, grid=TWO):
    return run_cli(*args, gin_file=GIN, root=root, params=[*PARAMS, grid], timeout=900)


def _actions(stdout: str) -> dict:
    """stage id -> what the run did with it ('creating', 'reused', ...), from its lines
    '[i/n] + STAGE: ACTION (why)'."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("[") and "] " in line and ": " in line:
            stage, _, rest = line.split("] ", 1)[1][2:].partition(": ")
            out[stage] = rest.split(" ", 1)[0]
    return out


@pytest.mark.slow
def test_a_sweep_runs_reuses_and_grows_by_its_new_points_only(tmp_path):
    root = str(tmp_path / "sweep")
    points = [f"finetune.stdlib_package.lr{lr}.s1" for lr in ("1e-4", "3e-4")]
    dry = _run(root, "--dry_run")
    assert dry.returncode == 2, output(dry)  # work pending
    assert "learning_rate 2 x seed 1 = 2 points" in dry.stdout

    first = _run(root)
    assert first.returncode == 0, output(first)
    done = _actions(first.stdout)
    assert [s for s in done if s.startswith("pretrain")] == ["pretrain"]
    for stage in [*points, "sweep.stdlib_package", "export"]:
        assert done.get(stage) == "creating", (stage, done)
        assert os.path.isfile(os.path.join(root, stage, "COMPLETED")), stage
    sweep = json.load(open(os.path.join(root, "sweep.stdlib_package", "sweep.json")))
    assert set(sweep["points"]) == {p.rsplit(".", 2)[1] + "." + p.rsplit(".", 1)[1]
                                    for p in points}
    # The exported point is the selected setting's best seed, by the points' own metrics.
    scores = {}
    for p in points:
        m = json.load(open(os.path.join(root, p, "metrics.json")))
        scores[p] = m["dev_sets"]["dev"]["accuracy"]
    means = {lr: scores[f"finetune.stdlib_package.lr{lr}.s1"] for lr in ("1e-4", "3e-4")}
    best = max(means, key=lambda lr: (means[lr], lr == "1e-4"))  # ties: the first in the grid
    assert sweep["selected"]["setting"] == f"lr{best}"
    assert sweep["selected"]["mean"] == pytest.approx(means[best])
    exported = json.load(open(os.path.join(root, "export", "MANIFEST.json")))["summary"]
    assert exported["point"] == f"finetune.stdlib_package.{sweep['exported']}"
    assert sweep["exported"].startswith(f"lr{best}.")
    assert "sweep.stdlib_package: selected" in first.stdout

    report = run_cli("report", root)
    assert report.returncode == 0, output(report)
    html = open(os.path.join(root, "report.html"), encoding="utf-8").read()
    assert "Sweeps: the grid, the selection" in html and "⬅ exported" in html
    assert f"<code>lr{best}</code>" in html and "data:image/png;base64" in html

    again = _run(root)
    assert again.returncode == 0, output(again)
    assert set(_actions(again.stdout).values()) == {"reused"}, _actions(again.stdout)

    grown = _run(root, grid=THREE)
    assert grown.returncode == 0, output(grown)
    acted = {s: a for s, a in _actions(grown.stdout).items() if a != "reused"}
    assert set(acted) == {"finetune.stdlib_package.lr1e-3.s1", "sweep.stdlib_package",
                          "export"}, acted
    assert set(json.load(open(os.path.join(root, "sweep.stdlib_package", "sweep.json")))[
        "points"]) == {"lr1e-4.s1", "lr3e-4.s1", "lr1e-3.s1"}

    status = run_cli("status", root)
    assert status.returncode == 0, output(status)
    assert "finetune.stdlib_package.lr1e-3.s1" in status.stdout
