"""Ready-made BERT examples as a task's cache: google-research/bert's own records
(``bert_tfrecord``) and a user's seqio task emitting BERT's features (``seqio_bert_features``).

The records are made by google-research/bert's ``create_pretraining_data`` functions
(``create_training_instances``, ``write_instance_to_example_files``) with its
``FullTokenizer``, over a small vocab.txt written here; the seqio tasks are real ones,
registered by a module imported the way the preprocess stage imports a gin file's imports.
"""

import json
import os
import random
import sys
import textwrap

import pytest

tf = pytest.importorskip("tensorflow")
seqio = pytest.importorskip("seqio")
try:
    from bert import create_pretraining_data as bert_cpd
    from bert import tokenization as bert_tokenization
except ImportError:  # pragma: no cover - depends on the environment
    bert_cpd = None

pytestmark = pytest.mark.skipif(bert_cpd is None, reason="needs bert-tensorflow==1.0.4 "
                                "(google-research/bert's published package: the test extra)")

from runexp.compiler.formats import example_peek  # noqa: E402
from runexp.compiler.errors import UserError  # noqa: E402
from runexp.compiler.plan import Plan, Stage  # noqa: E402
from runexp.runtime.context import StageContext  # noqa: E402
from runexp.runtime.stages import preprocess  # noqa: E402
from runexp.tasks.cache import records, seqio_tasks  # noqa: E402
from runexp.tasks.vocabulary import vocab_dir as vocab_files  # noqa: E402

SEQ, PREDS = 64, 10
WORDS = ("function value attribute asynchronous event loop widget window header message "
         "field logger record handler socket thread process queue lock timer").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS


def write_corpus(path, docs, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for d in range(docs):
            for _ in range(5 + d % 7):
                f.write(" ".join(rng.choice(WORDS) for _ in range(3 + rng.randrange(12)))
                        + " .\n")
            f.write("\n")


def make_bert_records(out_dir, outputs, seq=SEQ, preds=PREDS, docs=40, seed=0, vocab=VOCAB):
    """google-research/bert's records (its own functions and tokenizer); returns the count."""
    os.makedirs(out_dir, exist_ok=True)
    vocab_file = os.path.join(out_dir, "vocab.txt")
    with open(vocab_file, "w") as f:
        f.write("\n".join(vocab) + "\n")
    corpus = os.path.join(out_dir, f"corpus{seed}.txt")
    write_corpus(corpus, docs, seed)
    bert_tokenization.FLAGS.mark_as_parsed()  # its scripts parse absl flags in main()
    tokenizer = bert_tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=True)
    instances = bert_cpd.create_training_instances([corpus], tokenizer, seq, 2, 0.1, 0.15, preds,
                                                   random.Random(12345 + seed))
    bert_cpd.write_instance_to_example_files(instances, tokenizer, seq, preds,
                                             [os.path.join(out_dir, o) for o in outputs])
    return len(instances)


def parse_all(files, seq=SEQ, preds=PREDS):
    """Every record of ``files`` parsed as google-research/bert's run_pretraining.py does."""
    spec = {k: tf.io.FixedLenFeature([seq], tf.int64)
            for k in ("input_ids", "input_mask", "segment_ids")}
    spec.update({k: tf.io.FixedLenFeature([preds], tf.int64)
                 for k in ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([preds], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    return list(tf.data.TFRecordDataset(files).map(
        lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator())


def key(example):
    """An example as a comparable tuple (values, whatever their integer width)."""
    return tuple((k, tuple(float(x) for x in example[k].reshape(-1)))
                 for k in sorted(example_peek.BERT_FEATURES))


def raw_records(files):
    return sorted(r for r in records.iter_records(files))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(dir, train files, validation file, vocab dir) of google-research/bert's records."""
    out = str(tmp_path_factory.mktemp("bert_records"))
    n_train = make_bert_records(out, ["train-0.tfrecord", "train-1.tfrecord"], seed=0)
    n_valid = make_bert_records(out, ["valid.tfrecord"], docs=12, seed=1)
    vocab_dir = os.path.join(out, "vocab")
    os.makedirs(vocab_dir)
    assert vocab_files.adopt_vocab(os.path.join(out, "vocab.txt"), vocab_dir) == "wordpiece"
    vocab_files.write_report(vocab_dir, "wordpiece", True, ["value of the window ."])
    assert n_train > 100 and n_valid > 10
    return (out, [os.path.join(out, f"train-{i}.tfrecord") for i in range(2)],
            os.path.join(out, "valid.tfrecord"), vocab_dir)


def run_stage(tmp_path, inputs, name="pre", progress=None, **params):
    out = tmp_path / name
    out.mkdir()
    base = dict(task="adopted", format="bert_tfrecord", max_seq_length=SEQ,
                max_predictions_per_seq=PREDS, do_lower_case=True, num_shards=3)
    base.update(params)
    stage = Stage(id=name, kind="preprocess", output_dir=str(out), params=base, inputs=inputs)
    summary = preprocess.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(out),
                                          progress=progress or (lambda m: None)))
    return out, summary


def read_cache(stage_dir, split):
    name = seqio_tasks.register_cached_pretraining_task(str(stage_dir))
    ds = seqio.get_mixture_or_task(name).get_dataset(split=split, sequence_length=None,
                                                     use_cached=True, shuffle=False)
    return list(ds.as_numpy_iterator())


# --- bert_tfrecord ---------------------------------------------------------------------------

def test_the_cache_holds_exactly_google_research_berts_records(made, tmp_path):
    out_dir, train, valid, vocab_dir = made
    stage_dir, summary = run_stage(tmp_path, dict(train_files=[os.path.join(out_dir, "train-*")],
                                                  validation_files=[valid], vocab_dir=vocab_dir))
    cache = stage_dir / "adopted"
    assert sorted(os.listdir(stage_dir)) == ["adopted"]  # staging gone, nothing else left
    assert sorted(os.listdir(cache)) == sorted(
        [f"{s}.tfrecord-{i:05d}-of-00003" for s in ("train", "validation") for i in range(3)]
        + [f"{k}.{s}.json" for k in ("info", "stats") for s in ("train", "validation")]
        + ["COMPLETED"])
    # Byte for byte: the cache's records are the input's, every one, once.
    assert raw_records(sorted(str(p) for p in cache.glob("train.tfrecord-*"))) == \
        raw_records(train)
    assert raw_records(sorted(str(p) for p in cache.glob("validation.tfrecord-*"))) == \
        raw_records([valid])
    for split, files in (("train", train), ("validation", [valid])):
        original = parse_all(files)
        cached = read_cache(stage_dir, split)  # through seqio, as pretraining reads it
        assert len(cached) == len(original) == summary[split]["instances"]
        assert sorted(map(key, cached)) == sorted(map(key, original))
        stats = json.loads((cache / f"stats.{split}.json").read_text())
        assert stats["examples"] == len(original)
        assert stats["input_ids_tokens"] == sum(int(e["input_mask"].sum()) for e in original)
        assert stats["masked_lm_ids_tokens"] == sum(int(e["masked_lm_weights"].sum())
                                                    for e in original)
    info = json.loads((cache / "info.train.json").read_text())
    assert info["num_shards"] == 3
    assert info["features"]["input_ids"] == {"shape": [SEQ], "dtype": "int32"}
    assert info["features"]["next_sentence_labels"] == {"shape": [1], "dtype": "int32"}
    # Shards are balanced by size, in the input's order.
    sizes = [os.path.getsize(p) for p in sorted(cache.glob("train.tfrecord-*"))]
    assert max(sizes) - min(sizes) < 3 * os.path.getsize(train[0]) / parse_count(train[0])
    first = list(records.iter_records([str(cache / "train.tfrecord-00000-of-00003")]))
    assert first == list(records.iter_records([train[0]]))[:len(first)]


def parse_count(path):
    return records.count_records([path])


def assert_nothing_cached(stage_dir):
    """An error leaves no record, no info, no COMPLETED: nothing seqio could mistake for a
    cache, and no staging directory."""
    left = sorted(str(p.relative_to(stage_dir)) for p in stage_dir.rglob("*"))
    assert left in ([], ["adopted"]), left


def test_records_of_another_length_are_one_clear_error(made, tmp_path):
    out_dir, train, _, vocab_dir = made
    with pytest.raises(UserError) as info:
        run_stage(tmp_path, dict(train_files=train, vocab_dir=vocab_dir), max_seq_length=128)
    text = info.value.render()
    assert f"{train[0]}: record 0 does not fit: input_ids has {SEQ} values, expected 128 " \
           "(max_seq_length = 128)" in text
    assert f"--max_seq_length={SEQ}" in text and "MAX_SEQ_LENGTH" in text
    assert_nothing_cached(tmp_path / "pre")


def test_fewer_predictions_than_the_records_hold_is_one_clear_error(made, tmp_path):
    _, train, _, vocab_dir = made
    with pytest.raises(UserError, match=r"masked_lm_positions has 10 values, expected 5 "
                                        r"\(max_predictions_per_seq = 5\)"):
        run_stage(tmp_path, dict(train_files=train, vocab_dir=vocab_dir),
                  max_predictions_per_seq=5)


def test_a_text_file_is_not_a_tfrecord(made, tmp_path):
    out_dir, _, _, vocab_dir = made
    corpus = os.path.join(out_dir, "corpus0.txt")
    with pytest.raises(UserError, match="not a TFRecord file") as info:
        run_stage(tmp_path, dict(train_files=[corpus], vocab_dir=vocab_dir))
    assert corpus in info.value.render()
    assert_nothing_cached(tmp_path / "pre")


def test_a_damaged_record_in_a_later_file_leaves_nothing_cached(made, tmp_path):
    _, train, _, vocab_dir = made
    damaged = tmp_path / "damaged.tfrecord"
    data = bytearray(open(train[1], "rb").read())
    data[len(data) // 2] ^= 0xFF  # a flipped byte: the record's CRC no longer matches
    damaged.write_bytes(bytes(data))
    with pytest.raises(UserError, match="damaged") as info:
        run_stage(tmp_path, dict(train_files=[train[0], str(damaged)], vocab_dir=vocab_dir))
    assert str(damaged) in info.value.render()
    assert_nothing_cached(tmp_path / "pre")


def test_token_ids_past_the_vocabulary_are_refused(made, tmp_path):
    _, train, _, _ = made
    small = tmp_path / "small_vocab"
    small.mkdir()
    (small / "vocab.txt").write_text("\n".join(VOCAB[:10]) + "\n")
    vocab_files.write_report(str(small), "wordpiece", True, ["value ."])
    with pytest.raises(UserError, match=r"holds \d+, but token ids run from 0 to 9") as info:
        run_stage(tmp_path, dict(train_files=train, vocab_dir=str(small)))
    assert "set VOCAB to the one they were made with" in info.value.render()
    assert_nothing_cached(tmp_path / "pre")


# --- the dry run's reader (compiler/formats/example_peek.py, no TensorFlow) ---------------------------

def test_the_stdlib_reader_decodes_google_research_berts_records(made):
    _, train, _, _ = made
    peeked = example_peek.read_records(train[0], 3)
    for raw, parsed in zip(peeked, parse_all([train[0]])[:3]):
        features = example_peek.parse_example(raw)
        assert sorted(features) == sorted(parsed)
        for name, (kind, values) in features.items():
            assert kind == ("float" if name == "masked_lm_weights" else "int64")
            assert values == pytest.approx(parsed[name].tolist())
        assert example_peek.check_features(features, SEQ, PREDS) == []
    # What it expects is what runexp writes and google-research/bert's training parses.
    assert {name: (kind == "float" and "float32" or kind, [length]) for name, (kind, length)
            in example_peek.expected_features(SEQ, PREDS).items()} == \
        {name: (dtype, shape) for name, (shape, dtype) in records.feature_spec(SEQ, PREDS).items()}


def test_the_stdlib_reader_reads_runexps_own_encoding_too(tmp_path):
    features = {"input_ids": [2, 300, 70000, 3], "masked_lm_weights": [1.0, 0.5],
                "next_sentence_labels": [-1]}
    path = str(tmp_path / "r.tfrecord")
    with records.TFRecordWriter(path) as w:
        w.write(records.encode_instance_features(features))
    (got,) = example_peek.read_records(path, 5)
    assert example_peek.parse_example(got) == {
        "input_ids": ("int64", [2, 300, 70000, 3]), "masked_lm_weights": ("float", [1.0, 0.5]),
        "next_sentence_labels": ("int64", [-1])}
    assert tf.train.Example.FromString(got).features.feature["input_ids"].int64_list.value \
        == [2, 300, 70000, 3]


def test_framing_errors(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("One sentence here.\nAnother one.\n")
    with pytest.raises(example_peek.FramingError, match="checksum"):
        example_peek.read_records(str(text), 1)
    path = str(tmp_path / "r.tfrecord")
    with records.TFRecordWriter(path) as w:
        w.write(records.encode_instance_features({"input_ids": [1, 2, 3]}))
    data = open(path, "rb").read()
    (tmp_path / "cut.tfrecord").write_bytes(data[:-6])
    with pytest.raises(example_peek.FramingError, match="past the end"):
        example_peek.read_records(str(tmp_path / "cut.tfrecord"), 1)
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    assert example_peek.read_records(str(tmp_path / "empty.tfrecord"), 1) == []


# --- seqio_bert_features ---------------------------------------------------------------------

MODULE = """
import functools
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


def scalar_label(ex):
    return {{**ex, "next_sentence_labels": tf.reshape(ex["next_sentence_labels"], [])}}


def ints_as_int32(ex):
    return {{k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in ex.items()}}


def weights_as_int(ex):
    return {{**ex, "masked_lm_weights": tf.cast(ex["masked_lm_weights"], tf.int32)}}


def drop_labels(ex):
    return {{k: v for k, v in ex.items() if k != "next_sentence_labels"}}


def register(name, extra=()):
    source = seqio.TFExampleDataSource(
        {{"train": {train!r}, "validation": {valid!r}}}, feature_description=FEATURES)
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, source=source,
                           preprocessors=[seqio.map_over_dataset(scalar_label),
                                          seqio.map_over_dataset(ints_as_int32), *extra],
                           output_features={{}})


register("user_bert_features")
register("user_bad_weights", [seqio.map_over_dataset(weights_as_int)])
register("user_no_labels", [seqio.map_over_dataset(drop_labels)])
"""


@pytest.fixture(scope="module")
def user_module(made, tmp_path_factory):
    """A module of the user's registering seqio tasks over google-research/bert's records,
    as a plan's gin import (compiler/user_modules.py)."""
    _, train, valid, _ = made
    root = tmp_path_factory.mktemp("user_code")
    name = "user_bert_tasks"
    (root / f"{name}.py").write_text(textwrap.dedent(MODULE.format(
        seq=SEQ, preds=PREDS, train=train, valid=valid)))
    yield [{"module": name, "sys_path": str(root), "path": str(root / f"{name}.py"),
            "gin_import": "exp.gin:3"}]
    sys.modules.pop(name, None)


def test_a_users_seqio_task_of_bert_features_is_cached_as_it_is(made, user_module, tmp_path):
    _, train, valid, vocab_dir = made
    stage_dir, summary = run_stage(
        tmp_path, dict(modules=user_module, vocab_dir=vocab_dir), format="seqio_bert_features",
        seqio_task="user_bert_features", train_split="train", validation_split="validation",
        num_shards=2)
    for split, files in (("train", train), ("validation", [valid])):
        original = parse_all(files)
        cached = read_cache(stage_dir, split)
        assert len(cached) == len(original) == summary[split]["instances"]
        assert sorted(map(key, cached)) == sorted(map(key, original))
    # Encoded as google-research/bert encodes them (the order of map entries aside).
    assert {tf.train.Example.FromString(r).SerializeToString(deterministic=True)
            for r in raw_records(sorted(str(p) for p in
                                        (stage_dir / "adopted").glob("train.tfrecord-*")))} == \
        {tf.train.Example.FromString(r).SerializeToString(deterministic=True)
         for r in raw_records(train)}


@pytest.mark.parametrize("task, expected", [
    ("user_bad_weights", "masked_lm_weights is int32, expected float32"),
    ("user_no_labels", "no feature 'next_sentence_labels'"),
])
def test_a_task_that_breaks_the_contract_is_one_clear_error(made, user_module, tmp_path, task,
                                                            expected):
    _, _, _, vocab_dir = made
    with pytest.raises(UserError) as info:
        run_stage(tmp_path, dict(modules=user_module, vocab_dir=vocab_dir),
                  format="seqio_bert_features", seqio_task=task, train_split="train")
    text = info.value.render()
    assert len(info.value.problems) == 1
    assert f"seqio task {task!r}" in text and user_module[0]["module"] in text
    assert expected in text
    assert "masked_lm_weights float32 [10]" in text  # the contract, in the hint
    assert_nothing_cached(tmp_path / "pre")
