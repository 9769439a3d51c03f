"""`runexp status`'s ETA of a running pretrain stage: steps left x instances a step /
instances per second (the train log's rate counts instances, a packed row holding several)."""

import json
import os

import pytest

from runexp.compiler.packing import packing_of
from runexp.compiler.planner import compile_experiment
from runexp.runtime import log_reader
from runexp.runtime.status import _training

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _running(tmp_path, monkeypatch, params, stage_id, step=1000, eps=250.0):
    monkeypatch.chdir(tmp_path)
    plan = compile_experiment([os.path.join(REPO, "gin", "experiments", "quickstart_packing.gin")],
                              params, search_paths=[REPO]).plan
    stage = next(s for s in plan.stages if s.id == stage_id)
    os.makedirs(stage.output_dir)
    with open(log_reader.log_path(stage.output_dir, log_reader.TRAIN_LOG), "w") as f:
        f.write(json.dumps({"step": step, "loss": 6.0, "examples_per_second": eps}) + "\n")
    return plan, stage, _training(plan, stage, live=True)


@pytest.mark.parametrize("stage_id", ["pretrain.packingFalse.seed1", "pretrain.packingTrue.seed1"])
def test_with_batch_counts_instances_a_step_is_the_batch(tmp_path, monkeypatch, stage_id):
    _, _, out = _running(tmp_path, monkeypatch, [], stage_id)
    # 2,400 steps planned, 1,000 done; 32 instances a step at 250 instances/s.
    assert out["eta_seconds"] == round(1400 * 32 / 250.0)


def test_with_batch_counts_rows_a_step_is_its_rows_instances(tmp_path, monkeypatch):
    plan, stage, out = _running(tmp_path, monkeypatch, ["train.batch_counts = 'rows'"],
                                "pretrain.packingTrue.seed1")
    per_step = packing_of(plan, stage).instances_per_step
    assert per_step > 32  # 32 rows of about 1.2 instances each
    assert out["eta_seconds"] == round(1400 * per_step / 250.0)
