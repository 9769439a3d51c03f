"""Ready-made examples through the `runexp` command: google-research/bert's
``create_pretraining_data.py`` output adopted with ``format = 'bert_tfrecord'`` and trained on
for a few steps, and a user's seqio task emitting BERT's features
(``format = 'seqio_bert_features'``); then, in a fresh process, ``runexp.tasks.register`` and
plain seqio give exactly the examples of the original records.
"""

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e

pytest.importorskip("bert.create_pretraining_data",
                    reason="needs bert-tensorflow==1.0.4 (google-research/bert's package)")

SEQ, PREDS = 64, 10
WORDS = ("function value attribute asynchronous event loop widget window header message "
         "field logger record handler socket thread process queue lock timer").split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."]


def write_corpus(path, docs, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for d in range(docs):
            for _ in range(5 + d % 7):
                f.write(" ".join(rng.choice(WORDS) for _ in range(3 + rng.randrange(12)))
                        + " .\n")
            f.write("\n")


def create_pretraining_data(corpus, output, vocab, seq=SEQ, preds=PREDS):
    """google-research/bert's script, run as its README says."""
    proc = subprocess.run(
        [sys.executable, "-m", "bert.create_pretraining_data", f"--input_file={corpus}",
         f"--output_file={output}", f"--vocab_file={vocab}", "--do_lower_case=True",
         f"--max_seq_length={seq}", f"--max_predictions_per_seq={preds}",
         "--masked_lm_prob=0.15", "--dupe_factor=2", "--random_seed=12345"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A directory with vocab.txt and google-research/bert's train and valid records."""
    d = tmp_path_factory.mktemp("made")
    (d / "vocab.txt").write_text("\n".join(SPECIAL + WORDS) + "\n")
    write_corpus(d / "train.txt", 60, 0)
    write_corpus(d / "valid.txt", 12, 1)
    create_pretraining_data(f"{d}/train.txt", f"{d}/train.tfrecord,{d}/train2.tfrecord",
                            f"{d}/vocab.txt")
    create_pretraining_data(f"{d}/valid.txt", f"{d}/valid.tfrecord", f"{d}/vocab.txt")
    return d


def experiment(path, root, vocab, extra):
    path.write_text(textwrap.dedent(f"""\
        include 'runs/pretrain.gin'
        include 'models/bert_tiny.gin'
        OUTPUT_ROOT = '{root}'
        VOCAB = '{vocab}'
        MAX_SEQ_LENGTH = {SEQ}
        MAX_PREDICTIONS_PER_SEQ = {PREDS}
        BATCH_SIZE = 8
        TRAIN_STEPS = 4
        WARMUP_STEPS = 1
        CHECKPOINT_EVERY = 4
        evaluate.max_examples = 64
        """) + textwrap.dedent(extra))
    return str(path)


# The examples of a task through plain seqio after runexp.tasks.register, and the original
# records parsed as google-research/bert's run_pretraining.py parses them, as sorted lists.
READ_BACK = """
import json, sys
import numpy as np
import tensorflow as tf
from runexp.tasks import register
names = register(sys.argv[1])
import seqio
seq, preds = int(sys.argv[3]), int(sys.argv[4])
spec = {k: tf.io.FixedLenFeature([seq], tf.int64) for k in ("input_ids", "input_mask",
                                                             "segment_ids")}
spec.update({k: tf.io.FixedLenFeature([preds], tf.int64)
             for k in ("masked_lm_positions", "masked_lm_ids")})
spec["masked_lm_weights"] = tf.io.FixedLenFeature([preds], tf.float32)
spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
key = lambda ex: json.dumps({k: np.asarray(ex[k]).reshape(-1).tolist() for k in sorted(spec)})
out = {"names": names}
task = seqio.get_mixture_or_task(sys.argv[2])
for split, files in json.loads(sys.argv[5]).items():
    cached = task.get_dataset(split=split, sequence_length=None, use_cached=True,
                              shuffle=False)
    original = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))
    out[split] = {"cached": sorted(map(key, cached.as_numpy_iterator())),
                  "original": sorted(map(key, original.as_numpy_iterator())),
                  "stats": task.get_cached_stats(split)["examples"]}
print(json.dumps(out))
"""


def read_back(root, task, files):
    proc = subprocess.run([sys.executable, "-c", READ_BACK, str(root), task, str(SEQ),
                           str(PREDS), json.dumps(files)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_bert_tfrecord_is_adopted_trained_on_and_read_back_through_seqio(made, tmp_path):
    root = tmp_path / "out"
    gin = experiment(tmp_path / "exp.gin", root, made / "vocab.txt", f"""\
        CORPUS_FILES = '{made}/train*.tfrecord'
        HELDOUT_FILES = '{made}/valid.tfrecord'
        pretrain/bert_pretraining_task.format = 'bert_tfrecord'
        """)
    proc = run_cli(gin_file=gin)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stage in ("preprocess.pretrain", "pretrain", "evaluate"):
        assert os.path.isfile(root / stage / "COMPLETED"), stage
    manifest = json.loads((root / "preprocess.pretrain" / "MANIFEST.json").read_text())
    metrics = json.loads((root / "evaluate" / "metrics.json").read_text())
    assert 0.0 <= metrics["mlm_accuracy"] <= 1.0

    got = read_back(root, "pretrain", {
        "train": [f"{made}/train.tfrecord", f"{made}/train2.tfrecord"],
        "validation": [f"{made}/valid.tfrecord"]})
    assert got["names"] == ["pretrain"]
    for split in ("train", "validation"):
        r = got[split]
        assert len(r["original"]) > 20
        assert r["cached"] == r["original"]  # the same examples, values and count
        assert r["stats"] == manifest["summary"][split]["instances"] == len(r["original"])

    # A second run reuses the adopted cache.
    again = run_cli("--dry_run", gin_file=gin)
    assert "to reuse" in again.stdout and "to create" not in again.stdout, again.stdout[-2000:]


def test_a_dry_run_names_records_that_do_not_fit(made, tmp_path):
    gin = experiment(tmp_path / "exp.gin", tmp_path / "out", made / "vocab.txt", f"""\
        CORPUS_FILES = '{made}/train*.tfrecord'
        pretrain/bert_pretraining_task.format = 'bert_tfrecord'
        """)
    proc = run_cli("--dry_run", gin_file=gin, params=["MAX_SEQ_LENGTH=128"])
    assert proc.returncode == 1, proc.stdout[-2000:]
    out = proc.stdout + proc.stderr
    assert f"{made}/train.tfrecord (and 1 more file): holds examples that do not fit: " \
           f"input_ids has {SEQ} values, expected 128 (max_seq_length = 128)" in out
    assert not os.path.exists(tmp_path / "out")
    text = run_cli("--dry_run", gin_file=gin, params=[f"CORPUS_FILES='{made}/train.txt'"])
    assert text.returncode == 1 and "not a TFRecord file" in text.stdout + text.stderr


USER_MODULE = """
import seqio
import tensorflow as tf

FEATURES = {{
    "input_ids": tf.io.FixedLenFeature([{seq}], tf.int64),
    "input_mask": tf.io.FixedLenFeature([{seq}], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([{seq}], tf.int64),
    "masked_lm_positions": tf.io.FixedLenFeature([{preds}], tf.int64),
    "masked_lm_ids": tf.io.FixedLenFeature([{preds}], tf.int64),
    "masked_lm_weights": tf.io.FixedLenFeature([{preds}], tf.float32),
    "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
}}

seqio.TaskRegistry.add(
    "my_bert_features",
    source=seqio.TFExampleDataSource({{"train": {train!r}, "dev": {valid!r}}},
                                     feature_description=FEATURES),
    preprocessors=[], output_features={{}})
"""


def test_seqio_bert_features_through_a_gin_import(made, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_bert_tasks.py").write_text(USER_MODULE.format(
        seq=SEQ, preds=PREDS, train=f"{made}/train*.tfrecord", valid=f"{made}/valid.tfrecord"))
    root = tmp_path / "out"
    gin = experiment(code / "exp.gin", root, made / "vocab.txt", """\
        import my_bert_tasks
        CORPUS_FILES = []
        pretrain/bert_pretraining_task.format = 'seqio_bert_features'
        pretrain/bert_pretraining_task.seqio_task = 'my_bert_features'
        pretrain/bert_pretraining_task.validation_split = 'dev'
        pretrain/bert_pretraining_task.num_shards = 2
        """)
    proc = run_cli("--until=preprocess", gin_file=gin)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = read_back(root, "pretrain", {
        "train": [f"{made}/train.tfrecord", f"{made}/train2.tfrecord"],
        "validation": [f"{made}/valid.tfrecord"]})
    for split in ("train", "validation"):
        r = got[split]
        assert len(r["original"]) > 20
        assert r["cached"] == r["original"]
        assert r["stats"] == len(r["original"])


def test_records_on_gcs_are_listed_when_planning_and_checked_when_run(made, gcs_prefix,
                                                                     tmp_path, monkeypatch):
    """gs:// records (the loopback GCS server): planned from their listing (sizes decide the
    shard count; their content is not read by the compiler), adopted through the mirror."""
    from runexp.compiler.errors import UserError
    from runexp.compiler.planner import compile_experiment
    from runexp.compiler.state import plan_states
    from runexp.runtime import storage
    from runexp.runtime.executor import run_stage
    from runexp.runtime.gcs_mirror import Mirror

    for name in ("train.tfrecord", "train2.tfrecord", "valid.tfrecord"):
        storage.write_bytes(f"{gcs_prefix}/records/{name}", (made / name).read_bytes())
    gin = experiment(tmp_path / "exp.gin", f"{gcs_prefix}/out", made / "vocab.txt", f"""\
        CORPUS_FILES = '{gcs_prefix}/records/train*.tfrecord'
        HELDOUT_FILES = '{gcs_prefix}/records/valid.tfrecord'
        pretrain/bert_pretraining_task.format = 'bert_tfrecord'
        """)
    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(tmp_path / "cache"))

    def preprocess(params=()):
        plan = compile_experiment([gin], list(params)).plan
        states = plan_states(plan)
        mirror = Mirror(plan)
        for stage_id in ("vocab", "preprocess.pretrain"):
            run_stage(plan, plan.stage(stage_id), states[stage_id], mirror)
        return plan

    plan = preprocess()
    pre = plan.stage("preprocess.pretrain")
    assert "MB of records" in pre.provenance["num_shards"]
    assert sorted(pre.input_objects[f"{gcs_prefix}/records/train*.tfrecord"]) == [
        f"{gcs_prefix}/records/train.tfrecord", f"{gcs_prefix}/records/train2.tfrecord"]
    cache = f"{gcs_prefix}/out/preprocess.pretrain/pretrain"
    assert storage.exists(f"{cache}/COMPLETED")
    stats = json.loads(storage.read_text(f"{cache}/stats.train.json"))
    local = [str(made / "train.tfrecord"), str(made / "train2.tfrecord")]
    from runexp.tasks.cache import records
    assert stats["examples"] == records.count_records(local)

    # Records of another length: the dry run cannot see them on gs://, the run refuses them.
    with pytest.raises(UserError, match=r"train\.tfrecord: record 0 does not fit: input_ids "
                                        rf"has {SEQ} values, expected 128"):
        preprocess(["MAX_SEQ_LENGTH=128"])
