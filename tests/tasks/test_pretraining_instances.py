"""BERT instances and masking on real text: structure, statistics, determinism."""

import os
import random

import numpy as np
import pytest

from runexp.tasks.pretraining_instances import create_instances_from_document
from runexp.tasks.pretraining_shards import (PretrainingConfig, build_shard, cached_tokenizer,
                                             read_shard_documents, ShardStats)

MAX_LEN, MAX_PRED = 128, 20


def config(**overrides):
    values = dict(max_seq_length=MAX_LEN, max_predictions_per_seq=MAX_PRED,
                  masked_lm_prob=0.15, dupe_factor=4, random_seed=7)
    values.update(overrides)
    return PretrainingConfig(**values)


def features(small_corpus, vocab_dir, **overrides):
    files = [os.path.join(small_corpus, "train.txt")]
    out, stats = build_shard(files, vocab_dir, config(**overrides), "train", 0, 1,
                             transform=lambda f: f)
    return out, stats


def original_ids(f):
    ids = list(f["input_ids"])
    for pos, label, w in zip(f["masked_lm_positions"], f["masked_lm_ids"], f["masked_lm_weights"]):
        if w:
            ids[pos] = label
    return ids


@pytest.fixture(scope="module")
def spm_features(small_corpus, spm_dir):
    return features(small_corpus, spm_dir)


def test_layout_cls_a_sep_b_sep(spm_features, spm_dir):
    tok = cached_tokenizer(spm_dir)
    out, stats = spm_features
    assert len(out) == stats.instances > 1000
    for f in out:
        n = sum(f["input_mask"])
        assert f["input_mask"] == [1] * n + [0] * (MAX_LEN - n)
        ids = original_ids(f)
        assert ids[0] == tok.cls_id and ids[n - 1] == tok.sep_id
        seps = [i for i in range(n) if ids[i] == tok.sep_id]
        assert len(seps) == 2 and 1 < seps[0] < n - 2  # A and B are non-empty
        assert f["segment_ids"] == [0] * (seps[0] + 1) + [1] * (n - seps[0] - 1) + [0] * (MAX_LEN - n)
        assert all(i == 0 for i in f["input_ids"][n:])
        m = int(sum(f["masked_lm_weights"]))
        assert f["masked_lm_weights"] == [1.0] * m + [0.0] * (MAX_PRED - m)
        assert f["masked_lm_positions"][:m] == sorted(set(f["masked_lm_positions"][:m]))
        assert all(0 < p < n and ids[p] not in (tok.cls_id, tok.sep_id)
                   for p in f["masked_lm_positions"][:m])
        assert m == min(MAX_PRED, max(1, int(round(n * 0.15))))
        assert f["next_sentence_labels"] in ([0], [1])


def test_masked_fraction_and_80_10_10_shares(spm_features, spm_dir):
    tok = cached_tokenizer(spm_dir)
    out, stats = spm_features
    assert abs(stats.masked / stats.tokens - 0.15) < 0.01
    masked = kept = replaced = 0
    for f in out:
        for pos, label, w in zip(f["masked_lm_positions"], f["masked_lm_ids"],
                                 f["masked_lm_weights"]):
            if not w:
                continue
            now = f["input_ids"][pos]
            masked += now == tok.mask_id
            kept += now == label
            replaced += now not in (label, tok.mask_id)
    total = masked + kept + replaced
    assert total == stats.masked > 20_000
    # Binomial standard deviations here are about 0.003: 0.015 is five of them.
    assert abs(masked / total - 0.8) < 0.015
    assert abs(kept / total - 0.1) < 0.015
    assert abs(replaced / total - 0.1) < 0.015


def test_configurable_shares(small_corpus, spm_dir):
    tok = cached_tokenizer(spm_dir)
    out, _ = features(small_corpus, spm_dir, dupe_factor=1, mask_token_prob=0.5,
                      random_token_prob=0.5)
    pairs = [(f["input_ids"][p], l) for f in out for p, l, w in zip(
        f["masked_lm_positions"], f["masked_lm_ids"], f["masked_lm_weights"]) if w]
    share_mask = sum(now == tok.mask_id for now, _ in pairs) / len(pairs)
    share_kept = sum(now == label for now, label in pairs) / len(pairs)
    assert abs(share_mask - 0.5) < 0.03 and share_kept < 0.01


def test_random_next_share(spm_features):
    out, stats = spm_features
    share = sum(f["next_sentence_labels"][0] for f in out) / len(out)
    assert share == stats.random_next / stats.instances
    # 0.5 for chunks of several sentences; a one-sentence chunk always takes a random B,
    # so the share is a little above one half.
    assert 0.5 <= share < 0.6


def test_short_sequence_share(small_corpus, spm_dir):
    tok = cached_tokenizer(spm_dir)
    docs = read_shard_documents([os.path.join(small_corpus, "train.txt")], tok, 0, 1,
                                ShardStats())
    instance_config = config().instance_config(tok)
    rng = random.Random(3)
    short, lengths = [], {True: [], False: []}
    for _ in range(30):
        for index in range(len(docs)):
            probe = random.Random()
            probe.setstate(rng.getstate())
            is_short = probe.random() < 0.1  # the call's first draw decides, as in the reference
            short.append(is_short)
            for inst in create_instances_from_document(docs, index, instance_config, rng):
                lengths[is_short].append(len(inst.tokens))
    assert len(short) > 1000
    assert abs(np.mean(short) - 0.1) < 0.03
    assert np.mean(lengths[True]) < 0.75 * np.mean(lengths[False])
    assert max(lengths[False]) == MAX_LEN


def test_deterministic_for_a_seed(small_corpus, spm_dir):
    files = [os.path.join(small_corpus, "heldout.txt")]
    a, _ = build_shard(files, spm_dir, config(), "validation", 0, 2)
    b, _ = build_shard(files, spm_dir, config(), "validation", 0, 2)
    c, _ = build_shard(files, spm_dir, config(random_seed=8), "validation", 0, 2)
    assert a == b and a != c
    assert all(isinstance(x, bytes) for x in a)


def test_whole_word_masking_never_splits_a_word(small_corpus, wordpiece_dir):
    tok = cached_tokenizer(wordpiece_dir)
    out, stats = features(small_corpus, wordpiece_dir, whole_word_masking=True, dupe_factor=1)
    continued_words = 0
    for f in out:
        ids = original_ids(f)
        n = sum(f["input_mask"])
        chosen = {p for p, w in zip(f["masked_lm_positions"], f["masked_lm_weights"]) if w}
        for p in chosen:
            # A piece right after [CLS]/[SEP] (its word truncated away in front) starts a group.
            if not tok.is_word_start(ids[p]) and ids[p - 1] not in (tok.cls_id, tok.sep_id):
                assert p - 1 in chosen
                continued_words += 1
            if p + 1 < n and not tok.is_word_start(ids[p + 1]) and ids[p + 1] != tok.sep_id:
                assert p + 1 in chosen
    assert continued_words > 500
    assert abs(stats.masked / stats.tokens - 0.15) < 0.02
