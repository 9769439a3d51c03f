"""Real seqio tasks: pretraining read cached (from the preprocess stage) and uncached."""

import os

import pytest

seqio = pytest.importorskip("seqio")

from runexp.compiler.plan import Plan, Stage  # noqa: E402
from runexp.runtime.context import StageContext  # noqa: E402
from runexp.runtime.stages import preprocess  # noqa: E402
from runexp.tasks.cache import seqio_tasks  # noqa: E402


def preprocess_stage(small_corpus, spm_dir, out_dir):
    return Stage(
        id="preprocess.small_mlm", kind="preprocess", output_dir=out_dir,
        params=dict(task="runexp_test_small_mlm", max_seq_length=64, max_predictions_per_seq=10,
                    masked_lm_prob=0.15, dupe_factor=1, short_seq_prob=0.1,
                    random_next_prob=0.5, mask_token_prob=0.8, random_token_prob=0.1,
                    whole_word_masking=False, pair_objective="nsp", random_seed=5,
                    do_lower_case=True, num_shards=2, num_workers=1),
        inputs=dict(train_files=[os.path.join(small_corpus, "train.txt")],
                    validation_files=[os.path.join(small_corpus, "heldout.txt")],
                    vocab_dir=spm_dir))


def test_pretraining_task_cached_equals_uncached(small_corpus, spm_dir, tmp_path):
    stage = preprocess_stage(small_corpus, spm_dir, str(tmp_path))
    preprocess.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(tmp_path),
                                progress=lambda m: None))
    seqio_tasks.register_pretraining_task_from_stage(stage)
    seqio_tasks.register_pretraining_task_from_stage(stage)  # again: replaces, no error
    task = seqio.get_mixture_or_task("runexp_test_small_mlm")
    kwargs = dict(split="validation", sequence_length=None, shuffle=False)
    cached = list(task.get_dataset(use_cached=True, **kwargs).as_numpy_iterator())
    uncached = list(task.get_dataset(use_cached=False, **kwargs).as_numpy_iterator())
    assert len(cached) == task.get_cached_stats("validation")["examples"] > 10
    # Same examples; seqio interleaves the cached shard files, so compare as multisets.
    def canonical(examples):
        return sorted(tuple((k, v.dtype.name, tuple(v.tolist())) for k, v in sorted(e.items()))
                      for e in examples)
    assert canonical(cached) == canonical(uncached)
    assert set(cached[0]) == set(task.output_features)
    assert cached[0]["input_ids"].shape == (64,) and cached[0]["input_ids"][0] == 2
    assert cached[0]["masked_lm_weights"].dtype.name == "float32"


def test_classification_task(corpus_dir, spm_dir):
    seqio_tasks.register_classification_task(
        "runexp_test_cls", os.path.join(corpus_dir, "finetune_train.tsv"),
        os.path.join(corpus_dir, "finetune_dev.tsv"), ["sentence"], "label", None, spm_dir, 32)
    task = seqio.get_mixture_or_task("runexp_test_cls")
    examples = list(task.get_dataset(split="validation", sequence_length=None,
                                     shuffle=False).as_numpy_iterator())
    assert len(examples) > 300
    assert examples[0]["input_ids"].shape == (32,) and examples[0]["input_ids"][0] == 2
    assert {int(e["label_ids"]) for e in examples} == set(range(6))


def run_preprocess(stage, tmp_path):
    preprocess.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), stage.output_dir,
                                progress=lambda m: None))


def canonical(examples):
    return sorted(tuple((k, v.dtype.name, tuple(v.tolist())) for k, v in sorted(e.items()))
                  for e in examples)


def _unmasked(example):
    """The example's input_ids with its masked positions restored, and no masks."""
    ids = example["input_ids"].copy()
    chosen = example["masked_lm_weights"] > 0
    ids[example["masked_lm_positions"][chosen]] = example["masked_lm_ids"][chosen]
    return {"input_ids": ids, "segment_ids": example["segment_ids"]}


def test_dynamically_masked_task_masks_its_train_split_after_the_cache(small_corpus, spm_dir,
                                                                       tmp_path):
    stage = preprocess_stage(small_corpus, spm_dir, str(tmp_path))
    stage = Stage(id=stage.id, kind="preprocess", output_dir=stage.output_dir,
                  params=dict(stage.params, task="runexp_test_dynamic", dynamic_masking=True,
                              whole_word_masking=True),
                  inputs=dict(stage.inputs, train_files=[os.path.join(small_corpus,
                                                                      "heldout.txt")]))
    run_preprocess(stage, tmp_path)
    task = seqio_tasks.register_pretraining_task_from_stage(stage)
    kwargs = dict(split="train", sequence_length=None, shuffle=False, seed=4)
    cached = list(task.get_dataset(use_cached=True, **kwargs).as_numpy_iterator())
    again = list(task.get_dataset(use_cached=True, **kwargs).as_numpy_iterator())
    uncached = list(task.get_dataset(use_cached=False, **kwargs).as_numpy_iterator())
    # The masking preprocessor runs after the cache placeholder: masked either way, the
    # same examples underneath, the same masks for the same seed and position.
    assert len(cached) > 10 and canonical(map(_unmasked, cached)) == canonical(
        map(_unmasked, uncached))
    assert set(cached[0]) == set(task.output_features)  # word_starts used and dropped
    assert all(e["masked_lm_weights"].sum() > 0 for e in cached)
    assert canonical(cached) == canonical(again)
    other = list(task.get_dataset(use_cached=True, **dict(kwargs, seed=5)).as_numpy_iterator())
    assert canonical(map(_unmasked, other)) == canonical(map(_unmasked, cached))
    assert canonical(other) != canonical(cached)
    validation = list(task.get_dataset(use_cached=True, split="validation", sequence_length=None,
                                       shuffle=False).as_numpy_iterator())
    assert "word_starts" not in validation[0]
    assert all(e["masked_lm_weights"].sum() > 0 for e in validation)
    from runexp.tasks.cache.inspect import inspect_examples
    assert "masked at training time" in inspect_examples(stage.output_dir, spm_dir, "train", 1)
    assert "masked at training time" not in inspect_examples(stage.output_dir, spm_dir,
                                                             "validation", 1)


def test_mixture_samples_its_tasks_by_rate(small_corpus, spm_dir, tmp_path):
    stages = []
    for name, text in (("a", "train.txt"), ("b", "heldout.txt")):
        s = preprocess_stage(small_corpus, spm_dir, str(tmp_path / name))
        s = Stage(id=f"preprocess.{name}", kind="preprocess", output_dir=s.output_dir,
                  params=dict(s.params, task=f"runexp_test_mix_{name}", num_shards=1),
                  inputs=dict(s.inputs, train_files=[os.path.join(small_corpus, text)]))
        os.makedirs(s.output_dir)
        run_preprocess(s, tmp_path)
        stages.append(s)
    rates = {"runexp_test_mix_a": 0.3, "runexp_test_mix_b": 0.7}
    pretrain = Stage(id="pretrain", kind="pretrain", output_dir=str(tmp_path / "pt"),
                     params={"mixture": "runexp_test_mix", "mixture_rates": rates}, inputs={})
    names = seqio_tasks.register_pretraining_from_plan(Plan("t", str(tmp_path),
                                                            (*stages, pretrain)))
    assert names == ["runexp_test_mix_a", "runexp_test_mix_b", "runexp_test_mix"]
    members = []
    for s in stages:
        task = seqio.get_mixture_or_task(s.params["task"])
        members.append({e["input_ids"].tobytes() for e in task.get_dataset(
            split="train", sequence_length=None, use_cached=True, shuffle=False)
            .as_numpy_iterator()})
    assert not members[0] & members[1]
    mixture = seqio.get_mixture_or_task("runexp_test_mix")
    n = 3000
    ds = mixture.get_dataset(split="train", sequence_length=None, use_cached=True, shuffle=True,
                             seed=3, num_epochs=None).take(n)
    first = [e["input_ids"].tobytes() for e in ds.as_numpy_iterator()]
    again = [e["input_ids"].tobytes() for e in mixture.get_dataset(
        split="train", sequence_length=None, use_cached=True, shuffle=True, seed=3,
        num_epochs=None).take(50).as_numpy_iterator()]
    assert again == first[:50]  # deterministic for a seed
    for member, rate in zip(members, rates.values()):
        share = sum(x in member for x in first) / n
        band = 3.29 * (rate * (1 - rate) / n) ** 0.5  # binomial, 99.9%
        assert abs(share - rate) <= band, (share, rate, band)


def test_register_reads_a_finished_experiments_cache_in_a_fresh_process(small_corpus, spm_dir,
                                                                          tmp_path):
    import json
    import shutil
    import subprocess
    import sys

    from runexp.tasks.cache.inspect import decode_example, record_files
    from runexp.tasks.cache.records import iter_records

    root = tmp_path / "run"
    stage = preprocess_stage(small_corpus, spm_dir, str(root / "preprocess.small_mlm"))
    stage = Stage(id=stage.id, kind="preprocess", output_dir=stage.output_dir,
                  params=dict(stage.params, task="runexp_test_registered"),
                  inputs=stage.inputs)
    os.makedirs(stage.output_dir)
    plan = Plan("t", str(root), (stage,))
    run_preprocess(stage, tmp_path)
    (root / "plan.json").write_text(plan.to_json())
    moved = tmp_path / "moved"  # an experiment read from elsewhere than it ran
    shutil.copytree(root, moved)
    shutil.rmtree(root)
    code = (
        "import json, sys\n"
        "from runexp.tasks import register\n"
        "names = register(sys.argv[1])\n"
        "import seqio\n"
        "task = seqio.get_mixture_or_task('runexp_test_registered')\n"
        "ds = task.get_dataset(split='validation', sequence_length=None, use_cached=True,\n"
        "                      shuffle=False)\n"
        "ids = sorted(e['input_ids'].tolist() for e in ds.as_numpy_iterator())\n"
        "print(json.dumps({'names': names, 'cache_dir': task.cache_dir, 'ids': ids}))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(moved)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["names"] == ["runexp_test_registered"]
    assert got["cache_dir"] == str(moved / "preprocess.small_mlm" / "runexp_test_registered")
    records = [decode_example(r) for r in iter_records(
        record_files(str(moved / "preprocess.small_mlm"), "validation"))]
    assert got["ids"] == sorted(r["input_ids"] for r in records) and len(records) > 10
