"""A downstream suite: GLUE's tasks by name over a local GLUE directory in its published
layout, one finetune stage each on one encoder, then the suite stage; and the mistakes
caught before anything runs."""

import csv
import os

import pytest

from tests.support.checkpoint_files import bert_variables, write_index
from tests.support.glue_files import DIRECTORIES, write_glue_dir
from runexp.compiler.glue_tasks import GLUE_TASKS
from runexp.compiler.planner import compile_experiment
from runexp.compiler.formats.classification_files import load_examples
from tests.support.cli import errors_of

# Where google-research/bert's processors (and Hugging Face's port) read each task's
# texts and label, with csv.reader(delimiter="\t", quotechar=None), skipping the header.
GOOGLE_INDICES = {"mnli": (8, 9, -1), "qqp": (3, 4, 5), "qnli": (1, 2, -1), "rte": (1, 2, -1),
                  "mrpc": (3, 4, 0), "sst2": (0, None, 1), "cola": (3, None, 1),
                  "stsb": (7, 8, -1)}


@pytest.fixture
def glue(tmp_path):
    return write_glue_dir(tmp_path / "glue")


@pytest.fixture
def release(write):
    d = "google/uncased_L-2_H-128_A-2"
    write(f"{d}/vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ngood\nbad\n")
    write_index(f"{write.dir}/{d}/bert_model.ckpt", bert_variables(2, 128, 512, vocab=8))
    return f"{write.dir}/{d}"


def _suite(write, release, glue, suite="['mnli', 'qqp', 'cola', 'stsb']", extra=""):
    return write("e.gin", f"""include 'runs/finetune.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{write.dir}/out'
VOCAB = '{release}/vocab.txt'
INIT_CHECKPOINT = '{release}/bert_model.ckpt'
GLUE_DIR = '{glue}'
FINETUNE_SUITE = {suite}
""" + extra)


@pytest.mark.parametrize("task", sorted(GLUE_TASKS))
def test_each_task_reads_the_columns_google_research_bert_reads(task, glue):
    spec = GLUE_TASKS[task]
    a, b, label = GOOGLE_INDICES[task]
    for name in spec.files.values():
        path = os.path.join(glue, DIRECTORIES[task], name)
        with open(path, encoding="utf-8-sig") as f:  # BERT's port strips MRPC's BOM
            lines = list(csv.reader(f, delimiter="\t", quotechar=None))
        lines = lines if spec.columns else lines[1:]  # CoLA has no header
        expected = [((row[a],) if b is None else (row[a], row[b]), row[label]) for row in lines]
        ours = load_examples(path, spec.text_fields, spec.label_field, columns=spec.columns,
                             numeric_labels=spec.kind == "regression")
        assert ours == expected and len(ours) >= 24
        if spec.labels:
            assert {lab for _, lab in ours} <= set(spec.labels)


def test_labels_are_in_google_research_berts_order():
    assert GLUE_TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")
    assert GLUE_TASKS["mrpc"].labels == GLUE_TASKS["cola"].labels == ("0", "1")
    assert GLUE_TASKS["rte"].labels == ("entailment", "not_entailment")
    assert GLUE_TASKS["stsb"].labels is None and GLUE_TASKS["stsb"].kind == "regression"


def test_a_suite_is_one_finetune_per_task_then_the_suite_stage(write, release, glue):
    plan = compile_experiment([_suite(write, release, glue)]).plan
    assert [s.id for s in plan.stages] == ["vocab", "finetune.mnli", "finetune.qqp",
                                           "finetune.cola", "finetune.stsb", "suite"]
    mnli = plan.stage("finetune.mnli")
    assert mnli.inputs["train_file"] == f"{glue}/MNLI/train.tsv"
    assert mnli.inputs["dev_files"] == {"matched": f"{glue}/MNLI/dev_matched.tsv",
                                        "mismatched": f"{glue}/MNLI/dev_mismatched.tsv"}
    assert mnli.params["text_fields"] == ["sentence1", "sentence2"]
    assert mnli.params["label_field"] == "gold_label" and mnli.params["kind"] == "sentence_pair"
    assert mnli.provenance["labels"] == "GLUE's MNLI (compiler/glue_tasks.py)"
    assert plan.stage("finetune.qqp").params["metrics"] == ["f1", "accuracy"]
    cola = plan.stage("finetune.cola").params
    assert cola["columns"] == ["source", "label", "original_label", "sentence"]
    assert cola["metrics"] == ["mcc"]
    stsb = plan.stage("finetune.stsb").params
    assert stsb["kind"] == "regression" and stsb["metrics"] == ["pearson", "spearman"]
    suite = plan.stage("suite")
    assert suite.params == {"tasks": ["mnli", "qqp", "cola", "stsb"],
                            "glue_tasks": ["mnli", "qqp", "cola", "stsb"]}
    assert suite.inputs["finetune_dirs"]["cola"] == plan.stage("finetune.cola").output_dir
    assert set(suite.deps) == {"finetune.mnli", "finetune.qqp", "finetune.cola",
                               "finetune.stsb"}
    # All fine-tunes start from the one encoder; none of them is exported alone.
    assert {plan.stage(f"finetune.{t}").inputs["init_checkpoint"] for t in
            ("mnli", "qqp", "cola", "stsb")} == {f"{release}/bert_model.ckpt"}


def test_all_eight_tasks_in_the_published_layout_plan_cleanly(write, release, glue):
    plan = compile_experiment([_suite(write, release, glue, str(list(GLUE_TASKS)))]).plan
    assert [s.id for s in plan.stages][-1] == "suite"
    assert len([s for s in plan.stages if s.kind == "finetune"]) == 8


def test_a_suite_after_pretraining_shares_vocab_preprocess_and_pretrain(write, glue):
    path = write("p.gin", f"""include 'runs/pretrain_finetune.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{write.dir}/out'
CORPUS_FILES = '{write.corpus}'
VOCAB_SIZE = 100
BATCH_SIZE = 8
TRAIN_STEPS = 20
WARMUP_STEPS = 2
GLUE_DIR = '{glue}'
FINETUNE_SUITE = ['rte', 'sst2']
""")
    plan = compile_experiment([path]).plan
    ids = [s.id for s in plan.stages]
    assert ids[-4:] == ["finetune.rte", "finetune.sst2", "suite", "export"], ids
    pretrain = [s for s in plan.stages if s.kind == "pretrain"]
    assert len(pretrain) == 1
    for task in ("rte", "sst2"):
        ft = plan.stage(f"finetune.{task}")
        assert ft.inputs["checkpoint_dir"] == pretrain[0].output_dir
        assert ft.inputs["vocab_dir"] == plan.stage("vocab").output_dir
    assert "finetune_dir" not in plan.stage("export").inputs  # the encoder is exported


def test_a_missing_glue_file_is_one_error_naming_it(write, release, glue):
    os.remove(os.path.join(glue, "MNLI", "dev_mismatched.tsv"))
    text = errors_of(_suite(write, release, glue))
    assert f"e.gin:6: error: GLUE_DIR has no MNLI/dev_mismatched.tsv " \
           f"({glue}/MNLI/dev_mismatched.tsv): finetune.suite names 'mnli'" in text
    assert "hint: GLUE's MNLI is train.tsv, dev_matched.tsv, dev_mismatched.tsv in MNLI/ " \
           "under GLUE_DIR" in text
    assert text.count("error:") == 1, text


def test_a_file_in_another_layout_is_one_error_naming_the_column(write, release, glue):
    path = os.path.join(glue, "QQP", "dev.tsv")
    with open(path) as f:
        lines = f.read().split("\n")
    lines[0] = lines[0].replace("is_duplicate", "label")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    text = errors_of(_suite(write, release, glue))
    assert f"{path}: not GLUE's QQP layout: column 6 is 'label', GLUE's QQP has " \
           "'is_duplicate'" in text
    assert text.count("error:") == 1, text


def test_a_cola_row_with_a_missing_column_is_named_at_its_line(write, release, glue):
    path = os.path.join(glue, "CoLA", "dev.tsv")
    with open(path) as f:
        lines = f.read().split("\n")
    lines[2] = "\t".join(lines[2].split("\t")[:3])
    with open(path, "w") as f:
        f.write("\n".join(lines))
    text = errors_of(_suite(write, release, glue))
    assert f"{path}:3: error: 3 tab-separated fields, the declared columns are 4" in text


def test_suite_names_are_checked(write, release, glue):
    text = errors_of(_suite(write, release, glue, "['mnli', 'wnli', 'sst-2', 'mnli']"))
    assert "error: finetune.suite names 'mnli' more than once" in text
    text = errors_of(_suite(write, release, glue, "['wnli', 'sst-2']"))
    assert "error: finetune.suite names 'wnli': WNLI is left out, as the BERT paper" in text
    assert "error: finetune.suite names 'sst-2', which is neither a GLUE task nor a " \
           "registered classification_task" in text and "did you mean 'sst2'" in text


def test_glue_tasks_need_the_glue_dir(write, release, glue):
    text = errors_of(_suite(write, release, glue, extra="GLUE_DIR = None\n"))
    assert "error: finetune.suite names GLUE's MNLI ('mnli'), but glue.data_dir is not set" \
        in text
    assert "hint: set GLUE_DIR to the directory holding GLUE's task directories" in text


def test_a_suite_mixes_glue_and_registered_tasks_but_not_task_and_suite(write, release, glue):
    train = write("train.tsv", "label\tsentence\npos\tgood\nneg\tbad\n")
    mine = f"""toy/classification_task.train_file = '{train}'
toy/classification_task.dev_file = '{train}'
"""
    plan = compile_experiment([_suite(write, release, glue, "['rte', 'toy']", mine)]).plan
    assert plan.stage("suite").params == {"tasks": ["rte", "toy"], "glue_tasks": ["rte"]}
    text = errors_of(_suite(write, release, glue, "['rte']", mine + "FINETUNE_TASK = 'toy'\n"))
    assert "error: finetune.task ('toy') and finetune.suite are both set" in text
