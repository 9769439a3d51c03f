"""Packing (bert_pretraining_task.packing) in the plan: the stages' params, what the batch
counts, the estimates (rows, not instances), the measured factor once preprocessed, and the
errors."""

import json
import os

import pytest

from runexp.compiler.cli import main
from runexp.compiler.errors import UserError
from runexp.compiler.estimates import estimate
from runexp.compiler.packing import estimated_factor
from runexp.compiler.planner import compile_experiment
from runexp.compiler.render import render_plan
from runexp.compiler.state import CREATE, StageState

TWO_PHASES = ("train.phases = [{'max_seq_length': 32, 'max_predictions_per_seq': 5, "
              "'steps': 30}, {'max_seq_length': 128, 'max_predictions_per_seq': 20, "
              "'steps': 10, 'packing': True}]")


def _plan(path, params=()):
    return compile_experiment([path], list(params)).plan


def _render(plan):
    return render_plan(plan, {s.id: StageState(CREATE, "not built yet") for s in plan.stages})


def test_unpacked_plans_carry_no_packing_params(minimal):
    plan = _plan(minimal)
    off = _plan(minimal, ["bert_pretraining_task.packing = False"])
    assert {s.id: s.fingerprint for s in plan.stages} == {s.id: s.fingerprint
                                                          for s in off.stages}
    for stage in plan.stages:
        assert not {"packing", "max_predictions_per_row", "batch_counts"} & set(stage.params)
    assert "packing" not in _render(plan)


def test_a_packed_phase_says_its_rows_and_what_the_batch_counts(write, minimal):
    path = write("phased.gin", f"include '{minimal}'\n{TWO_PHASES}\n")
    plan = _plan(path)
    pre1, pre2 = plan.stage("preprocess.pretrain"), plan.stage("preprocess.pretrain.phase2")
    one, two = plan.stage("pretrain"), plan.stage("pretrain.phase2")
    assert "packing" not in pre1.params and "packing" not in one.params
    assert pre2.params["packing"] is True
    assert pre2.provenance["packing"].startswith("train.phases, phase 2 @ ")
    assert two.params["packing"] is True and two.params["batch_counts"] == "instances"
    # At most 0.15 x 128 + 3 predictions in a row of three instances: 22 slots, not 60.
    assert two.params["max_predictions_per_row"] == 22
    assert two.params["max_predictions_per_seq"] == 20  # per instance, as unpacked

    factor, packed_fill, unpacked_fill = estimated_factor(128)
    rows = round(8 / factor)
    est = estimate(plan, "pretrain.phase2")
    assert est.packed.rows == rows < 8 and est.packed.instances_per_step == 8
    assert est.tokens_per_step == rows * 128
    flat = write("flat.gin", f"include '{minimal}'\n"
                             f"{TWO_PHASES.replace(', ' + repr('packing') + ': True', '')}\n")
    unpacked = estimate(_plan(flat), "pretrain.phase2")
    assert unpacked.packed is None
    assert est.train_flops_per_step < unpacked.train_flops_per_step * rows / 8 * 1.01
    assert est.memory_gb_per_replica < unpacked.memory_gb_per_replica
    text = _render(plan)
    line = (f"    batch: {rows} rows of 128 a step, about 8 instances (train.batch_counts = "
            "'instances': the learning rate and steps mean what they mean unpacked)")
    assert text.count(line) == 2  # on the stage, and in its estimates
    assert (f"    packing: {factor:.2f} instances a row (estimated before preprocessing; "
            f"measured once it has run); rows {packed_fill:.0%} full, {unpacked_fill:.0%} "
            "unpacked") in text


def test_rows_keep_the_batch_in_rows_and_say_what_it_does_to_the_learning_rate(write,
                                                                                minimal):
    path = write("phased.gin", f"include '{minimal}'\n{TWO_PHASES}\n"
                               "train.batch_counts = 'rows'\n")
    plan = _plan(path)
    est = estimate(plan, "pretrain.phase2")
    assert est.packed.rows == 8 and est.packed.instances_per_step > 8
    assert "train.batch_counts = 'rows': " in _render(plan)
    assert "scale the learning rate as for that larger batch" in _render(plan)


def test_the_measured_factor_replaces_the_estimate_once_preprocessed(write, minimal):
    path = write("phased.gin", f"include '{minimal}'\n{TWO_PHASES}\n")
    plan = _plan(path)
    pre2 = plan.stage("preprocess.pretrain.phase2")
    os.makedirs(pre2.output_dir)
    with open(os.path.join(pre2.output_dir, "MANIFEST.json"), "w") as f:
        json.dump({"fingerprint": "an older build's", "summary": {"train": {"packing": {
            "instances": 4000, "rows": 1000, "factor": 4.0, "fill": 0.96,
            "unpacked_fill": 0.24}}}}, f)
    assert estimate(plan, "pretrain.phase2").packed.source.startswith("estimated")
    with open(os.path.join(pre2.output_dir, "MANIFEST.json"), "w") as f:
        json.dump({"fingerprint": pre2.fingerprint, "summary": {"train": {
            "instances": 4000, "packing": {"instances": 4000, "rows": 1600, "factor": 2.5,
                                           "fill": 0.96, "unpacked_fill": 0.384}}}}, f)
    est = estimate(plan, "pretrain.phase2")
    assert (est.packed.factor, est.packed.rows) == (2.5, 3)  # 8 / 2.5 = 3.2
    assert est.epochs == pytest.approx(10 * 8 / 4000)  # epochs count instances
    assert ("packing: 2.50 instances a row (measured by preprocess.pretrain.phase2); rows "
            "96% full, 38% unpacked") in _render(plan)


def test_bad_packing_values_are_errors(write, minimal, capsys):
    path = write("bad.gin", f"include '{minimal}'\nbert_pretraining_task.packing = 'on'\n")
    assert main([f"--gin_file={path}", "--dry_run"]) == 1
    err = capsys.readouterr().err
    assert "bad.gin:2: error: pretrain/bert_pretraining_task.packing must be True or False, " \
           "got 'on'" in err
    path = write("bad2.gin", f"include '{minimal}'\ntrain.batch_counts = 'examples'\n")
    assert main([f"--gin_file={path}", "--dry_run"]) == 1
    assert "train.batch_counts must be one of" in capsys.readouterr().err


def test_packing_ready_made_examples_is_an_error(write, minimal):
    record = write("ex.tfrecord", b"")
    path = write("ready.gin", f"""
        include '{minimal}'
        VOCAB = '{write.dir}/vocab.txt'
        bert_pretraining_task.format = 'bert_tfrecord'
        bert_pretraining_task.train_files = ['{record}']
        bert_pretraining_task.packing = True
        """)
    write("vocab.txt", "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    with pytest.raises(UserError) as e:
        _plan(path)
    assert "pretrain: packing packs the instances the preprocess stage makes, but format " \
           "'bert_tfrecord' brings ready-made examples, cached as they are" in str(e.value)


def test_batch_counts_without_packing_is_a_warning(write, minimal):
    path = write("w.gin", f"include '{minimal}'\ntrain.batch_counts = 'rows'\n")
    plan = _plan(path)
    assert any("train.batch_counts says what a batch of packed rows counts" in w
               for w in plan.warnings)
    assert "batch_counts" not in plan.stage("pretrain").params
