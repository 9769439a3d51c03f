"""Dynamic masking (tasks/instances/dynamic_masking.py) against the static masker (tasks/instances/masking.py).

The same instances are built twice from the stdlib slice: statically masked (dupe_factor 1)
and unmasked for masking at training time. Masks drawn in TensorFlow must have the static
masker's distribution: the same number of predictions per row (a function of the length),
never [CLS]/[SEP]/padding, 80/10/10 replacement shares inside a binomial 99.9% band
(z = 3.29; the parity test's nominal-rate checks are looser), whole words kept whole. The
mask of a row must be a function of its seed pair alone (resume-exactness rests on it).
"""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from runexp.tasks.instances.dynamic_masking import mask_batch  # noqa: E402
from runexp.tasks.instances.masking import MaskingConfig  # noqa: E402
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats,  # noqa: E402
                                             cached_tokenizer, iter_shard_batches)

MAX_LEN, MAX_PRED = 128, 20
Z = 3.29  # two-sided 99.9% normal quantile


def build(corpus_file, vocab_dir, **params):
    config = PretrainingConfig.of(max_seq_length=MAX_LEN, max_predictions_per_seq=MAX_PRED,
                               random_seed=5, **params)
    batches = list(iter_shard_batches([corpus_file], vocab_dir, config, "train", 0, 1,
                                      ShardStats()))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}, config


def mask_all(features, config: PretrainingConfig, vocab_dir, key=11, first_position=0):
    spec = MaskingConfig.from_json(config.masking_spec(cached_tokenizer(vocab_dir)))
    n = len(features["input_ids"])
    seeds = np.stack([np.full(n, key), first_position + np.arange(n)], axis=1).astype(np.int64)
    fn = tf.function(lambda f, s: mask_batch(f, s, spec))
    out = []
    for start in range(0, n, 512):
        part = {k: tf.constant(v[start:start + 512]) for k, v in features.items()}
        out.append({k: v.numpy() for k, v in fn(part, tf.constant(seeds[start:start + 512]))
                    .items()})
    return {k: np.concatenate([o[k] for o in out]) for k in out[0]}


@pytest.fixture(scope="module", params=[False, True], ids=["uniform", "whole_words"])
def outputs(request, small_corpus, wordpiece_dir):
    """(static, unmasked, dynamically masked) features of the same instances, mask id."""
    wwm = request.param
    corpus = os.path.join(small_corpus, "train.txt")
    static, _ = build(corpus, wordpiece_dir, dupe_factor=1, whole_word_masking=wwm)
    # dupe_factor is ignored by a dynamically masked train split: one pass.
    unmasked, config = build(corpus, wordpiece_dir, dupe_factor=5, whole_word_masking=wwm,
                             dynamic_masking=True)
    # Four epochs (positions 0.., n.., ...): four masks of each instance, more statistics.
    n = len(unmasked["input_ids"])
    epochs = [mask_all(unmasked, config, wordpiece_dir, first_position=e * n) for e in range(4)]
    dynamic = {k: np.concatenate([e[k] for e in epochs]) for k in epochs[0]}
    unmasked = {k: np.concatenate([v] * 4) for k, v in unmasked.items()}
    return static, unmasked, dynamic, cached_tokenizer(wordpiece_dir), wwm


def unmask(features):
    ids = features["input_ids"].copy()
    rows, cols = np.nonzero(features["masked_lm_weights"] > 0)
    ids[rows, features["masked_lm_positions"][rows, cols]] = features["masked_lm_ids"][rows, cols]
    return ids


def test_unmasked_split_is_the_static_one_before_masking(outputs):
    static, unmasked, _, _, _ = outputs
    unmasked = {k: v[:len(v) // 4] for k, v in unmasked.items()}
    assert len(unmasked["input_ids"]) == len(static["input_ids"]) > 500  # one pass (~900 here)
    for name in ("input_mask", "segment_ids", "next_sentence_labels"):
        np.testing.assert_array_equal(unmasked[name], static[name], err_msg=name)
    assert not unmasked["masked_lm_weights"].any() and not unmasked["masked_lm_ids"].any()
    # (Past the first batch of 1024, truncation draws would interleave with masking draws.)
    np.testing.assert_array_equal(unmasked["input_ids"][:1024], unmask(static)[:1024])


def test_dynamic_masks_have_the_static_statistics(outputs):
    static, unmasked, dynamic, tok, wwm = outputs
    original = unmasked["input_ids"]
    n = unmasked["input_mask"].sum(axis=1)
    weights = dynamic["masked_lm_weights"] > 0
    m = weights.sum(axis=1)
    k = np.minimum(MAX_PRED, np.maximum(1, np.round(n * 0.15)))
    if wwm:  # whole words fill k only when they fit: compare with the static masker
        m_static = (static["masked_lm_weights"] > 0).sum(axis=1)
        print(f"\nwhole words: predictions per row {m.mean():.3f} dynamic, "
              f"{m_static.mean():.3f} static; k {k.mean():.3f}")
        assert (m <= k).all()
        band = Z * np.sqrt((m.var() + m_static.var()) / len(m))
        assert abs(m.mean() - m_static.mean()) <= band, (m.mean(), m_static.mean(), band)
    else:
        np.testing.assert_array_equal(m, k)
    rows, cols = np.nonzero(weights)
    pos = dynamic["masked_lm_positions"]
    assert (pos[~weights] == 0).all() and (dynamic["masked_lm_ids"][~weights] == 0).all()
    assert (weights[:, 1:] <= weights[:, :-1]).all()  # predictions first, then padding
    assert (np.diff(pos, axis=1)[weights[:, 1:]] > 0).all()  # ascending, distinct
    p = pos[rows, cols]
    label = dynamic["masked_lm_ids"][rows, cols]
    np.testing.assert_array_equal(label, original[rows, p])
    assert (p > 0).all() and (p < n[rows]).all()
    assert not np.isin(label, [tok.cls_id, tok.sep_id, tok.pad_id]).any()
    # Nothing but the chosen positions changed.
    changed = dynamic["input_ids"] != original
    changed[rows, p] = False
    assert not changed.any()
    now = dynamic["input_ids"][rows, p]
    total = len(p)
    for name, share, nominal in (("[MASK]", np.mean(now == tok.mask_id), 0.8),
                                 ("kept", np.mean(now == label), 0.1 + 0.1 / tok.vocab_size),
                                 ("random", np.mean((now != tok.mask_id) & (now != label)),
                                  0.1 * (1 - 2 / tok.vocab_size))):
        band = Z * np.sqrt(nominal * (1 - nominal) / total)
        assert abs(share - nominal) <= band, (name, share, nominal, band)
    # Positions are chosen like the static masker's: same share in segment B.
    seg_b = unmasked["segment_ids"][rows, p].mean()
    srows, scols = np.nonzero(static["masked_lm_weights"] > 0)
    seg_b_static = static["segment_ids"][srows, static["masked_lm_positions"][srows, scols]].mean()
    band = Z * np.sqrt(2 * seg_b * (1 - seg_b) / total) * 2  # x2: rows cluster positions
    assert abs(seg_b - seg_b_static) <= band, (seg_b, seg_b_static, band)
    if wwm:  # every word is masked whole or not at all
        starts = unmasked["word_starts"] > 0
        candidates = (unmasked["input_mask"] > 0) & ~np.isin(original, [tok.cls_id, tok.sep_id])
        word = np.cumsum(starts, axis=1)
        masked = np.zeros_like(candidates)
        masked[rows, p] = True
        for r in range(0, len(original), 7):
            ids_masked = set(word[r][masked[r]])
            ids_unmasked = set(word[r][candidates[r] & ~masked[r]])
            assert not ids_masked & ids_unmasked, r
        assert (np.diff(word, axis=1)[candidates[:, 1:] & ~starts[:, 1:]] == 0).all()
        assert (starts <= candidates).all() and (starts.sum(axis=1) < candidates.sum(axis=1)).any()


def test_mask_is_a_function_of_the_seed_pair_alone(outputs, wordpiece_dir):
    _, unmasked, _, _, wwm = outputs
    config = PretrainingConfig.of(max_seq_length=MAX_LEN, max_predictions_per_seq=MAX_PRED,
                               whole_word_masking=wwm, dynamic_masking=True)
    rows = {k: v[:64] for k, v in unmasked.items()}
    a = mask_all(rows, config, wordpiece_dir, first_position=1000)
    again = mask_all(rows, config, wordpiece_dir, first_position=1000)
    # The same rows in reverse order with their seeds: each row's mask moves with it.
    reverse = {k: v[::-1] for k, v in rows.items()}
    spec = MaskingConfig.from_json(config.masking_spec(cached_tokenizer(wordpiece_dir)))
    seeds = np.stack([np.full(64, 11), 1000 + np.arange(64)[::-1]], axis=1)
    eager = mask_batch({k: tf.constant(v) for k, v in reverse.items()}, tf.constant(seeds), spec)
    other = mask_all(rows, config, wordpiece_dir, first_position=2000)
    for name in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
        np.testing.assert_array_equal(a[name], again[name])
        np.testing.assert_array_equal(a[name], eager[name].numpy()[::-1])
    differ = (a["masked_lm_positions"] != other["masked_lm_positions"]).any(axis=1)
    assert differ.mean() > 0.9  # another position in the stream: another mask
