"""``format = 'bert_tfrecord'`` in a dry run: records that do not fit are plan errors naming
the file, what it holds and what is configured (compiler/stages/example_files.py).

The records here are written by runexp's own encoder (tasks/cache/records.py; byte-compatible with
google-research/bert's, tests/tasks/test_example_sources.py checks), so these tests need no
TensorFlow, as the compiler does not.
"""

import os
import subprocess
import sys

import pytest

from runexp.compiler.planner import compile_experiment
from runexp.tasks.cache import records
from runexp.tasks.cache.example_proto import encode_example
from tests.support.cli import errors_of

SEQ, PREDS = 64, 10


def example(seq=SEQ, preds=PREDS, top_id=20, drop=(), int_weights=False):
    features = {
        "input_ids": [2] + [top_id] * (seq - 2) + [3], "input_mask": [1] * seq,
        "segment_ids": [0] * seq, "masked_lm_positions": [1] * preds,
        "masked_lm_ids": [5] * preds, "masked_lm_weights": [1.0] * preds,
        "next_sentence_labels": [0]}
    kept = {k: v for k, v in features.items() if k not in drop}
    if int_weights:
        kept["masked_lm_weights"] = [1] * preds
        return encode_example(kept, float_features=())
    return records.encode_instance_features(kept)


def write_records(path, n=3, **kwargs):
    with records.TFRecordWriter(str(path)) as w:
        for _ in range(n):
            w.write(example(**kwargs))
    return str(path)


@pytest.fixture
def exp(write):
    """write_exp(**records kwargs, extra='gin lines') -> path of an experiment adopting two
    record files made with those kwargs."""
    vocab = write("vocab.txt", "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                         + [f"w{i}" for i in range(95)]) + "\n")

    def write_exp(extra="", files=2, **kwargs):
        os.makedirs(os.path.join(write.dir, "records"), exist_ok=True)
        for i in range(files):
            write_records(os.path.join(write.dir, "records", f"part-{i}.tfrecord"), **kwargs)
        write_exp.records = os.path.join(write.dir, "records", "part-0.tfrecord")
        return write("exp.gin", f"""
            include 'runs/pretrain.gin'
            include 'models/bert_tiny.gin'
            OUTPUT_ROOT = '{write.dir}/out'
            CORPUS_FILES = '{write.dir}/records/*.tfrecord'
            VOCAB = '{vocab}'
            MAX_SEQ_LENGTH = {SEQ}
            MAX_PREDICTIONS_PER_SEQ = {PREDS}
            BATCH_SIZE = 8
            TRAIN_STEPS = 20
            WARMUP_STEPS = 2
            CHECKPOINT_EVERY = 10
            pretrain/bert_pretraining_task.format = 'bert_tfrecord'
            """ + extra)
    return write_exp


def test_fitting_records_are_planned_as_the_tasks_cache(exp, write):
    plan = compile_experiment([exp()]).plan
    pre = plan.stage("preprocess.pretrain")
    assert pre.params["format"] == "bert_tfrecord"
    assert pre.inputs["train_files"] == [os.path.join(write.dir, "records", "*.tfrecord")]
    assert pre.params["num_shards"] == 4
    assert "MB of records" in pre.provenance["num_shards"]
    before = pre.fingerprint
    write_records(exp.records, n=4)  # another record: the cache is made again
    assert compile_experiment([write.dir + "/exp.gin"]).plan.stage(
        "preprocess.pretrain").fingerprint != before


def test_records_of_another_max_seq_length_name_the_file_and_both_lengths(exp):
    path = exp(seq=128)
    text = errors_of(path)
    assert f"{exp.records} (and 1 more file): holds examples that do not fit: input_ids has " \
           f"128 values, expected {SEQ} (max_seq_length = {SEQ})" in text
    assert "exp.gin:7" in text  # where MAX_SEQ_LENGTH is set
    assert "--max_seq_length=128: set MAX_SEQ_LENGTH = 128" in text
    assert text.count("error:") == 1


def test_records_of_another_max_predictions_per_seq(exp):
    text = errors_of(exp(preds=20), ["MAX_PREDICTIONS_PER_SEQ=10"])
    assert "masked_lm_positions has 20 values, expected 10 (max_predictions_per_seq = 10)" \
        in text


def test_a_text_file_is_not_a_tfrecord(exp, write):
    path = exp()
    text = errors_of(path, [f"CORPUS_FILES='{write.corpus}'"])
    assert f"{write.corpus}: not a TFRecord file" in text
    assert "format = 'sentence_lines'" in text


def test_a_record_without_berts_features(exp):
    text = errors_of(exp(drop=("next_sentence_labels",)))
    assert "no feature next_sentence_labels (the record has: input_ids, input_mask, " \
           "masked_lm_ids, masked_lm_positions, masked_lm_weights, segment_ids)" in text
    text = errors_of(exp(int_weights=True))
    assert "masked_lm_weights holds int64 values, expected float values" in text


def test_token_ids_past_the_vocabulary(exp):
    text = errors_of(exp(top_id=150))
    assert "holds token id 150, but the vocabulary has 100 tokens (ids 0 to 99)" in text
    assert "set VOCAB to the vocab.txt they were made with" in text


def test_no_vocabulary_is_refused(exp):
    text = errors_of(exp(), ["VOCAB=None"])
    assert "format 'bert_tfrecord' brings examples whose token ids are those of the " \
           "vocabulary they were made with, but no vocabulary is given" in text
    assert "set VOCAB to that vocab.txt" in text


def test_no_train_files_and_dynamic_masking_are_refused(exp):
    path = exp()
    text = errors_of(path, ["CORPUS_FILES=[]"])
    assert "format 'bert_tfrecord' reads TFRecord files, but " \
           "pretrain/bert_pretraining_task.train_files is not set" in text
    text = errors_of(path, ["bert_pretraining_task.dynamic_masking=True"])
    assert "brings examples already masked" in text


def test_the_dry_run_imports_neither_tensorflow_nor_numpy(exp):
    path = exp(seq=128)
    code = ("import sys\n"
            "from runexp.compiler.errors import UserError\n"
            "from runexp.compiler.planner import compile_experiment\n"
            "try:\n"
            f"    compile_experiment([{path!r}])\n"
            "except UserError as e:\n"
            "    assert 'input_ids has 128 values' in e.render()\n"
            "heavy = [m for m in ('tensorflow', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
