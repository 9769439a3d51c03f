"""Pretraining in phases (train.phases): the stages, their inputs, fingerprints and checks."""

import json

import pytest

from runexp.compiler.cli import main
from runexp.compiler.errors import UserError
from runexp.compiler.plan import Plan
from runexp.compiler.planner import compile_experiment
from runexp.compiler.render import render_plan
from runexp.compiler.state import CREATE, StageState

TWO_PHASES = ("train.phases = [{'max_seq_length': 32, 'max_predictions_per_seq': 5, "
              "'steps': 30}, {'max_seq_length': 64, 'max_predictions_per_seq': 10, "
              "'steps': 10, 'batch_size': 4}]")


def _phased(write, minimal, phases=TWO_PHASES, extra="", name="phased.gin"):
    return write(name, f"include '{minimal}'\n{extra}{phases}\n")


def _plan(path, params=()):
    return compile_experiment([path], list(params)).plan


def test_without_phases_or_with_one_the_plan_is_the_single_phase_one(write, minimal):
    single = _plan(minimal)
    for phases in ("train.phases = None", "train.phases = []", "train.phases = [{}]"):
        plan = _plan(_phased(write, minimal, phases))
        assert [s.to_dict() for s in plan.stages] == [s.to_dict() for s in single.stages]
    # One phase that sets values: the plan of the same values set the usual way.
    one = _plan(_phased(write, minimal, "train.phases = [{'steps': 33, 'max_seq_length': 48}]"))
    usual = _plan(minimal, ["TRAIN_STEPS=33", "MAX_SEQ_LENGTH=48"])
    assert [s.id for s in one.stages] == [s.id for s in single.stages]
    assert {s.id: s.fingerprint for s in one.stages} == {s.id: s.fingerprint
                                                         for s in usual.stages}


def test_two_phases_make_a_preprocess_and_a_pretrain_stage_each(write, minimal):
    plan = _plan(_phased(write, minimal))
    assert [s.id for s in plan.stages] == [
        "vocab", "preprocess.pretrain", "preprocess.pretrain.phase2", "pretrain",
        "pretrain.phase2", "evaluate", "export"]
    pre1, pre2 = plan.stage("preprocess.pretrain"), plan.stage("preprocess.pretrain.phase2")
    one, two = plan.stage("pretrain"), plan.stage("pretrain.phase2")

    # Phase 1 reads the corpus and keeps its tokenised splits; phase 2 reads only those.
    assert pre1.params["keep_split_index"] is True
    assert "keep_split_index" not in pre2.params
    assert set(pre1.inputs) == {"train_files", "validation_files", "vocab_dir"}
    assert pre2.inputs == {"split_index_dir": f"{pre1.output_dir}/split_index",
                           "vocab_dir": plan.stage("vocab").output_dir}
    assert pre2.deps == ("preprocess.pretrain", "vocab")
    assert (pre1.params["max_seq_length"], pre1.params["max_predictions_per_seq"]) == (32, 5)
    assert (pre2.params["max_seq_length"], pre2.params["max_predictions_per_seq"]) == (64, 10)
    assert pre2.params["num_shards"] == pre1.params["num_shards"]
    assert pre2.provenance["max_seq_length"].startswith("train.phases, phase 2 @ ")
    assert pre2.provenance["max_seq_length"].endswith("phased.gin:2")

    # Phase 2 trains on its own examples from phase 1's final weights.
    assert one.inputs["data_dir"] == pre1.output_dir and "previous_phase_dir" not in one.inputs
    assert two.inputs["data_dir"] == pre2.output_dir
    assert two.inputs["previous_phase_dir"] == one.output_dir
    assert set(two.deps) == {"preprocess.pretrain.phase2", "pretrain", "vocab"}
    assert (one.params["train_steps"], one.params["batch_size"]) == (30, 8)
    assert (two.params["train_steps"], two.params["batch_size"]) == (10, 4)
    assert (two.params["max_seq_length"], two.params["max_predictions_per_seq"]) == (64, 10)
    # What a phase leaves out is the experiment's value.
    assert two.params["warmup_steps"] == one.params["warmup_steps"] == 2
    assert two.provenance["warmup_steps"] == one.provenance["warmup_steps"]
    # How a phase starts from the one before: only phases after the first; init_checkpoint:
    # only the first.
    assert two.params["optimizer_state"] == "reset" and "optimizer_state" not in one.params
    assert "init_checkpoint" in one.params and "init_checkpoint" not in two.params

    # Evaluation and export follow the last phase.
    ev, ex = plan.stage("evaluate"), plan.stage("export")
    assert ev.inputs == {"data_dir": pre2.output_dir, "checkpoint_dir": two.output_dir}
    assert ev.params["max_seq_length"] == 64
    assert ex.inputs["checkpoint_dir"] == two.output_dir and "pretrain" not in ex.deps


def test_finetune_follows_the_last_phase(write):
    tsv = write("t.tsv", "label\tsentence\npos\tgood\nneg\tbad\n")
    path = write("ft.gin", f"""
        include 'runs/pretrain_finetune.gin'
        include 'models/bert_tiny.gin'
        OUTPUT_ROOT = '{write.dir}/out'
        CORPUS_FILES = '{write.corpus}'
        FINETUNE_TASK = 'sst'
        sst/classification_task.train_file = '{tsv}'
        sst/classification_task.dev_file = '{tsv}'
        {TWO_PHASES}
        """)
    plan = _plan(path)
    ft = plan.stage("finetune.sst")
    assert ft.inputs["checkpoint_dir"] == plan.stage("pretrain.phase2").output_dir
    assert "pretrain.phase2" in ft.deps and "pretrain" not in ft.deps
    # No held-out files: no evaluate stage in any phase.
    assert [s.id for s in plan.stages if s.kind == "evaluate"] == []


def test_a_mixture_gets_a_preprocess_stage_per_task_and_phase(write):
    path = write("mix.gin", f"""
        include 'runs/pretrain.gin'
        include 'models/bert_tiny.gin'
        OUTPUT_ROOT = '{write.dir}/out'
        a/bert_pretraining_task.train_files = '{write.corpus}'
        a/bert_pretraining_task.validation_files = '{write.heldout}'
        b/bert_pretraining_task.train_files = '{write.corpus}'
        mix/bert_pretraining_mixture.rates = {{'a': 1, 'b': 2}}
        PRETRAIN_TASK = 'mix'
        {TWO_PHASES}
        """)
    plan = _plan(path)
    assert [s.id for s in plan.stages] == [
        "vocab", "preprocess.a", "preprocess.b", "preprocess.a.phase2", "preprocess.b.phase2",
        "pretrain", "pretrain.phase2", "evaluate", "export"]
    two = plan.stage("pretrain.phase2")
    assert two.inputs["data_dirs"] == {"a": plan.stage("preprocess.a.phase2").output_dir,
                                       "b": plan.stage("preprocess.b.phase2").output_dir}
    assert plan.stage("preprocess.b.phase2").inputs["split_index_dir"] == \
        plan.stage("preprocess.b").output_dir + "/split_index"
    # Only a has held-out files: evaluate reads its last phase's examples.
    assert plan.stage("evaluate").inputs["data_dirs"] == {
        "a": plan.stage("preprocess.a.phase2").output_dir}


def _changed(a, b):
    return {s.id for s in a.stages if s.fingerprint != b.stage(s.id).fingerprint}


def test_fingerprints_rebuild_a_phase_and_what_follows_it(write, minimal):
    path = _phased(write, minimal)
    base = _plan(path)

    def with_phases(first, second):
        return _plan(_phased(write, minimal, f"train.phases = [{first}, {second}]",
                             name="other.gin"))

    p1 = "{'max_seq_length': 32, 'max_predictions_per_seq': 5, 'steps': 30}"
    p2 = "{'max_seq_length': 64, 'max_predictions_per_seq': 10, 'steps': 10, 'batch_size': 4}"
    assert _changed(base, with_phases(p1, p2)) == set()

    # More steps in phase 2 continue it (same resume key); nothing before it changes.
    longer = with_phases(p1, p2.replace("'steps': 10", "'steps': 20"))
    assert _changed(base, longer) == {"pretrain.phase2", "evaluate", "export"}
    assert longer.stage("pretrain.phase2").resume_key == base.stage("pretrain.phase2").resume_key

    # Another learning rate in phase 2: phase 2 starts over.
    faster = with_phases(p1, p2.replace("}", ", 'learning_rate': 0.001}"))
    assert _changed(base, faster) == {"pretrain.phase2", "evaluate", "export"}
    assert faster.stage("pretrain.phase2").resume_key != \
        base.stage("pretrain.phase2").resume_key

    # Phase 2's length: its examples, its training; phase 1 and its tokens stay.
    longer_seq = with_phases(p1, p2.replace("'max_seq_length': 64", "'max_seq_length': 48"))
    assert _changed(base, longer_seq) == {"preprocess.pretrain.phase2", "pretrain.phase2",
                                          "evaluate", "export"}

    # More steps in phase 1 continue phase 1 but retrain phase 2 from its new end.
    more = with_phases(p1.replace("'steps': 30", "'steps': 40"), p2)
    assert _changed(base, more) == {"pretrain", "pretrain.phase2", "evaluate", "export"}
    assert more.stage("pretrain").resume_key == base.stage("pretrain").resume_key
    assert more.stage("pretrain.phase2").resume_key != base.stage("pretrain.phase2").resume_key

    # The masking is every phase's: both preprocess stages change.
    masked = _plan(path, ["MASKED_LM_PROB=0.2"])
    assert _changed(base, masked) == {s.id for s in base.stages} - {"vocab"}

    # Carrying the optimizer's moments is phase 2's choice only.
    carry = _plan(path, ["train.optimizer_state='carry'"])
    assert _changed(base, carry) == {"pretrain.phase2", "evaluate", "export"}
    assert carry.stage("pretrain.phase2").params["optimizer_state"] == "carry"


def test_max_position_embeddings_is_checked_against_every_phase(write, minimal):
    path = _phased(write, minimal, extra="model.max_position_embeddings = 48\n")
    with pytest.raises(UserError) as e:
        compile_experiment([path])
    text = str(e.value)
    assert "phase 2: max_seq_length (64) exceeds the model's max_position_embeddings (48)" in text
    assert "phased.gin:3" in text  # where train.phases is written
    assert "phase 1:" not in text  # 32 fits


def test_bad_phases_are_errors_with_a_hint(write, minimal):
    cases = {
        "train.phases = [{'train_steps': 10}]": "phase 1 sets 'train_steps', which is not a "
                                                "setting a phase can change",
        "train.phases = [{}, {'steps': 0}]": "steps of phase 2 (train.phases) must be "
                                             "positive, got 0",
        "train.phases = [{}, {'learning_rate': 'high'}]": "learning_rate of phase 2 "
                                                          "(train.phases) must be a number",
        "train.phases = [{}, {'optimizer_state': 'keep'}]": "optimizer_state of phase 2 "
                                                            "(train.phases) must be one of "
                                                            "'reset', 'carry'",
        "train.phases = {'steps': 10}": "train.phases must be a list of dicts",
    }
    for phases, message in cases.items():
        with pytest.raises(UserError) as e:
            compile_experiment([_phased(write, minimal, phases)])
        assert message in str(e.value), (phases, str(e.value))
    with pytest.raises(UserError) as e:
        compile_experiment([_phased(write, minimal, "train.phases = [{'train_steps': 10}]")])
    assert "did you mean 'steps'" in str(e.value)


def test_settings_of_later_phases_in_the_first_or_in_one_phase_are_warned_about(write, minimal):
    plan = _plan(_phased(write, minimal, "train.phases = [{'optimizer_state': 'carry'}, {}]"))
    assert any("phase 1 sets 'optimizer_state'" in w for w in plan.warnings)
    assert "optimizer_state" not in plan.stage("pretrain").params
    plan = _plan(minimal, ["train.optimizer_state='carry'"])
    assert any("train.optimizer_state applies to pretraining phases after the first" in w
               for w in plan.warnings)
    assert "optimizer_state" not in plan.stage("pretrain").params


def test_a_format_with_ready_made_examples_cannot_have_phases(write):
    vocab = write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\nbad\n")
    write("my_tasks.py", "import seqio\n")
    path = write("ready.gin", f"""
        include 'runs/pretrain.gin'
        include 'models/bert_tiny.gin'
        import my_tasks
        OUTPUT_ROOT = '{write.dir}/out'
        VOCAB = '{vocab}'
        pretrain/bert_pretraining_task.format = 'seqio_bert_features'
        pretrain/bert_pretraining_task.seqio_task = 'my_examples'
        {TWO_PHASES}
        """)
    with pytest.raises(UserError) as e:
        compile_experiment([path])
    assert "format 'seqio_bert_features' brings ready-made examples of one length, but " \
           "train.phases trains at several" in str(e.value)


def test_the_dry_run_estimates_each_phase_and_their_sum(write, minimal):
    plan = _plan(_phased(write, minimal))
    text = render_plan(plan, {s.id: StageState(CREATE, "not built yet") for s in plan.stages})
    assert "Estimates for pretrain (see" in text and "Estimates for pretrain.phase2 (see" in text
    total = text.split("Estimates for pretraining, every phase:")[1]
    # 30 steps x 8 x 32 tokens + 10 steps x 4 x 64 tokens
    assert f"tokens: {30 * 8 * 32 + 10 * 4 * 64:,} in 2 phases" in total
    assert "memory per replica: about" in total


def test_a_phase_that_does_not_fit_the_memory_is_an_error_at_train_phases(write, minimal):
    phases = ("train.phases = [{'max_seq_length': 128}, {'max_seq_length': 512, "
              "'max_predictions_per_seq': 80, 'batch_size': 256}]")
    path = _phased(write, minimal, phases, extra="include 'models/bert_base.gin'\n")
    with pytest.raises(UserError) as e:
        _plan(path)
    text = str(e.value)
    assert "phased.gin:3" in text and "error: pretrain.phase2 needs about" in text
    assert "phase 2's 'grad_accum_steps'" in text
    assert "error: pretrain needs" not in text
    # Gradient accumulation divides the activations: the same batch then fits.
    fits = _plan(_phased(write, minimal, phases.replace("'batch_size': 256}",
                                                        "'batch_size': 256, "
                                                        "'grad_accum_steps': 16}"),
                         extra="include 'models/bert_base.gin'\n", name="fits.gin"))
    assert not any("needs about" in w for w in fits.warnings)


def test_a_saved_phased_plan_round_trips_and_runs_as_is(write, minimal, capsys):
    path = _phased(write, minimal)
    plan = _plan(path)
    assert Plan.from_json(plan.to_json()) == plan
    saved = f"{write.dir}/plan.json"
    assert main([f"--gin_file={path}", "--dry_run", f"--plan_out={saved}"]) == 2
    assert main([f"--plan_file={saved}", "--dry_run"]) == 2
    assert capsys.readouterr().out.count("Plan: 7 to create.") == 2
    assert main([f"--plan_file={saved}", "--dry_run", "--plan_format=json"]) == 2
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["estimates"]) == {"pretrain", "pretrain.phase2"}
    assert main([f"--gin_file={path}", "--explain=train.phases"]) == 0
    assert "phased.gin:2" in capsys.readouterr().out


def test_phases_without_pretraining_are_warned_about(write):
    vocab = write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\nbad\n")
    tsv = write("t.tsv", "label\tsentence\npos\tgood\nneg\tbad\n")
    from tests.support.checkpoint_files import bert_variables, write_index

    release = f"{write.dir}/uncased_L-2_H-128_A-2"
    import os
    os.makedirs(release)
    write_index(f"{release}/bert_model.ckpt", bert_variables(2, 128, 512, vocab=7))
    path = write("ft.gin", f"""
        include 'runs/finetune.gin'
        include 'models/bert_tiny.gin'
        OUTPUT_ROOT = '{write.dir}/out'
        VOCAB = '{vocab}'
        INIT_CHECKPOINT = '{release}/bert_model.ckpt'
        FINETUNE_TASK = 'sst'
        sst/classification_task.train_file = '{tsv}'
        sst/classification_task.dev_file = '{tsv}'
        {TWO_PHASES}
        """)
    plan = _plan(path)
    assert [s.kind for s in plan.stages] == ["vocab", "finetune", "export"]
    assert any("train.phases is set, but this experiment does not pretrain" in w
               for w in plan.warnings)
