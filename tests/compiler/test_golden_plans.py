"""Golden plan texts for the reference experiments: a reviewer reads plan changes in a diff.

Regenerate after an intended change with:
    RUNEXP_UPDATE_GOLDEN=1 .venv/bin/pytest tests/compiler/test_golden_plans.py
"""

import glob
import os

import pytest

from runexp.compiler.planner import compile_experiment
from runexp.compiler.render import render_plan
from runexp.compiler.state import CREATE, StageState

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXPERIMENTS = sorted(glob.glob(os.path.join(REPO, "gin", "experiments", "*.gin")))


def test_there_are_reference_experiments():
    assert len(EXPERIMENTS) >= 2


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_reference_experiment_plan_matches_golden(path, monkeypatch, tmp_path):
    # A local output root resolves against the working directory: one holding only the gin
    # tree, so nothing a local run left (preprocess stats, finished stages) changes the plan,
    # and the golden text says <cwd> whatever the clone's path.
    os.symlink(os.path.join(REPO, "gin"), tmp_path / "gin")
    monkeypatch.chdir(tmp_path)
    # gs:// inputs unlisted, whatever credentials or emulator this machine has: their
    # fingerprints are then the constant ones (compiler/gcs_inputs.py).
    monkeypatch.setenv("RUNEXP_NO_INPUT_LISTING", "1")
    plan = compile_experiment([os.path.relpath(path, REPO)]).plan
    # The plan as a first run sees it, whatever is (or is not) reachable on gs:// now.
    states = {s.id: StageState(CREATE, "not built yet") for s in plan.stages}
    text = render_plan(plan, states, dry_run=True).replace(str(tmp_path), "<cwd>") + "\n"
    golden = os.path.join(HERE, "golden", os.path.basename(path)[:-4] + ".txt")
    if os.environ.get("RUNEXP_UPDATE_GOLDEN") == "1":
        with open(golden, "w", encoding="utf-8") as f:
            f.write(text)
    with open(golden, encoding="utf-8") as f:
        expected = f.read()
    assert text == expected, f"plan of {path} changed; if intended, regenerate (see docstring)"
