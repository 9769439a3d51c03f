"""Fine-tune-only experiments: the plan, and the mistakes caught before anything runs."""

import json

import pytest

from runexp.compiler.planner import compile_experiment
from tests.support.checkpoint_files import bert_variables, write_index
from tests.support.cli import errors_of

TRAIN = "label\tsentence\npos\tgood\nneg\tbad\n"


@pytest.fixture
def release(write):
    """A local released-checkpoint directory named as Google names BERT-base uncased."""
    d = "google/uncased_L-12_H-768_A-12"
    write(f"{d}/vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ngood\nbad\n")
    write_index(f"{write.dir}/{d}/bert_model.ckpt", bert_variables(12, 768, 3072, vocab=8))
    write(f"{d}/bert_config.json", json.dumps({
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "vocab_size": 8, "max_position_embeddings": 512,
        "type_vocab_size": 2, "hidden_act": "gelu"}))
    return f"{write.dir}/{d}"


def _experiment(write, release, extra=""):
    train = write("train.tsv", TRAIN)
    return write("e.gin", f"""include 'runs/finetune.gin'
include 'models/bert_base.gin'
OUTPUT_ROOT = '{write.dir}/out'
VOCAB = '{release}/vocab.txt'
INIT_CHECKPOINT = '{release}/bert_model.ckpt'
FINETUNE_TASK = 'sst'
sst/classification_task.train_file = '{train}'
sst/classification_task.dev_files = {{'a': '{train}', 'b': '{train}'}}
""" + extra)


def test_finetune_only_plan_has_no_pretraining(write, release):
    plan = compile_experiment([_experiment(write, release)]).plan
    assert [s.id for s in plan.stages] == ["vocab", "finetune.sst", "export"]
    ft = plan.stage("finetune.sst")
    assert ft.inputs["init_checkpoint"] == f"{release}/bert_model.ckpt"
    assert sorted(ft.inputs["dev_files"]) == ["a", "b"]
    assert "checkpoint_dir" not in ft.inputs
    assert plan.stage("export").inputs["finetune_dir"] == ft.output_dir
    assert plan.stage("vocab").inputs["vocab_file"] == f"{release}/vocab.txt"


def test_changing_the_checkpoint_files_rebuilds_the_finetune(write, release):
    path = _experiment(write, release)
    before = compile_experiment([path]).plan
    write("google/uncased_L-12_H-768_A-12/bert_model.ckpt.data-00000-of-00001", b"other")
    after = compile_experiment([path]).plan
    assert before.stage("vocab").fingerprint == after.stage("vocab").fingerprint
    assert before.stage("finetune.sst").fingerprint != after.stage("finetune.sst").fingerprint


def test_fine_tune_only_needs_the_checkpoints_vocab(write, release):
    text = errors_of(_experiment(write, release, "VOCAB = None\n"))
    assert "e.gin:9: error: fine-tuning a released checkpoint needs its vocabulary, but " \
           "vocab.path is not set" in text
    assert "hint: set VOCAB to the vocab.txt that came with the checkpoint" in text


def test_fine_tune_only_needs_an_init_checkpoint(write, release):
    text = errors_of(_experiment(write, release, "INIT_CHECKPOINT = None\n"))
    assert "e.gin:9: error: a fine-tune without pretraining needs a checkpoint to start from" \
           in text


def test_pretraining_and_an_init_checkpoint_for_the_finetune_conflict(write, minimal):
    train = write("train.tsv", TRAIN)
    text = errors_of(write("e.gin", f"""include '{minimal}'
finetune.task = 'sst'
finetune.init_checkpoint = 'x/bert_model.ckpt'
sst/classification_task.train_file = '{train}'
sst/classification_task.dev_file = '{train}'
"""))
    assert "e.gin:3: error: finetune.init_checkpoint is set, but this experiment also " \
           "pretrains" in text


def test_casing_must_match_the_released_checkpoint(write, release):
    text = errors_of(_experiment(write, release, "DO_LOWER_CASE = False\n"))
    assert "e.gin:9: error: DO_LOWER_CASE is False but the checkpoint " \
           "uncased_L-12_H-768_A-12 was trained lower-cased" in text
    assert "hint: set DO_LOWER_CASE = True" in text


def test_model_size_must_match_the_released_checkpoint(write, release):
    text = errors_of(_experiment(write, release, "include 'models/bert_large.gin'\n"))
    assert "error: the init checkpoint does not fit the model (hidden_size: checkpoint 768, " \
           "model 1024; intermediate_size: checkpoint 3072, model 4096; " in text
    assert "hint: choose the model size of the checkpoint" in text


def test_model_must_match_the_bert_config_beside_the_checkpoint(write, release):
    text = errors_of(_experiment(write, release, "model.max_position_embeddings = 128\n"))
    assert "e.gin:5: error: the init checkpoint does not fit the model " \
           "(max_position_embeddings: checkpoint 512, model 128)" in text


def test_dev_sets_are_named_once(write, release):
    train = write("train.tsv", TRAIN)
    text = errors_of(_experiment(write, release, f"""sst/classification_task.dev_file = '{train}'
sst/classification_task.dev_files = {{'dev': '{train}', 'bad name': '{train}'}}
"""))
    assert "e.gin:10: error: sst/classification_task.dev_files: entry 'bad name'" in text
    assert "e.gin:10: error: sst: dev set 'dev' is given by both dev_file and dev_files" in text


def test_a_finetune_needs_a_dev_set(write, release):
    text = errors_of(_experiment(write, release, "sst/classification_task.dev_files = None\n"))
    assert "e.gin:7: error: sst: no dev set: set sst/classification_task.dev_file or " \
           "dev_files" in text


def test_an_experiment_must_train_something(write):
    text = errors_of(write("e.gin", f"""include 'models/bert_base.gin'
experiment.output_root = '{write.dir}/out'
"""))
    assert "e.gin: error: nothing to run: neither train.task nor finetune.task is set" in text


def test_gcs_vocab_needs_the_model_vocab_size(write):
    text = errors_of(write("e.gin", """include 'runs/finetune.gin'
include 'accelerators/tpu_v3_8.gin'
OUTPUT_ROOT = 'gs://b/out'
VOCAB = 'gs://b/cased_L-12_H-768_A-12/vocab.txt'
INIT_CHECKPOINT = 'gs://b/cased_L-12_H-768_A-12/bert_model.ckpt'
DO_LOWER_CASE = False
FINETUNE_TASK = 't'
FINETUNE_BATCH_SIZE = 12
t/classification_task.train_file = 'gs://b/train.tsv'
t/classification_task.dev_file = 'gs://b/dev.tsv'
"""))
    assert "error: the vocab on gs:// is only counted at run time, so the model's vocab_size " \
           "is unknown" in text
    assert "e.gin:8: error: fine-tune batch size 12 is not divisible by the 8 replicas of " \
           "tpu_v3_8" in text


def test_dev_labels_never_trained_on_are_one_error(write, release):
    path = _experiment(write, release)
    write("dev.tsv", "label\tsentence\nPOS\tgood\nneg\tbad\nPOS\tfine\n")
    text = errors_of(path, [
        f"sst/classification_task.dev_files = {{'a': '{write.dir}/dev.tsv'}}"])
    assert "dev.tsv: dev set 'a' has labels the model is never trained on: 'POS' (2 examples)" \
        in text
    assert "hint: the training labels are 'bad', 'good'" not in text  # labels, not texts
    assert "hint: the training labels are 'neg', 'pos'" in text


def test_a_malformed_dev_row_is_reported_at_its_line_in_the_dry_run(write, release):
    path = _experiment(write, release)
    write("dev.tsv", "label\tsentence\npos\tgood\nneg\tbad\textra\n")
    text = errors_of(path, [f"sst/classification_task.dev_files = {{'a': '{write.dir}/dev.tsv'}}"])
    assert f"{write.dir}/dev.tsv:3: error: 3 tab-separated fields, the header has 2" in text
    assert "hint: one example per line" in text


def test_a_train_file_with_one_label_is_refused(write, release):
    write("one.tsv", "label\tsentence\npos\tgood\npos\tfine\n")
    path = _experiment(write, release)
    text = errors_of(path, [f"sst/classification_task.train_file = '{write.dir}/one.tsv'"])
    assert "every example has the label 'pos': nothing to classify" in text
    assert "check label_field ('label')" in text


def test_a_regression_task_is_planned_with_its_kind_and_metrics(write, release):
    write("sts.tsv", "label\tsentence\n0.5\tgood\n4.0\tbad\n")
    path = _experiment(write, release, f"""sst/classification_task.train_file = '{write.dir}/sts.tsv'
sst/classification_task.dev_files = {{'dev': '{write.dir}/sts.tsv'}}
sst/classification_task.kind = 'regression'
""")
    ft = compile_experiment([path]).plan.stage("finetune.sst")
    assert ft.params["kind"] == "regression" and "metrics" not in ft.params
    assert "columns" not in ft.params  # unset settings stay out of the plan


def test_kind_and_metrics_mistakes_are_caught_in_the_dry_run(write, release):
    text = errors_of(_experiment(write, release, """sst/classification_task.kind = 'sentence_pair'
sst/classification_task.metrics = ['accuracy', 'pearson']
"""))
    assert "e.gin:9: error: sst: kind 'sentence_pair' takes 2 text fields, but text_fields " \
           "is ['sentence']" in text
    assert "e.gin:10: error: sst: 'pearson' cannot score a sentence_pair task" in text
    assert "hint: a sentence_pair task is scored by any of accuracy, f1, mcc" in text
    text = errors_of(_experiment(write, release, """sst/classification_task.labels = ['a', 'b', 'c']
sst/classification_task.metrics = ['f1']
"""))
    assert "error: sst: f1 scores the positive class of a binary task, but it has 3 labels" \
        in text


def test_a_regression_label_that_is_no_number_is_named_at_its_line(write, release):
    write("sts.tsv", "label\tsentence\n0.5\tgood\nhigh\tbad\n")
    text = errors_of(_experiment(write, release, f"""sst/classification_task.kind = 'regression'
sst/classification_task.train_file = '{write.dir}/sts.tsv'
"""))
    assert f"{write.dir}/sts.tsv:3: error: the label 'high' (label) is not a number" in text
    assert "hint: a regression task's labels are numbers" in text
