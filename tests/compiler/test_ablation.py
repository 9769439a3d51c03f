"""Ablations in the plan: experiment.ablation's grid over any binding compiled once per point
and merged, the stages no value changes shared (plain ids), the others once per point (the
point in their ids and directories, their dependencies their point's own); the dry run's
Ablation block; --until/--only per point; and the mistakes caught before anything runs."""

import os

import pytest

from runexp.compiler.plan import Plan
from runexp.compiler.planner import compile_experiment
from runexp.compiler.render import render_plan
from runexp.compiler.selection import select
from runexp.compiler.state import CREATE, REUSE, SKIP, StageState
from tests.support.cli import errors_of

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLM = "experiment.ablation = {'MASKED_LM_PROB': [0.15, 0.2]}"
PER_POINT = ["preprocess.pretrain", "pretrain", "evaluate", "finetune.stdlib_package", "export"]


@pytest.fixture
def quickstart(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)

    def compile_(*params):
        return compile_experiment(["quickstart.gin"],
                                  [f"OUTPUT_ROOT = '{tmp_path}/out'", *params]).plan
    return compile_


def _dry_run(plan):
    return render_plan(plan, {s.id: StageState(CREATE, "new") for s in plan.stages})


def test_the_masking_rate_shares_corpus_and_vocab_and_splits_the_rest(quickstart):
    plain = quickstart()
    plan = quickstart(MLM)
    ids = [s.id for s in plan.stages]
    assert ids[:2] == ["corpus", "vocab"]
    assert ids[2:] == [f"{sid}.masked_lm_prob{v}" for sid in PER_POINT for v in ("0.15", "0.2")]
    # The shared stages are the plain experiment's; the 0.15 point is the plain experiment.
    assert plan.stage("vocab").fingerprint == plain.stage("vocab").fingerprint
    for sid in PER_POINT:
        assert plan.stage(f"{sid}.masked_lm_prob0.15").fingerprint == plain.stage(sid).fingerprint
        assert plan.stage(f"{sid}.masked_lm_prob0.2").fingerprint != plain.stage(sid).fingerprint
    assert plan.stage("preprocess.pretrain.masked_lm_prob0.2").params["masked_lm_prob"] == 0.2
    # Directories: one each, named as the stage; a point reads its own upstream stages.
    dirs = [s.output_dir for s in plan.stages]
    assert len(set(dirs)) == len(dirs)
    assert all(s.output_dir.endswith("/" + s.id) for s in plan.stages)
    pretrain = plan.stage("pretrain.masked_lm_prob0.2")
    assert set(pretrain.deps) == {"preprocess.pretrain.masked_lm_prob0.2", "vocab"}
    assert pretrain.inputs["data_dir"] == plan.stage(
        "preprocess.pretrain.masked_lm_prob0.2").output_dir
    export = plan.stage("export.masked_lm_prob0.2")
    assert set(export.deps) == {"vocab", "pretrain.masked_lm_prob0.2",
                                "finetune.stdlib_package.masked_lm_prob0.2"}
    ids_set = set(ids)
    assert all(d in ids_set for s in plan.stages for d in s.deps)
    assert ".masked_lm_prob0.15" not in str(plan.stage("vocab").to_dict())
    # A saved plan reads back with its grid.
    assert Plan.from_json(plan.to_json()) == plan


def test_the_dry_run_shows_the_grid_the_shared_stages_and_the_time(quickstart):
    text = _dry_run(quickstart(MLM))
    block = text[text.index("Ablation ("):].split("\n\n")[0]
    assert "MASKED_LM_PROB 2 = 2 points" in block
    assert "MASKED_LM_PROB (masked_lm_prob): 0.15, 0.2" in block
    assert "shared by every point: corpus, vocab" in block
    assert ("one per value of MASKED_LM_PROB: preprocess.pretrain, pretrain, evaluate, "
            "finetune.stdlib_package, export") in block
    assert "wall time in all on cpu (every point's training, shared stages once): about" \
        in block
    assert "Estimates for pretraining, every phase" not in text  # points are not phases


def test_the_command_line_spelling_plans_the_same(quickstart):
    assert [s.id for s in quickstart(MLM).stages] == [s.id for s in quickstart(
        "experiment.ablation = {'bert_pretraining_task.masked_lm_prob': [0.15, 0.2]}").stages]


def test_two_keys_name_each_stage_by_the_keys_that_change_it(quickstart):
    plan = quickstart("experiment.ablation = {'MASKED_LM_PROB': [0.15, 0.2], "
                      "'FINETUNE_LEARNING_RATE': [1e-4, 3e-4]}")
    ids = [s.id for s in plan.stages]
    assert "pretrain.masked_lm_prob0.2" in ids  # the fine-tune's rate does not change it
    assert "finetune.stdlib_package.masked_lm_prob0.2.finetune_learning_rate3e-4" in ids
    assert len([i for i in ids if i.startswith("pretrain.")]) == 2
    assert len([i for i in ids if i.startswith("finetune.")]) == 4


def test_a_sweep_in_an_ablation_multiplies(quickstart):
    plan = quickstart(MLM, "finetune.sweep = {'seed': [1, 2]}")
    ids = [s.id for s in plan.stages]
    for v in ("0.15", "0.2"):
        sweep = plan.stage(f"sweep.stdlib_package.masked_lm_prob{v}")
        assert sweep.deps == (f"finetune.stdlib_package.s1.masked_lm_prob{v}",
                              f"finetune.stdlib_package.s2.masked_lm_prob{v}")
        assert sweep.inputs["finetune_dirs"]["s2"] == plan.stage(sweep.deps[1]).output_dir
        assert plan.stage(f"export.masked_lm_prob{v}").inputs["sweep_dir"] == sweep.output_dir
    assert len([i for i in ids if i.startswith("finetune.")]) == 4


def test_until_and_only_take_a_point(quickstart):
    plan = quickstart(MLM)
    new = {s.id: StageState(CREATE, "new") for s in plan.stages}
    chosen = select(plan, new, until=["pretrain.masked_lm_prob0.2"])
    assert {sid for sid, st in chosen.items() if st.action != SKIP} == {
        "corpus", "vocab", "preprocess.pretrain.masked_lm_prob0.2", "pretrain.masked_lm_prob0.2"}
    done = {sid: StageState(REUSE, "done") for sid in new}
    chosen = select(plan, {**done, "evaluate.masked_lm_prob0.2": StageState(CREATE, "new")},
                    only=["evaluate.masked_lm_prob0.2"])
    assert {sid for sid, st in chosen.items() if st.action == CREATE} == {
        "evaluate.masked_lm_prob0.2"}
    with pytest.raises(Exception, match="did you mean 'pretrain.masked_lm_prob0.2'"):
        select(plan, new, only=["pretrain.masked_lm_prob0.3"])


@pytest.mark.parametrize("ablation, message", [
    ("{'MASKED_LM_PROBB': [0.15, 0.2]}", "no macro MASKED_LM_PROBB is defined"),
    ("{'MASKED_LM_PROB': 0.2}", "must be a non-empty list of values, got 0.2"),
    ("{'MASKED_LM_PROB': []}", "must be a non-empty list of values, got []"),
    ("{'MASKED_LM_PROB': [0.2, 0.2]}", "lists 0.2 more than once"),
    ("{'MASKED_LM_PROB': [0.2]}", "has one point (masked_lm_prob0.2): nothing to compare"),
    ("{}", "must be a non-empty dict"),
    ("{'train.learning_rat': [1e-3, 1e-4]}", "train has no parameter 'learning_rat'"),
    ("{'trian.learning_rate': [1e-3, 1e-4]}", "there is no configurable 'trian'"),
    ("{'experiment.accelerator': ['cpu', 'cpu_2']}",
     "experiment settings apply to the whole plan"),
    ("{'OUTPUT_ROOT': ['a', 'b']}", "changes the experiment's output root"),
])
def test_mistakes_are_one_error_at_the_binding(write, ablation, message):
    path = write("e.gin", f"include 'quickstart.gin'\nexperiment.ablation = {ablation}\n")
    text = errors_of(path)
    assert message in text, text
    assert "e.gin:2" in text and text.count("error:") == 1 and "hint:" in text


def test_a_key_that_changes_nothing_is_a_warning(quickstart):
    # The preprocess runner is how the records are made, not what they are: not fingerprinted.
    runner = "'bert_pretraining_task.runner': ['local', 'beam']"
    plan = quickstart(f"experiment.ablation = {{'MASKED_LM_PROB': [0.15, 0.2], {runner}}}")
    assert any("experiment.ablation['bert_pretraining_task.runner'] changes no stage of the "
               "plan; it changes only how preprocess.pretrain runs" in w for w in plan.warnings)
    assert not any("runner" in s.id for s in plan.stages)
    assert len(plan.stages) == 12
    plan = quickstart(f"experiment.ablation = {{{runner}}}")
    assert any("experiment.ablation changes no stage of the plan" in w for w in plan.warnings)
    assert [s.id for s in plan.stages] == [s.id for s in quickstart().stages]


def test_the_operative_config_replays_every_point(quickstart, tmp_path):
    plan = quickstart(MLM)
    replay = tmp_path / "operative_config.gin"
    replay.write_text(plan.operative_config)
    again = compile_experiment([str(replay)]).plan
    assert [(s.id, s.fingerprint) for s in again.stages] == [
        (s.id, s.fingerprint) for s in plan.stages]


def test_the_command_refuses_a_bad_ablation_without_a_traceback(tmp_path):
    from tests.support.cli import output, run_cli

    proc = run_cli("--dry_run", gin_file="quickstart.gin", root=str(tmp_path / "out"),
                   params=["experiment.ablation = {'MASKED_LM_PROB': [0.2, 0.2]}"], cwd=REPO)
    assert proc.returncode == 1, output(proc)
    assert "--gin_param" in proc.stderr and "lists 0.2 more than once" in proc.stderr
    assert "Traceback" not in proc.stderr
