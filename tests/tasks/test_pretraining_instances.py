"""BERT instances and masking on real text: structure, statistics, options, determinism."""

import os
import random

import numpy as np
import pytest

from runexp.compiler.specs import MaskingSpec
from runexp.tasks.instances.document_store import DocumentStore
from runexp.tasks.instances.pretraining_instances import truncation
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, build_shard, cached_tokenizer,
                                             shard_documents)

MAX_LEN, MAX_PRED = 128, 20


def config(**overrides):
    values = dict(max_seq_length=MAX_LEN, max_predictions_per_seq=MAX_PRED,
                  masked_lm_prob=0.15, dupe_factor=4, random_seed=7)
    values.update(overrides)
    return PretrainingConfig.of(**values)


def features(small_corpus, vocab_dir, **overrides):
    files = [os.path.join(small_corpus, "train.txt")]
    return build_shard(files, vocab_dir, config(**overrides), "train", 0, 1)


def original_ids(f):
    ids = list(f["input_ids"])
    for pos, label, w in zip(f["masked_lm_positions"], f["masked_lm_ids"], f["masked_lm_weights"]):
        if w:
            ids[pos] = label
    return ids


def check_layout(f, tok, pairs=True, max_len=MAX_LEN, max_pred=MAX_PRED):
    n = sum(f["input_mask"])
    assert f["input_mask"] == [1] * n + [0] * (max_len - n)
    ids = original_ids(f)
    assert ids[0] == tok.cls_id and ids[n - 1] == tok.sep_id
    seps = [i for i in range(n) if ids[i] == tok.sep_id]
    if pairs:
        assert len(seps) == 2 and 1 < seps[0] < n - 2  # A and B are non-empty
        assert f["segment_ids"] == ([0] * (seps[0] + 1) + [1] * (n - seps[0] - 1)
                                    + [0] * (max_len - n))
    else:
        assert seps == [n - 1] and n > 2 and f["segment_ids"] == [0] * max_len
        assert f["next_sentence_labels"] == [0]
    assert all(i == 0 for i in f["input_ids"][n:])
    m = int(sum(f["masked_lm_weights"]))
    assert f["masked_lm_weights"] == [1.0] * m + [0.0] * (max_pred - m)
    assert f["masked_lm_positions"][:m] == sorted(set(f["masked_lm_positions"][:m]))
    assert all(0 < p < n and ids[p] not in (tok.cls_id, tok.sep_id)
               for p in f["masked_lm_positions"][:m])
    assert f["masked_lm_positions"][m:] == [0] * (max_pred - m)
    assert f["next_sentence_labels"] in ([0], [1])
    return n, m


@pytest.fixture(scope="module")
def spm_features(small_corpus, spm_dir):
    return features(small_corpus, spm_dir)


def test_layout_cls_a_sep_b_sep(spm_features, spm_dir):
    tok = cached_tokenizer(spm_dir)
    out, stats = spm_features
    assert len(out) == stats.instances > 1000
    for f in out:
        n, m = check_layout(f, tok)
        assert m == min(MAX_PRED, max(1, int(round(n * 0.15))))
    assert max(sum(f["input_mask"]) for f in out) == MAX_LEN


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
    # Binomial standard deviations here are about 0.003: 0.015 is five of them. (A random
    # replacement can hit the original id, 1 in 2000 here: well inside.)
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
    # so the share is a little above one half (the reference does the same).
    assert 0.5 <= share < 0.6


def test_short_sequences(small_corpus, spm_dir, tmp_path):
    # The target length is drawn per document and pass, so the slice's 45 whole modules give
    # a share that moves by +-0.05 from seed to seed; its text cut into ~500 documents of at
    # most 8 sentences moves by +-0.005.
    from runexp.tasks.sources.text_documents import iter_documents
    docs = []
    for doc in iter_documents([os.path.join(small_corpus, "train.txt")]):
        docs.extend("".join(line + "\n" for line in doc[i:i + 8]) for i in range(0, len(doc), 8))
    (tmp_path / "train.txt").write_text("\n".join(docs), encoding="utf-8")

    def short_share(p):
        out, _ = features(str(tmp_path), spm_dir, dupe_factor=2, short_seq_prob=p)
        return np.mean([sum(f["input_mask"]) < MAX_LEN // 2 for f in out]), len(out)

    none, n0 = short_share(0.0)
    some, n1 = short_share(0.1)
    always, _ = short_share(1.0)
    # Short targets make more, shorter instances: about 0.1 of the documents' first chunks
    # get a target uniform in [2, 125], so roughly half of those are under 64 tokens.
    assert none < some < always
    assert n0 < n1
    assert some - none > 0.02 and always > 0.4


def test_truncation_matches_the_reference_loop():
    rng = random.Random(0)
    la = np.array([rng.randint(1, 200) for _ in range(3000)])
    lb = np.array([rng.randint(1, 200) for _ in range(3000)])
    ka, kb = truncation(la, lb, 125)
    for a, b, x, y in zip(la.tolist(), lb.tolist(), ka.tolist(), kb.tolist()):
        ra = rb = 0
        while (a - ra) + (b - rb) > 125:  # reference: trim the longer, B on ties
            if a - ra > b - rb:
                ra += 1
            else:
                rb += 1
        assert (x, y) == (ra, rb)
        assert a - x >= 1 and b - y >= 1


def test_deterministic_for_a_seed(small_corpus, spm_dir):
    files = [os.path.join(small_corpus, "heldout.txt")]
    a, _ = build_shard(files, spm_dir, config(), "validation", 0, 2)
    b, _ = build_shard(files, spm_dir, config(), "validation", 0, 2)
    c, _ = build_shard(files, spm_dir, config(random_seed=8), "validation", 0, 2)
    assert a == b and a != c and len(a) > 10


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


def _words(ids, n, tok):
    """Word index of each position (None for specials), as the masking groups them."""
    word, out = -1, []
    for p in range(n):
        if ids[p] in (tok.cls_id, tok.sep_id):
            out.append(None)
            continue
        if tok.is_word_start(ids[p]) or out[-1] is None:
            word += 1
        out.append(word)
    return out


def test_ngram_masking_masks_runs_of_whole_words(small_corpus, wordpiece_dir):
    tok = cached_tokenizer(wordpiece_dir)
    out, stats = features(small_corpus, wordpiece_dir, ngram_max=3, dupe_factor=1)
    run_lengths = []
    for f in out:
        ids = original_ids(f)
        n = sum(f["input_mask"])
        words = _words(ids, n, tok)
        chosen = {p for p, w in zip(f["masked_lm_positions"], f["masked_lm_weights"]) if w}
        assert len(chosen) <= MAX_PRED
        masked_words = sorted({words[p] for p in chosen})
        for w in masked_words:  # whole words only
            assert {p for p in range(n) if words[p] == w} <= chosen
        run = 1
        for prev, cur in zip(masked_words, masked_words[1:]):
            if cur == prev + 1:
                run += 1
            else:
                run_lengths.append(run)
                run = 1
        if masked_words:
            run_lengths.append(run)
    counts = np.bincount(run_lengths)
    # Spans of 1, 2 and 3 words with p ∝ 1, 1/2, 1/3 (adjacent spans merge into longer runs,
    # and the budget shortens some): clearly more multi-word runs than chance would make.
    assert counts[2] > 0.2 * counts[1] and counts[3] > 0.05 * counts[1]
    assert abs(stats.masked / stats.tokens - 0.15) < 0.02
    unigram, _ = features(small_corpus, wordpiece_dir, whole_word_masking=True, dupe_factor=1)
    assert len(unigram) == len(out)


def test_sentence_order_prediction(small_corpus, spm_dir):
    tok = cached_tokenizer(spm_dir)
    files = [os.path.join(small_corpus, "train.txt")]
    store = shard_documents(files, spm_dir, "train", 0, 1)
    text = store.tokens.tolist()
    out, stats = features(small_corpus, spm_dir, pair_objective="sop", dupe_factor=2,
                          short_seq_prob=0.0)
    swapped = 0
    haystack = ",".join(map(str, text))
    for f in out[:400]:
        check_layout(f, tok)
        ids = original_ids(f)
        n = sum(f["input_mask"])
        sep = ids.index(tok.sep_id)
        a, b = ids[1:sep], ids[sep + 1:n - 1]
        first, second = (b, a) if f["next_sentence_labels"] == [1] else (a, b)
        # B is the true continuation: "first second" is a run of the corpus (not truncated
        # at the seam when short enough to fit).
        if len(a) + len(b) < MAX_LEN - 3 - 20:
            assert ",".join(map(str, first + second)) in haystack
        swapped += f["next_sentence_labels"][0]
    share = stats.random_next / stats.instances
    assert abs(share - 0.5) < 4 * (0.25 / stats.instances) ** 0.5


def test_single_segments(small_corpus, spm_dir):
    tok = cached_tokenizer(spm_dir)
    out, stats = features(small_corpus, spm_dir, pair_objective="none", dupe_factor=1)
    for f in out:
        n, m = check_layout(f, tok, pairs=False)
        assert m == min(MAX_PRED, max(1, int(round(n * 0.15))))
    assert stats.random_next == 0
    assert max(sum(f["input_mask"]) for f in out) == MAX_LEN


def test_document_store_drops_empty_sentences_and_documents():
    store = DocumentStore()
    store.add_document([[5, 6], [], [7]])
    store.add_document([[], []])
    store.add_document([[8]])
    assert store.num_documents == 2 and store.num_sentences == 3
    assert store.document(0) == [[5, 6], [7]] and store.document(1) == [[8]]
    assert store.tokens.tolist() == [5, 6, 7, 8]


def test_rejects_unknown_pair_objective():
    with pytest.raises(ValueError, match="pair_objective"):
        PretrainingConfig.from_params({"pair_objective": "mlm_only"})
    assert PretrainingConfig.from_params({"pair_objective": "sop", "ngram_max": 3}).masking.ngram_max == 3
    assert PretrainingConfig.from_params({}).pair_objective == "nsp"  # old plans


def test_vectorised_whole_word_selection_has_the_reference_distribution():
    """Batch whole-word masking picks words like the per-instance greedy loop (random order,
    a word taken when it still fits), and leaves no word out that would still fit."""
    from runexp.tasks.instances import masking
    sizes = [1, 2, 3, 1, 1, 4, 2, 1]
    # Ids 10.. start words, 50.. continue them; [CLS] 2 ... [SEP] 3.
    row = [2]
    for w, size in enumerate(sizes):
        row += [10 + w] + [50 + w] * (size - 1)
    row += [3]
    word_start = np.zeros(100, bool)
    word_start[10:50] = True
    n, k, copies = len(row), 5, 20_000
    ids = np.tile(np.array(row, np.int32), (copies, 1))
    candidates = np.ones_like(ids, bool)
    candidates[:, 0] = candidates[:, -1] = False
    picked = masking._choose_whole_words(word_start[ids], candidates, np.full(copies, k), 8,
                                         np.random.default_rng(0))
    word_of = {}
    p = 1
    for w, size in enumerate(sizes):
        for _ in range(size):
            word_of[p] = w
            p += 1
    freq_batch = np.zeros(len(sizes))
    for r in range(copies):
        chosen = [x for x in picked[r].tolist() if x < n]
        words = {word_of[x] for x in chosen}
        assert sorted(chosen) == sorted(x for x in word_of if word_of[x] in words)  # whole
        assert len(chosen) <= k
        assert all(sizes[w] > k - len(chosen) for w in range(len(sizes)) if w not in words)
        for w in words:
            freq_batch[w] += 1
    groups = [(0, [x for x in word_of if word_of[x] == w]) for w in range(len(sizes))]
    spec = MaskingSpec(max_predictions_per_seq=8, masked_lm_prob=0.15, whole_word_masking=True)
    config = masking.MaskingConfig(spec, 100, 4, 2, 3, word_start=word_start)
    rng = random.Random(0)
    freq_loop = np.zeros(len(sizes))
    for _ in range(copies):
        for w in {word_of[x] for x in masking._select_words(groups, k, config, rng)}:
            freq_loop[w] += 1
    a, b = freq_batch / copies, freq_loop / copies
    se = np.sqrt(a * (1 - a) / copies + b * (1 - b) / copies)
    assert (np.abs(a - b) < 5 * se + 1e-9).all(), (a, b)
