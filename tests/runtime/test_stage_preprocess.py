"""The preprocess stage writes seqio's cache layout with BERT's records, in parallel."""

import json
import os

import pytest

from runexp.compiler.errors import UserError

from runexp.compiler.plan import Plan, Stage
from runexp.runtime.context import StageContext
from runexp.runtime.stages import preprocess
from runexp.tasks.vocabulary import vocab_dir as vocab_files
from runexp.tasks.sources.text_documents import sample_lines
from runexp.tasks.vocabulary.tokenizer import load_tokenizer

tf = pytest.importorskip("tensorflow")


def make_inputs(tmp_path):
    words = ("function value attribute asynchronous event loop widget window header message "
             "field logger record handler socket thread process queue lock timer").split()
    docs = []
    for d in range(24):
        sentences = [" ".join(words[(d * 7 + s * 3 + k) % len(words)] for k in range(4 + s % 9))
                     + "." for s in range(12 + d % 5)]
        docs.append("\n".join(sentences) + "\n")
    (tmp_path / "train.txt").write_text("\n".join(docs[:20]))
    (tmp_path / "valid.txt").write_text("\n".join(docs[20:]))
    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir()
    lines = sample_lines([str(tmp_path / "train.txt")], 1000, seed=0)
    vocab_files.train_sentencepiece(lines, str(vocab_dir), vocab_size=60, do_lower_case=True)
    vocab_files.write_report(str(vocab_dir), "sentencepiece", True, ["value of the window."])
    return str(vocab_dir)


def run_stage(tmp_path, name, vocab_dir, **params):
    out = tmp_path / name
    out.mkdir()
    base = dict(task="t_mlm", max_seq_length=32, max_predictions_per_seq=5, masked_lm_prob=0.15,
                dupe_factor=2, short_seq_prob=0.1, random_next_prob=0.5, mask_token_prob=0.8,
                random_token_prob=0.1, whole_word_masking=True, pair_objective="nsp",
                random_seed=3, do_lower_case=True, num_shards=3, num_workers=2)
    base.update(params)
    stage = Stage(id=name, kind="preprocess", output_dir=str(out), params=base, inputs=dict(
        train_files=[str(tmp_path / "train.txt")], validation_files=[str(tmp_path / "valid.txt")],
        vocab_dir=vocab_dir))
    summary = preprocess.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(out),
                                          progress=lambda m: None))
    return out, summary


def test_writes_cache_layout_in_parallel_deterministically(tmp_path):
    vocab_dir = make_inputs(tmp_path)
    stage_dir, summary = run_stage(tmp_path, "pre", vocab_dir)
    assert os.listdir(stage_dir) == ["t_mlm"]  # seqio's layout: <cache dir>/<task>/
    out = stage_dir / "t_mlm"
    names = sorted(os.listdir(out))
    assert names == sorted(
        [f"{s}.tfrecord-{i:05d}-of-00003" for s in ("train", "validation") for i in range(3)]
        + [f"{k}.{s}.json" for k in ("info", "stats") for s in ("train", "validation")]
        + ["COMPLETED"])
    info = json.loads((out / "info.train.json").read_text())
    assert info["num_shards"] == 3
    assert info["features"]["input_ids"] == {"shape": [32], "dtype": "int32"}
    assert info["features"]["masked_lm_weights"] == {"shape": [5], "dtype": "float32"}
    stats = json.loads((out / "stats.train.json").read_text())
    assert stats["examples"] == summary["train"]["instances"] > 50
    assert summary["train"]["documents"] == 20 and summary["validation"]["documents"] == 4
    assert summary["unk_rate"] == 0.0

    spec = {k: tf.io.FixedLenFeature([32], tf.int64) for k in
            ("input_ids", "input_mask", "segment_ids")}
    spec.update({k: tf.io.FixedLenFeature([5], tf.int64) for k in
                 ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([5], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    files = sorted(str(p) for p in out.glob("train.tfrecord-*"))
    parsed = list(tf.data.TFRecordDataset(files).map(
        lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator())
    assert len(parsed) == stats["examples"]
    assert all(p["input_ids"][0] == load_tokenizer(vocab_dir).cls_id for p in parsed)

    # One worker gives the same bytes as two: only seed and shard count decide.
    again, _ = run_stage(tmp_path, "pre_serial", vocab_dir, num_workers=1)
    for name in names:
        assert (out / name).read_bytes() == (again / "t_mlm" / name).read_bytes(), name


def test_rejects_vocab_casing_mismatch(tmp_path):
    vocab_dir = make_inputs(tmp_path)
    with pytest.raises(UserError, match="do_lower_case"):
        run_stage(tmp_path, "pre", vocab_dir, do_lower_case=False)


def test_reports_bad_input_without_failing(tmp_path):
    vocab_dir = make_inputs(tmp_path)
    with open(tmp_path / "train.txt", "ab") as f:
        f.write(b"\n\nA line with \xff bad bytes in it.\n" + b"z" * ((1 << 20) + 1) + b"\n")
    (tmp_path / "valid.txt").write_bytes(b"")
    messages = []
    out = tmp_path / "bad"
    out.mkdir()
    stage = Stage(id="bad", kind="preprocess", output_dir=str(out), params=dict(
        task="t_bad", max_seq_length=32, max_predictions_per_seq=5, masked_lm_prob=0.15,
        dupe_factor=1, random_seed=3, num_shards=2, num_workers=1), inputs=dict(
        train_files=[str(tmp_path / "train.txt")], validation_files=[str(tmp_path / "valid.txt")],
        vocab_dir=vocab_dir))
    summary = preprocess.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(out),
                                          progress=messages.append))
    bad = summary["bad_input"]
    train = str(tmp_path / "train.txt")
    assert bad["non_utf8_lines"]["count"] == 1 and bad["giant_lines"]["count"] == 1
    assert bad["non_utf8_lines"]["samples"][0].startswith(train + ":")
    assert bad["empty_files"] == {"count": 1, "samples": [str(tmp_path / "valid.txt") + ":0"]}
    assert summary["train"]["instances"] > 0 and summary["validation"]["instances"] == 0
    warnings = [m for m in messages if m.startswith("WARNING")]
    assert len(warnings) == 3 and any("giant lines" in w for w in warnings)
    stats = json.loads((out / "t_bad" / "stats.train.json").read_text())
    assert stats["bad_input"]["giant_lines"]["count"] == 1


@pytest.mark.parametrize("objective", ["sop", "none"])
def test_pair_objectives_and_ngrams_reach_the_records(tmp_path, objective):
    vocab_dir = make_inputs(tmp_path)
    out, summary = run_stage(tmp_path, "pre_" + objective, vocab_dir, pair_objective=objective,
                             ngram_max=3, whole_word_masking=False, num_workers=1)
    spec = {k: tf.io.FixedLenFeature([32], tf.int64) for k in ("input_mask", "segment_ids")}
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    files = sorted(str(p) for p in (out / "t_mlm").glob("train.tfrecord-*"))
    parsed = list(tf.data.TFRecordDataset(files).map(
        lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator())
    labels = [p["next_sentence_labels"][0] for p in parsed]
    has_b = [p["segment_ids"].sum() > 0 for p in parsed]
    if objective == "none":
        assert not any(labels) and not any(has_b)
    else:
        assert all(has_b) and 0.3 < sum(labels) / len(labels) < 0.7
    assert summary["train"]["masked"] > 0


def test_dynamic_masking_leaves_train_unmasked_and_validation_static(tmp_path):
    vocab_dir = make_inputs(tmp_path)
    static, static_summary = run_stage(tmp_path, "static", vocab_dir, num_workers=1,
                                       dupe_factor=1)
    out, summary = run_stage(tmp_path, "dynamic", vocab_dir, num_workers=1, dupe_factor=2,
                             dynamic_masking=True)
    out = out / "t_mlm"
    masking = json.loads((out / "masking.json").read_text())
    assert masking["splits"] == ["train"] and masking["whole_word_masking"] is True
    assert masking["mask_id"] == load_tokenizer(vocab_dir).mask_id
    info = json.loads((out / "info.train.json").read_text())
    assert info["features"]["word_starts"] == {"shape": [32], "dtype": "int32"}
    assert "word_starts" not in json.loads((out / "info.validation.json").read_text())["features"]
    # Validation keeps its static masks (dupe_factor 2: two passes), byte for byte as a
    # statically masked task with the same parameters writes it.
    same, _ = run_stage(tmp_path, "static2", vocab_dir, num_workers=1, dupe_factor=2)
    for i in range(3):
        name = f"validation.tfrecord-{i:05d}-of-00003"
        assert (out / name).read_bytes() == (same / "t_mlm" / name).read_bytes()
    # Train: one pass whatever dupe_factor says, no masks yet.
    assert summary["train"]["instances"] == static_summary["train"]["instances"]
    assert summary["train"]["masked"] == 0 and summary["validation"]["masked"] > 0
    spec = {"masked_lm_weights": tf.io.FixedLenFeature([5], tf.float32),
            "word_starts": tf.io.FixedLenFeature([32], tf.int64),
            "input_mask": tf.io.FixedLenFeature([32], tf.int64)}
    files = sorted(str(p) for p in out.glob("train.tfrecord-*"))
    parsed = list(tf.data.TFRecordDataset(files).map(
        lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator())
    assert not any(p["masked_lm_weights"].any() for p in parsed)
    assert all(0 < p["word_starts"].sum() < p["input_mask"].sum() for p in parsed)
