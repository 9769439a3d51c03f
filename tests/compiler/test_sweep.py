"""Fine-tuning sweeps in the plan: finetune.sweep expanded into one finetune stage per point
on the one vocab, preprocess and pretrain; the points' ids; the sweep stage; the export of
the selected or a named point; and the mistakes caught before anything runs."""

import pytest

from runexp.compiler.planner import compile_experiment
from runexp.compiler.render import render_plan
from runexp.compiler.state import CREATE, StageState
from runexp.compiler.sweep import point_name, sweepable, value_text
from tests.support.cli import errors_of

TRAIN = "label\tsentence\npos\tgood\nneg\tbad\npos\tfine\n"
DEV = "label\tsentence\npos\tgreat\nneg\tawful\n"


def _experiment(write, extra=""):
    train, dev = write("train.tsv", TRAIN), write("dev.tsv", DEV)
    return write("e.gin", f"""include 'runs/pretrain_finetune.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{write.dir}/out'
CORPUS_FILES = ['{write.corpus}']
HELDOUT_FILES = ['{write.heldout}']
TRAIN_STEPS = 10
FINETUNE_TASK = 'sst'
sst/classification_task.train_file = '{train}'
sst/classification_task.dev_file = '{dev}'
""" + extra)


GRID = "finetune.sweep = {'learning_rate': [5e-5, 3e-5, 2e-5], 'batch_size': [16, 32], " \
       "'seed': [1, 2]}\n"


def _plan(path, params=()):
    return compile_experiment([path], list(params)).plan


def test_the_grid_is_one_finetune_stage_per_point_on_one_pretrain(write):
    plan = _plan(_experiment(write, GRID))
    points = [s for s in plan.stages if s.kind == "finetune"]
    assert len(points) == 12
    assert [s.id for s in points[:4]] == [
        "finetune.sst.lr5e-5.bs16.s1", "finetune.sst.lr5e-5.bs16.s2",
        "finetune.sst.lr5e-5.bs32.s1", "finetune.sst.lr5e-5.bs32.s2"]
    assert "finetune.sst.lr2e-5.bs32.s2" in [s.id for s in points]
    # Exactly one vocab, preprocess and pretrain: every point reads the same pretrain.
    kinds = [s.kind for s in plan.stages]
    assert kinds.count("vocab") == kinds.count("pretrain") == kinds.count("preprocess") == 1
    pretrain = next(s for s in plan.stages if s.kind == "pretrain")
    assert {s.inputs["checkpoint_dir"] for s in points} == {pretrain.output_dir}
    assert all(pretrain.id in s.deps for s in points)
    # Each point carries its own settings, with the sweep's file and line as provenance.
    p = next(s for s in points if s.id == "finetune.sst.lr3e-5.bs32.s2")
    assert (p.params["learning_rate"], p.params["batch_size"], p.params["seed"]) == (3e-5, 32, 2)
    assert p.provenance["learning_rate"].endswith("e.gin:10")
    assert len({s.fingerprint for s in points}) == 12
    # The sweep stage reads every point; the export reads the sweep's choice.
    sweep = plan.stage("sweep.sst")
    assert list(sweep.deps) == [s.id for s in points]
    assert sweep.params["varied"] == ["learning_rate", "batch_size"]
    assert sweep.inputs["finetune_dirs"]["lr3e-5.bs32.s2"] == p.output_dir
    export = plan.stage("export")
    assert export.inputs["sweep_dir"] == sweep.output_dir
    assert set(export.inputs["finetune_dirs"]) == set(sweep.params["points"])
    assert "finetune_dir" not in export.inputs


def test_points_share_upstream_fingerprints_and_keep_theirs_when_the_grid_grows(write):
    path = _experiment(write, "finetune.sweep = {'learning_rate': [5e-5, 3e-5], 'seed': [1]}\n")
    small = _plan(path)
    grown = _plan(path, ["finetune.sweep = {'learning_rate': [5e-5, 3e-5, 1e-4], 'seed': [1]}"])
    fp = {s.id: s.fingerprint for s in small.stages}
    fp2 = {s.id: s.fingerprint for s in grown.stages}
    for sid in ("vocab", "preprocess.pretrain", "pretrain", "finetune.sst.lr5e-5.s1",
                "finetune.sst.lr3e-5.s1"):
        assert fp[sid] == fp2[sid], sid
    assert set(fp2) - set(fp) == {"finetune.sst.lr1e-4.s1"}
    assert fp["sweep.sst"] != fp2["sweep.sst"] and fp["export"] != fp2["export"]
    # A point is the same stage whether reached by the sweep or set directly: its fingerprint
    # depends on its settings only, not on how they were bound.
    single = _plan(path, ["finetune.sweep = None", "FINETUNE_LEARNING_RATE = 3e-5",
                          "finetune.seed = 1"])
    direct = single.stage("finetune.sst")
    assert direct.fingerprint == fp["finetune.sst.lr3e-5.s1"]


def test_a_named_export_point_reads_that_point_only(write):
    plan = _plan(_experiment(write, GRID + "finetune.export_point = 'lr3e-5.bs16.s2'\n"))
    export = plan.stage("export")
    assert export.inputs["finetune_dir"] == plan.stage("finetune.sst.lr3e-5.bs16.s2").output_dir
    assert "sweep_dir" not in export.inputs
    assert set(export.deps) == {"vocab", "pretrain", "finetune.sst.lr3e-5.bs16.s2"}


def test_the_dry_run_shows_the_grid_its_size_and_its_time(write):
    plan = _plan(_experiment(write, GRID))
    text = render_plan(plan, {s.id: StageState(CREATE, "new") for s in plan.stages})
    assert ("Sweep of sst (sweep.sst): learning_rate 3 x batch_size 2 x seed 2 = 12 points"
            in text)
    assert "    learning_rate: 5e-5, 3e-5, 2e-5" in text
    assert "    export: the selected point" in text
    assert "wall time of every point on cpu: about" in text


def test_point_names():
    assert value_text(3e-5) == "3e-5" and value_text(1e-4) == "1e-4"
    assert value_text(0.01) == "0.01" and value_text(0.1) == "0.1" and value_text(32) == "32"
    assert point_name([("learning_rate", 3e-5), ("batch_size", 32), ("seed", 1)]) == \
        "lr3e-5.bs32.s1"
    assert point_name([("steps", 300), ("warmup_steps", 30)]) == "steps300.warmup30"
    # Sweepable: FinetuneSpec's numbers bound on finetune itself.
    assert {"learning_rate", "batch_size", "seed", "steps", "warmup_steps", "weight_decay",
            "max_seq_length"} == set(sweepable())


@pytest.mark.parametrize("binding, message, hint", [
    ("finetune.sweep = {'learning_rat': [1e-5]}",
     "finetune.sweep: 'learning_rat' is not a setting a sweep can vary",
     "did you mean 'learning_rate'"),
    ("finetune.sweep = {'init_checkpoint': ['a']}",
     "'init_checkpoint' is not a setting a sweep can vary", "sweepable: "),
    ("finetune.sweep = {'learning_rate': 1e-5}",
     "finetune.sweep['learning_rate'] must be a non-empty list of values, got 1e-05",
     "'learning_rate': [1e-05]"),
    ("finetune.sweep = {'learning_rate': []}", "must be a non-empty list", ""),
    ("finetune.sweep = {'batch_size': [16, 'x']}",
     "finetune.sweep['batch_size'] must be an integer, got 'x'", ""),
    ("finetune.sweep = {'learning_rate': [-1e-5]}",
     "finetune.sweep['learning_rate'] must be at least 0.0, got -1e-05", ""),
    ("finetune.sweep = {'seed': [1, 2, 1]}", "finetune.sweep['seed'] lists 1 more than once",
     "list each value once"),
    ("finetune.sweep = {}", "finetune.sweep is empty", "e.g. finetune.sweep = "),
    ("finetune.sweep = {'max_seq_length': [64, 1024]}",
     "point len1024's max_seq_length (1024) exceeds max_position_embeddings (512)", ""),
])
def test_a_bad_grid_is_one_error_at_its_line(write, binding, message, hint):
    text = errors_of(_experiment(write, binding + "\n"))
    assert message in text and hint in text
    assert "e.gin:10" in text
    assert text.count("error:") == 1


def test_a_bad_export_point_or_metric_names_the_choices(write):
    text = errors_of(_experiment(write, GRID + "finetune.export_point = 'lr3e-5.bs32.s3'\n"))
    assert "finetune.export_point is 'lr3e-5.bs32.s3', which is not a point of the sweep " \
           "(learning_rate 3 x batch_size 2 x seed 2 = 12 points)" in text
    assert "did you mean 'lr3e-5.bs32.s2' or 'lr3e-5.bs32.s1'" in text and "e.gin:11" in text
    text = errors_of(_experiment(write, GRID + "finetune.select_metric = 'f1'\n"))
    assert "finetune.select_metric is 'f1', but task 'sst' is scored by accuracy" in text


def test_the_command_line_sets_a_sweep(write):
    plan = _plan(_experiment(write), ["finetune.sweep = {'seed': [1, 2, 3]}"])
    assert [s.id for s in plan.stages if s.kind == "finetune"] == [
        "finetune.sst.s1", "finetune.sst.s2", "finetune.sst.s3"]
    assert plan.stage("sweep.sst").params["varied"] == []


def test_a_suite_sweeps_each_task_and_scores_its_selection(write):
    path = _experiment(write, "FINETUNE_TASK = None\nFINETUNE_SUITE = ['sst', 'other']\n"
                              f"other/classification_task.train_file = '{write.dir}/train.tsv'\n"
                              f"other/classification_task.dev_file = '{write.dir}/dev.tsv'\n"
                              "finetune.sweep = {'learning_rate': [1e-4, 3e-5]}\n")
    plan = _plan(path)
    assert [s.id for s in plan.stages if s.kind in ("finetune", "sweep", "suite")] == [
        "finetune.sst.lr1e-4", "finetune.sst.lr3e-5", "sweep.sst",
        "finetune.other.lr1e-4", "finetune.other.lr3e-5", "sweep.other", "suite"]
    suite = plan.stage("suite")
    assert suite.inputs["finetune_dirs"] == {"sst": plan.stage("sweep.sst").output_dir,
                                             "other": plan.stage("sweep.other").output_dir}
    assert set(suite.deps) == {"sweep.sst", "sweep.other"}
    # The export of a suite is of the pretrained encoder, whatever the sweep.
    assert "sweep_dir" not in plan.stage("export").inputs
    text = errors_of(path, ["finetune.export_point = 'lr1e-4'"])
    assert "finetune.export_point is set, but the export of a suite is of the pretrained " \
           "encoder" in text


@pytest.mark.parametrize("param", ["finetune.select_metric = 'accuracy'",
                                   "finetune.export_point = 'lr1e-4'"])
def test_a_selection_without_a_sweep_is_an_error(write, param):
    text = errors_of(_experiment(write, param + "\n"))
    assert "is set, but finetune.sweep is not: there is no sweep to choose from" in text
    assert "e.gin:10" in text and text.count("error:") == 1


def test_until_and_only_take_a_point(write):
    from runexp.compiler.selection import select
    from runexp.compiler.state import REUSE, SKIP

    plan = _plan(_experiment(write, GRID))
    new = {s.id: StageState(CREATE, "new") for s in plan.stages}
    chosen = select(plan, new, until=["finetune.sst.lr3e-5.bs32.s1"])
    run = {sid for sid, st in chosen.items() if st.action != SKIP}
    assert run == {"vocab", "preprocess.pretrain", "pretrain",
                   "finetune.sst.lr3e-5.bs32.s1"}
    # Every point done: --only reruns one point (and the sweep kind names its stage).
    done = {sid: StageState(REUSE, "done") for sid in new}
    chosen = select(plan, {**done, "finetune.sst.lr2e-5.bs16.s2": StageState(CREATE, "new")},
                    only=["finetune.sst.lr2e-5.bs16.s2,sweep"])
    assert {sid for sid, st in chosen.items() if st.action == CREATE} == {
        "finetune.sst.lr2e-5.bs16.s2"}
    with pytest.raises(Exception, match="did you mean 'finetune.sst.lr3e-5.bs32.s2' or "
                                        "'finetune.sst.lr3e-5.bs32.s1'"):
        select(plan, new, only=["finetune.sst.lr3e-5.bs32.s7"])
