"""The plan: layering and overrides, provenance, fingerprints that rebuild exactly what changed."""

import json

from runexp.compiler.plan import Plan
from runexp.compiler.planner import compile_experiment


def fingerprints(path, params=()):
    plan = compile_experiment([path], list(params)).plan
    return {s.id: s.fingerprint for s in plan.stages}


def test_quickstart_compiles_into_the_whole_pipeline():
    plan = compile_experiment(["quickstart.gin"]).plan
    assert [s.id for s in plan.stages] == [
        "corpus", "vocab", "preprocess.pretrain", "pretrain", "evaluate",
        "finetune.stdlib_package", "export"]
    assert plan.stage("vocab").deps == ("corpus",)
    assert plan.stage("pretrain").params["model"]["vocab_size"] == 8000
    assert plan.stage("preprocess.pretrain").inputs["train_files"][0].endswith("corpus/train.txt")


def test_later_files_and_gin_params_override_earlier_ones(write, minimal):
    override = write("override.gin", "TRAIN_STEPS = 30\nBATCH_SIZE = 16\n")
    plan = compile_experiment([minimal, override], ["BATCH_SIZE=4"]).plan
    params = plan.stage("pretrain").params
    assert params["train_steps"] == 30
    assert params["batch_size"] == 4
    assert plan.stage("pretrain").provenance["batch_size"] == "--gin_param[1]:1"


def test_scoped_binding_beats_the_unscoped_default(write, minimal):
    path = write("e.gin", f"include '{minimal}'\npretrain/bert_pretraining_task.dupe_factor = 2\n"
                          "bert_pretraining_task.dupe_factor = 7\n")
    plan = compile_experiment([path]).plan
    assert plan.stage("preprocess.pretrain").params["dupe_factor"] == 2


def test_explain_gives_the_chain_with_what_was_overridden(write, minimal):
    compiled = compile_experiment([minimal], ["TRAIN_STEPS=99"])
    text = compiled.resolver.provenance("train", "steps").explain()
    assert text.splitlines()[0] == "train.steps = 99"
    assert "train.steps = %TRAIN_STEPS  @ gin/runs/pretrain.gin:" in text
    assert "TRAIN_STEPS = 99  @ --gin_param[1]:1" in text
    assert "overrides 20 @ " in text and "exp.gin:9" in text
    assert "overrides 100000 @ gin/runs/pretrain.gin:" in text


def test_changing_masking_rebuilds_preprocess_and_everything_after_it(minimal):
    before = fingerprints(minimal)
    after = fingerprints(minimal, ["MASKED_LM_PROB=0.2"])
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"preprocess.pretrain", "pretrain", "evaluate", "export"}


def test_changing_evaluation_settings_rebuilds_only_evaluation(minimal):
    before = fingerprints(minimal)
    after = fingerprints(minimal, ["evaluate.batch_size=7"])
    assert {k for k in before if before[k] != after[k]} == {"evaluate"}


def test_changing_corpus_content_rebuilds_from_the_vocab_on(write, minimal):
    before = fingerprints(minimal)
    with open(write.corpus, "a") as f:
        f.write("\nA new document.\n")
    after = fingerprints(minimal)
    assert {k for k in before if before[k] != after[k]} == {
        "vocab", "preprocess.pretrain", "pretrain", "evaluate", "export"}


def test_more_train_steps_keeps_the_resume_key(minimal):
    a = compile_experiment([minimal]).plan.stage("pretrain")
    b = compile_experiment([minimal], ["TRAIN_STEPS=40"]).plan.stage("pretrain")
    c = compile_experiment([minimal], ["LEARNING_RATE=0.5"]).plan.stage("pretrain")
    assert a.fingerprint != b.fingerprint and a.resume_key == b.resume_key
    assert a.resume_key != c.resume_key


def test_plan_round_trips_through_json(minimal):
    plan = compile_experiment([minimal]).plan
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert json.loads(plan.to_json())["version"] == 1


def test_warnings_are_kept_in_the_plan(write, minimal):
    path = write("e.gin", f"include '{minimal}'\nHELDOUT_FILES = '{write.corpus}'\n")
    plan = compile_experiment([path]).plan
    assert any("the held-out files are the training files" in w for w in plan.warnings)


def test_plan_shows_the_wall_time_budget_margin_and_expected_last_step(minimal):
    from runexp.compiler.render import render_plan
    from runexp.compiler.state import plan_states

    plan = compile_experiment([minimal], ["experiment.wall_time_hours=0.5",
                                          "TRAIN_STEPS=100000000"]).plan
    text = render_plan(plan, plan_states(plan))
    assert "wall-time budget: 0.5 h, of which 0.5 min kept free (auto, for the budget" in text
    assert "expected last step of a fresh run: " in text and "(a later run continues)" in text
    # The later sessions, each after a restart (compiler/wall_time.py).
    import re

    sessions = re.search(r"sessions of 0.5 h to the end: (\d+) \((\d+) restarts?, ([\d.]+) min "
                         r"each: save at the stop \d+ s, start-up \d+ s, compile \d+ s, "
                         r"restore \d+ s, data position \d+ s\)", text)
    assert sessions, text
    assert int(sessions.group(1)) == int(sessions.group(2)) + 1 > 2
    plan = compile_experiment([minimal], ["experiment.wall_time_hours=0.5",
                                          "experiment.wall_time_margin_minutes=5"]).plan
    text = render_plan(plan, plan_states(plan))
    assert "of which 5.0 min kept free (experiment.wall_time_margin_minutes)" in text
    assert "expected last step of a fresh run: 20 of 20\n" in text
