"""The preprocess stage with ``packing``: packed train rows in seqio's cache, read back through
seqio and the training stream (runtime/pretraining_data.py), statically and dynamically
masked; the validation split stays unpacked."""

import json

import pytest

from runexp.compiler.packing import rows_per_step
from runexp.tasks.cache.inspect import inspect_examples
from tests.runtime.test_stage_preprocess import make_inputs, run_stage

tf = pytest.importorskip("tensorflow")
seqio = pytest.importorskip("seqio")

from runexp.runtime import pretraining_data  # noqa: E402

L, K = 32, 3


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packed")
    return tmp, make_inputs(tmp)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_packed_cache_reads_through_seqio(inputs, dynamic):
    tmp, vocab_dir = inputs
    name = f"packed_{'dynamic' if dynamic else 'static'}"
    stage_dir, summary = run_stage(tmp, name, vocab_dir, packing=True, short_seq_prob=0.6,
                                   dynamic_masking=dynamic, whole_word_masking=False)
    out = stage_dir / "t_mlm"
    info = json.loads((out / "info.train.json").read_text())["features"]
    p = info["masked_lm_ids"]["shape"][0]
    assert p == min(3 * 5, int(L * 0.15) + K) == 7
    assert info["instance_ids"] == {"shape": [L], "dtype": "int32"}
    assert info["next_sentence_labels"]["shape"] == [K]
    assert info["next_sentence_weights"] == {"shape": [K], "dtype": "float32"}
    validation = json.loads((out / "info.validation.json").read_text())["features"]
    assert "instance_ids" not in validation and validation["masked_lm_ids"]["shape"] == [5]
    stats = json.loads((out / "stats.train.json").read_text())
    packing = summary["train"]["packing"]
    assert stats["examples"] == stats["rows"] == packing["rows"]
    assert stats["instances"] == packing["instances"] == summary["train"]["instances"]
    assert 1.0 < packing["factor"] == pytest.approx(stats["instances"] / stats["rows"], 1e-3)
    assert packing["fill"] > packing["unpacked_fill"]
    assert "packing" not in summary["validation"]
    text = inspect_examples(str(stage_dir), vocab_dir, "train", 30)  # runexp inspect
    assert "instance(s)" in text and "  [1] A: " in text and "  [2] A: " in text
    factor = pretraining_data.packing_factor([str(stage_dir)])
    assert factor == stats["instances"] / stats["rows"]

    # The cache through seqio's own cached read, and the training stream by position.
    pretraining_data.register_data([str(stage_dir)])
    task = seqio.get_mixture_or_task("t_mlm")
    seen = list(task.get_dataset(split="train", sequence_length=None, use_cached=True,
                                 shuffle=False, seed=0).take(40).as_numpy_iterator())
    batch = next(iter(pretraining_data.pretraining_dataset(
        str(stage_dir), "train", batch_size=8, max_seq_length=L, max_predictions_per_seq=p,
        seed=1)))
    held = next(iter(pretraining_data.pretraining_dataset(
        str(stage_dir), "validation", batch_size=4, max_seq_length=L, max_predictions_per_seq=5,
        training=False)))
    assert "instance_ids" not in held and held["next_sentence_labels"].shape == (4, 1)
    for rows in (seen, [{k: v[i].numpy() for k, v in batch.items()} for i in range(8)]):
        for row in rows:
            inst = row["instance_ids"]
            n = int(row["input_mask"].sum())
            assert (inst[:n] > 0).all() and not inst[n:].any()
            slots = int(row["next_sentence_weights"].sum())
            assert inst.max() == slots and 1 <= slots <= K
            starts = row["next_sentence_positions"][:slots]
            assert (row["position_ids"][starts] == 0).all()
            m = int(row["masked_lm_weights"].sum())
            assert m > 0 and (inst[row["masked_lm_positions"][:m]] > 0).all()
    assert "word_starts" not in batch  # masked, dynamically or statically


def test_rows_per_step_keeps_instances_and_whole_micro_batches():
    assert rows_per_step(256, 2.0, 8) == 128
    assert rows_per_step(256, 1.9, 8) == 136  # 134.7 rounded to a multiple of 8
    assert rows_per_step(32, 1.2, 1) == 27
    assert rows_per_step(8, 3.0, 8) == 8  # at least one row per replica
    assert rows_per_step(256, 0.5, 8) == 256  # never more rows than instances
