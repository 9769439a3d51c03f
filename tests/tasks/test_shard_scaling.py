"""Preprocessing at scale: each input byte read once, shards balanced by size, statistics
that do not depend on the shard count, output that does not depend on the worker count."""

import multiprocessing
import os
import sys

import numpy as np
import pytest

from runexp.tasks.instances import pretraining_shards as ps
from runexp.compiler.shard_count import auto_num_shards
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats, cached_tokenizer,
                                             iter_shard_batches, plan_shard_jobs, run_shard_jobs,
                                             summary_fields, write_shard)
from runexp.tasks.instances.split_index import RangeJob, build_split_index, plan_ranges, tokenize_range
from runexp.tasks.instances.split_reader import local_index
from runexp.tasks.sources.text_documents import iter_documents, iter_located_documents
from runexp.tasks.sources.text_files import InputIssues


def config(**overrides):
    values = dict(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3, random_seed=3)
    values.update(overrides)
    return PretrainingConfig.of(**values)


@pytest.fixture(scope="module")
def corpus(small_corpus, tmp_path_factory):
    """The small corpus's text cut into documents of at most 8 sentences, in 7 files of
    unequal sizes, with an empty file and a file of bad input among them."""
    out = tmp_path_factory.mktemp("scaling")
    docs = []
    for doc in iter_documents([os.path.join(small_corpus, "train.txt")]):
        docs.extend("".join(line + "\n" for line in doc[i:i + 8]) for i in range(0, len(doc), 8))
    files, start = [], 0
    for k, share in enumerate((0.02, 0.3, 0.05, 0.25, 0.08, 0.2, 0.1)):
        end = len(docs) if k == 6 else start + int(share * len(docs))
        path = out / f"part{k}.txt"
        path.write_text("\n".join(docs[start:end]), encoding="utf-8")
        files.append(str(path))
        start = end
    (out / "part2b_empty.txt").write_bytes(b"")
    (out / "part4b_bad.txt").write_bytes(
        b"Valid line one.\nBroken \xff\xfe bytes in the middle.\n\n\x00\x01\x02\n\n\n"
        b"A document after blank lines.\n" + b"x" * 1_100_000 + b"\nLast line, no newline")
    return sorted(files + [str(out / "part2b_empty.txt"), str(out / "part4b_bad.txt")])


def index_of(files, vocab_dir, num_ranges, out_dir):
    os.makedirs(out_dir)
    sizes = [os.path.getsize(p) for p in files]
    jobs = [RangeJob(tuple(files), vocab_dir, out_dir, k, segments)
            for k, segments in enumerate(plan_ranges(sizes, num_ranges))]
    meta = build_split_index(jobs, [tokenize_range(j) for j in jobs],
                             cached_tokenizer(vocab_dir).vocab_size)
    dtype = np.dtype(meta["dtype"])
    return (meta, np.load(os.path.join(out_dir, "documents.npy")),
            np.fromfile(os.path.join(out_dir, "tokens.bin"), dtype),
            np.fromfile(os.path.join(out_dir, "offsets.bin"), np.int64))


def test_ranges_cut_anywhere_give_the_documents_of_one_pass(corpus, wordpiece_dir, tmp_path):
    """Byte ranges cut lines and documents anywhere; the split's index is what reading the
    files whole gives, bad input counted once with its file:line, for any range count."""
    tok = cached_tokenizer(wordpiece_dir)
    issues = InputIssues()
    docs = list(iter_located_documents(corpus, issues))
    want_tokens, want_docs = [], [0]
    for path, line, doc in docs:
        ids, counts = tok.encode_lines(doc)
        if not (counts > 0).any():
            issues.note("empty_documents", path, line)
            continue
        want_tokens.append(ids)
        want_docs.append(want_docs[-1] + int((counts > 0).sum()))
    assert issues.counts == {"non_utf8_lines": 1, "giant_lines": 1, "empty_files": 1,
                             "empty_documents": 1}
    size = sum(os.path.getsize(p) for p in corpus)
    for num_ranges in (1, 2, 3, 7, 16, 64, 200):
        meta, documents, tokens, offsets = index_of(corpus, wordpiece_dir, num_ranges,
                                                    str(tmp_path / str(num_ranges)))
        assert documents.tolist() == want_docs, num_ranges
        assert tokens.tolist() == np.concatenate(want_tokens).tolist()
        assert offsets[-1] == len(tokens) and len(offsets) == want_docs[-1] + 1
        assert meta["issues"]["counts"] == issues.counts
        got = InputIssues()
        got.counts = meta["issues"]["counts"]
        got.samples = {k: [tuple(s) for s in v] for k, v in meta["issues"]["samples"].items()}
        assert got.summary() == issues.summary(), num_ranges
        # Each byte once, but for the line straddling each cut, a few hundred bytes read
        # ahead past each range's end, and the giant line (1.1 MB) read to its end by its
        # own range while the ranges inside it look for a line start.
        giant = 1_100_001
        assert size <= meta["input_bytes_read"] <= size + giant + num_ranges * 1000, num_ranges
        assert meta["input_bytes"] == size


def run_stage_jobs(files, vocab_dir, cfg, num_shards, work_dir, workers=1):
    os.makedirs(work_dir, exist_ok=True)
    jobs = plan_shard_jobs({"train": files, "validation": files[:2]}, vocab_dir, cfg,
                           num_shards, work_dir)
    totals = {"train": ShardStats(), "validation": ShardStats()}
    per_shard = {}
    if workers == 1:
        results = list(run_shard_jobs(jobs, map))
    else:
        # As the stage: fork unless TensorFlow is loaded (then spawn).
        method = "spawn" if "tensorflow" in sys.modules else "fork"
        with multiprocessing.get_context(method).Pool(workers) as pool:
            results = list(run_shard_jobs(jobs, pool.imap_unordered))
    for split, shard, stats in results:
        totals[split].add(stats)
        per_shard[split, shard] = stats
    assert not os.path.exists(os.path.join(work_dir, ps.SPILL_DIR))  # cleaned up
    return jobs, totals, per_shard


def test_each_input_byte_is_read_once_per_split(corpus, wordpiece_dir, tmp_path):
    files = [p for p in corpus if "bad" not in p]  # no giant line
    size = sum(os.path.getsize(p) for p in files)
    assert size > 250_000
    for num_shards, slack in ((4, 0.005), (64, 0.1)):
        _, totals, _ = run_stage_jobs(files, wordpiece_dir, config(dupe_factor=1), num_shards,
                                      str(tmp_path / str(num_shards)))
        train = totals["train"]
        assert train.input_bytes == size
        # Cuts every 4.6 KB at 64 shards: each adds its straddling line and ~200 bytes of
        # read-ahead (on the benchmark's 20 MB, 64 shards read 1.0008 bytes per byte).
        assert size <= train.input_bytes_read <= (1 + slack) * size, num_shards
        fields = summary_fields(totals)
        assert fields["input_bytes"] == size + totals["validation"].input_bytes
        assert fields["input_bytes_read"] == (train.input_bytes_read
                                              + totals["validation"].input_bytes_read)
        assert 1 <= fields["read_per_input_byte"] <= 1 + slack


def test_output_is_identical_for_any_worker_count(corpus, wordpiece_dir, tmp_path):
    outputs = []
    for workers in (1, 2, 3):
        jobs, totals, _ = run_stage_jobs(corpus, wordpiece_dir, config(), 4,
                                         str(tmp_path / f"w{workers}"), workers)
        outputs.append([open(j.out_path, "rb").read() for j in jobs])
        assert totals["train"].instances > 3000
    assert outputs[0] == outputs[1] == outputs[2]
    # The sequential path (seqio's uncached source: the index built in-process, from one
    # range) writes the same bytes.
    for job, data in zip(jobs, outputs[0]):
        alone = ps.ShardJob(job.files, job.vocab_dir, job.config, job.split, job.shard,
                            job.num_shards, str(tmp_path / "alone.tfrecord"))
        write_shard(alone)
        assert open(alone.out_path, "rb").read() == data


def shard_statistics(files, vocab_dir, cfg, num_shards):
    total, per_shard, lengths, labels = ShardStats(), [], [], []
    for shard in range(num_shards):
        stats = ShardStats()
        for batch in iter_shard_batches(files, vocab_dir, cfg, "train", shard, num_shards,
                                        stats):
            lengths.append(batch["input_mask"].sum(axis=1))
            labels.append(batch["next_sentence_labels"][:, 0])
        total.add(stats)
        per_shard.append(stats)
    order = np.lexsort((np.concatenate(labels), np.concatenate(lengths)))
    return total, per_shard, np.concatenate(lengths)[order], np.concatenate(labels)[order]


def test_statistics_do_not_depend_on_the_shard_count(corpus, wordpiece_dir):
    """Every block of documents is planned with its own seed and random next segments come
    from the whole split: the instances (lengths, labels) are the same for 1, 4 or 64
    shards, only their shards, order, truncation sides and masks differ. (Before, the
    instance count moved by several percent with the shard count.)"""
    cfg = config(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=5)
    one = shard_statistics(corpus, wordpiece_dir, cfg, 1)
    for num_shards in (4, 64):
        total, _, lengths, labels = shard_statistics(corpus, wordpiece_dir, cfg, num_shards)
        assert abs(total.instances - one[0].instances) <= 0.005 * one[0].instances
        assert total.instances == one[0].instances > 5000
        for name in ("tokens", "random_next", "masked", "documents", "document_tokens"):
            assert getattr(total, name) == getattr(one[0], name), name
        np.testing.assert_array_equal(lengths, one[2])  # full-length share, tokens, ...
        np.testing.assert_array_equal(labels, one[3])
    # The seed does matter: another seed, other instances.
    other = shard_statistics(corpus, wordpiece_dir, config(max_seq_length=128, dupe_factor=5,
                                                           random_seed=4), 4)[0]
    assert other.instances != one[0].instances


def test_shards_are_balanced_by_size(corpus, wordpiece_dir):
    cfg = config(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=5)
    _, per_shard, _, _ = shard_statistics(corpus, wordpiece_dir, cfg, 4)
    tokens = np.array([s.document_tokens for s in per_shard])
    documents = np.array([s.documents for s in per_shard])
    instances = np.array([s.instances for s in per_shard])
    # Blocks (runs of documents of ~1/4096 of the split) go to the shard with the fewest
    # tokens: equal to within a block; documents per shard are whatever that takes.
    assert tokens.max() - tokens.min() <= tokens.sum() / 4096 + 200
    assert tokens.max() / tokens.min() < 1.01
    assert documents.max() != documents.min()
    # Instances follow tokens, up to the per-document draws of short targets (~1,500
    # instances per shard here, which move by ~4% from seed to seed).
    assert instances.max() / instances.min() < 1.15


def test_random_next_segments_come_from_the_whole_split(corpus, wordpiece_dir):
    import random
    from runexp.tasks.instances.pretraining_instances import plan_instances
    index = local_index(corpus, wordpiece_dir)
    cfg = config(max_seq_length=128, dupe_factor=2)
    store, blocks = index.shard_store(index.shard_blocks(0, 4), 3, "train")
    plan = plan_instances(store, cfg.instance_config(cached_tokenizer(wordpiece_dir)),
                          random.Random(), blocks, index.split_doc_starts)
    random_next = plan.b_end > 0
    assert 0.5 < random_next.mean() < 0.7
    # The document of each random B (split-wide) and of its A (local -> split-wide).
    b_doc = np.searchsorted(index.doc_starts, plan.b_start[random_next], "right") - 1
    assert (plan.b_end[random_next] == index.doc_starts[b_doc + 1]).all()
    local_to_split = np.concatenate([np.arange(first, end) - first + first_id
                                     for _, first, end, first_id in blocks])
    a_sentence = np.searchsorted(store.sentence_starts, plan.a_start[random_next], "right") - 1
    a_doc = local_to_split[np.searchsorted(store.doc_starts, a_sentence, "right") - 1]
    assert (b_doc != a_doc).all()
    own = np.zeros(len(index.doc_starts) - 1, bool)
    own[local_to_split] = True
    # About three quarters of the documents are in other shards, and so are their Bs.
    assert 0.65 < (~own[b_doc]).mean() < 0.85


def test_auto_num_shards():
    mib = 1 << 20
    assert [auto_num_shards(x) for x in (0, 20_000_000, 32 * mib, 33 * mib, 64 * mib,
                                         320_000_000, 4096 * mib, 16384 * mib, 1 << 40)] == \
        [4, 4, 4, 8, 8, 64, 64, 256, 1024]
    assert auto_num_shards(None) == 64
    sizes = [int(1.3 ** k) for k in range(120)]
    counts = [auto_num_shards(s) for s in sizes]
    assert counts == sorted(counts) and max(counts) == 1024
    for s, n in zip(sizes, counts):  # shards of at most 64 MiB below the cap
        assert n == 1024 or s / n <= 64 * mib
        assert n & (n - 1) == 0


def test_plan_ranges_cover_every_byte_once():
    import random
    rng = random.Random(0)
    for _ in range(2000):
        sizes = [rng.choice([0, 0, 1, 5, 100, rng.randint(0, 1000)])
                 for _ in range(rng.randint(1, 12))]
        num_ranges = rng.randint(1, 40)
        ranges = plan_ranges(sizes, num_ranges)
        assert len(ranges) == num_ranges
        segments = [s for r in ranges for s in r]
        assert segments == sorted(segments)  # file order, and within a file byte order
        lengths = [sum(b - a for _, a, b in r) for r in ranges]
        assert max(lengths) - min(lengths) <= 1  # equal sizes, whatever the files
        for f, size in enumerate(sizes):
            mine = [(a, b) for g, a, b in segments if g == f]
            if not size:
                assert mine == [(0, 0)]  # empty files are seen, once
                continue
            assert mine[0][0] == 0 and mine[-1][1] == size
            assert all(x[1] == y[0] and x[0] < x[1] for x, y in zip(mine, mine[1:]))
