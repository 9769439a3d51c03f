"""BERT's masked-LM selection at training time (RoBERTa's dynamic masking), in TensorFlow.

The distribution is masking.py's (google-research/bert's): per row ``k = min(
max_predictions_per_seq, max(1, round(n * masked_lm_prob)))`` positions among all real
tokens but [CLS] and [SEP], uniformly or as whole words taken in random order while they
fit in ``k``; each becomes [MASK] with ``mask_token_prob``, a uniformly random id in
``[0, vocab_size)`` with ``random_token_prob``, and keeps its token otherwise; every chosen
position has weight 1. N-gram masking (ngram_max > 1) is not offered here (the compiler
refuses it with dynamic masking).

The randomness of a row is a function of its seed only, a pair ``[key, position]``: the
key says which run (and task), the position where the example is in the task's stream
(tasks/cache/seqio_tasks.py: the task's seqio preprocessor after its cache placeholder). Stateless ops (Philox) draw from it, so a resumed run that skips to the
same position draws the same mask, and an example seen again (the next epoch, a later
position) gets a new one.

Records hold the unmasked tokens and ``word_starts`` (1 where a maskable word starts; the
preprocess stage computes it with the vocab, masking.py's grouping rule), so whole-word
masking needs no vocab here. Heavy module: imports TensorFlow.

Usage:
    config = MaskingConfig.from_json(records.read_masking(task_cache_dir))
    features = mask_batch(features, seeds, config)   # seeds: int64 [batch, 2]
"""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf

from runexp.tasks.instances.masking import MaskingConfig


def _row_draws(seeds: tf.Tensor, length: int, width: int, vocab_size: int):
    """Per row: selection keys [length], replacement choices [width], random ids [width]."""

    def draw(seed):
        s = tf.random.experimental.stateless_split(seed, num=3)
        return (tf.random.stateless_uniform([length], seed=s[0]),
                tf.random.stateless_uniform([width], seed=s[1]),
                tf.random.stateless_uniform([width], seed=s[2], minval=0, maxval=vocab_size,
                                            dtype=tf.int32))

    # Stateless ops take one seed per call: a loop over rows (about 2 ms per 256 rows).
    return tf.map_fn(draw, seeds, fn_output_signature=(tf.float32, tf.float32, tf.int32))


def _words(candidates, starts):
    """The words of each row among the candidate positions: (batch, length, each position's
    word index, the row's word count, each position's word as a segment id flattened (row *
    length + word; batch * length for a non-candidate), each word's size in pieces)."""
    batch, length = tf.shape(candidates)[0], tf.shape(candidates)[1]
    starts = starts & candidates
    word = tf.maximum(tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1, 0)
    words = tf.reduce_sum(tf.cast(starts, tf.int32), axis=1)
    rows = tf.range(batch)[:, None]
    segment = tf.where(candidates, rows * length + word, batch * length)
    flat = tf.reshape(segment, [-1])
    sizes = tf.reshape(tf.math.unsorted_segment_sum(
        tf.ones_like(flat), flat, batch * length + 1)[:-1], [batch, length])
    return batch, length, word, words, flat, sizes


def _choose_whole_words(candidates, starts, k, keys):
    """Positions chosen by whole words (as masking._choose_whole_words): words in random
    order, each taken while it still fits in ``k``. Returns a bool [batch, length] mask."""
    batch, length, word, words, flat, sizes = _words(candidates, starts)
    pos = tf.range(length)[None, :]
    order = tf.argsort(tf.where(pos < words[:, None], keys, 2.0), axis=1, stable=True)

    def body(r, total, taken):
        w = order[:, r]
        size = tf.gather(sizes, w, batch_dims=1)
        ok = (r < words) & (total + size <= k)
        taken = taken | (tf.one_hot(w, length, on_value=True, off_value=False) & ok[:, None])
        return r + 1, total + tf.where(ok, size, 0), taken

    def more(r, total, _):
        return (r < tf.reduce_max(words)) & tf.reduce_any((total < k) & (r < words))

    _, _, taken = tf.while_loop(
        more, body, (tf.constant(0), tf.zeros([batch], tf.int32),
                     tf.zeros([batch, length], tf.bool)))
    return candidates & tf.gather(taken, word, batch_dims=1)


def mask_batch(features: Mapping[str, tf.Tensor], seeds: tf.Tensor,
               config: MaskingConfig) -> dict:
    """Masks a batch of unmasked instances.

    Args:
      features: int32 ``input_ids``, ``input_mask`` [batch, length] and, for whole words,
        ``word_starts``; other features pass through (``masked_lm_*`` are replaced).
      seeds: int64 [batch, 2], one per row (module docstring).
      config: the masking parameters.

    Returns:
      The features with ``input_ids`` masked and ``masked_lm_positions`` (ascending, then
      0), ``masked_lm_ids`` (int32) and ``masked_lm_weights`` (float32) [batch, width];
      ``word_starts`` dropped.
    """
    if "instance_ids" in features:
        return _mask_packed(features, seeds, config)
    ids = features["input_ids"]
    length = ids.shape[1]
    width = config.spec.max_predictions_per_seq
    candidates = (features["input_mask"] > 0) & (ids != config.cls_id) & (ids != config.sep_id)
    n = tf.reduce_sum(tf.cast(features["input_mask"] > 0, tf.float64), axis=1)
    # float64 and half-to-even rounding: the reference's Python round(n * masked_lm_prob).
    prob = tf.constant(config.spec.masked_lm_prob, tf.float64)
    k = tf.minimum(tf.constant(width, tf.float64),
                   tf.maximum(tf.constant(1.0, tf.float64), tf.round(n * prob)))
    k = tf.minimum(tf.cast(k, tf.int32), tf.reduce_sum(tf.cast(candidates, tf.int32), axis=1))
    keys, u, random_ids = _row_draws(seeds, length, width, config.vocab_size)
    pos = tf.range(length)[None, :]
    if config.spec.whole_word_masking:
        chosen = _choose_whole_words(candidates, features["word_starts"] > 0, k, keys)
        picked = tf.where(chosen, pos, length)
    else:
        # The k candidates with the smallest keys: a uniform choice of k.
        by_key = tf.argsort(tf.where(candidates, keys, 2.0), axis=1, stable=True)
        picked = tf.where(pos < k[:, None], by_key, length)
    picked = tf.sort(picked, axis=1)[:, :width]  # at most k <= width are chosen
    if picked.shape[1] < width:  # more prediction slots than tokens
        picked = tf.pad(picked, [[0, 0], [0, width - picked.shape[1]]], constant_values=length)
    valid = picked < length
    positions = tf.where(valid, picked, 0)
    return _replace(features, ids, positions, valid, u, random_ids, config)


def _replace(features, ids, positions, valid, u, random_ids, config: MaskingConfig) -> dict:
    """The features with the chosen ``positions`` (``valid`` slots) replaced, 80/10/10."""
    labels = tf.where(valid, tf.gather(ids, positions, batch_dims=1), 0)
    replacement = tf.where(
        u < config.spec.mask_token_prob, config.mask_id,
        tf.where(u < config.spec.mask_token_prob + config.spec.random_token_prob, random_ids, labels))
    slots = tf.where(valid)  # [m, 2]: (row, prediction slot) of every chosen position
    scatter = tf.stack([slots[:, 0], tf.cast(tf.gather_nd(positions, slots), tf.int64)], axis=1)
    out = {name: v for name, v in features.items() if name != "word_starts"}
    out["input_ids"] = tf.tensor_scatter_nd_update(ids, scatter,
                                                   tf.gather_nd(replacement, slots))
    out["masked_lm_positions"] = positions
    out["masked_lm_ids"] = labels
    out["masked_lm_weights"] = tf.cast(valid, tf.float32)
    return out


def _mask_packed(features: Mapping[str, tf.Tensor], seeds: tf.Tensor,
                 config: MaskingConfig) -> dict:
    """``mask_batch`` of packed rows (tasks/instances/packing.py): each instance of a row is masked
    as an unpacked one would be (its own ``k`` from its own tokens; positions within it,
    never its [CLS], [SEP]s or the padding; whole words inside it), and the row's
    predictions fill its ``masked_lm_*`` slots (their width: the records'), ascending."""
    ids = features["input_ids"]
    length = ids.shape[1]
    width = features["masked_lm_ids"].shape[1]
    slots = features["next_sentence_weights"].shape[1]
    inst = tf.cast(features["instance_ids"], tf.int32)
    candidates = (inst > 0) & (ids != config.cls_id) & (ids != config.sep_id)
    member = tf.one_hot(inst, slots + 1, dtype=tf.int32)[:, :, 1:]  # [batch, length, K]
    n = tf.cast(tf.reduce_sum(member, axis=1), tf.float64)
    maskable = tf.reduce_sum(member * tf.cast(candidates, tf.int32)[:, :, None], axis=1)
    prob = tf.constant(config.spec.masked_lm_prob, tf.float64)
    k = tf.minimum(tf.constant(config.spec.max_predictions_per_seq, tf.float64),
                   tf.maximum(tf.constant(1.0, tf.float64), tf.round(n * prob)))
    k = tf.where(n > 0, tf.minimum(tf.cast(k, tf.int32), maskable), 0)  # [batch, K]
    keys, u, random_ids = _row_draws(seeds, length, width, config.vocab_size)
    pos = tf.range(length)[None, :]
    if config.spec.whole_word_masking:
        chosen = _choose_whole_words_packed(candidates, features["word_starts"] > 0, inst, k,
                                            keys, slots)
    else:
        # Per instance, its k candidates with the smallest keys: positions by key, then
        # (stably) by instance, each ranked within its instance.
        by_key = tf.argsort(tf.where(candidates, keys, 2.0), axis=1, stable=True)
        owner = tf.where(tf.gather(candidates, by_key, batch_dims=1),
                         tf.gather(inst, by_key, batch_dims=1), slots + 1)
        order = tf.gather(by_key, tf.argsort(owner, axis=1, stable=True), batch_dims=1)
        owner = tf.sort(owner, axis=1)
        before = tf.cumsum(maskable, axis=1, exclusive=True)  # candidates of earlier instances
        padded_k = tf.pad(k, [[0, 0], [1, 1]])  # owner 0 never occurs; K + 1: not a candidate
        padded_before = tf.pad(before, [[0, 0], [1, 1]])
        rank = pos - tf.gather(padded_before, owner, batch_dims=1)
        take = rank < tf.gather(padded_k, owner, batch_dims=1)
        chosen = tf.gather(take, tf.argsort(order, axis=1), batch_dims=1)  # by position
    picked = tf.sort(tf.where(chosen, pos, length), axis=1)[:, :width]
    if picked.shape[1] < width:
        picked = tf.pad(picked, [[0, 0], [0, width - picked.shape[1]]], constant_values=length)
    valid = picked < length
    positions = tf.where(valid, picked, 0)
    return _replace(features, ids, positions, valid, u, random_ids, config)


def _choose_whole_words_packed(candidates, starts, inst, k, keys, slots: int):
    """``_choose_whole_words`` with a budget per instance: the row's words in random order,
    each taken while its instance's ``k`` still has room for it."""
    batch, length, word, words, flat, sizes = _words(candidates, starts)
    # Each word's instance (its pieces are all in one: [CLS] and [SEP] part instances).
    word_inst = tf.reshape(tf.math.unsorted_segment_max(
        tf.reshape(inst, [-1]), flat, batch * length + 1)[:-1], [batch, length])
    word_inst = tf.maximum(word_inst, 0)
    pos = tf.range(length)[None, :]
    order = tf.argsort(tf.where(pos < words[:, None], keys, 2.0), axis=1, stable=True)
    budget = tf.pad(k, [[0, 0], [1, 0]])  # by instance id; 0: no instance

    def body(r, total, taken):
        w = order[:, r]
        size = tf.gather(sizes, w, batch_dims=1)
        owner = tf.gather(word_inst, w, batch_dims=1)
        room = tf.gather(budget, owner, batch_dims=1) - tf.gather(total, owner, batch_dims=1)
        ok = (r < words) & (owner > 0) & (size <= room)
        taken = taken | (tf.one_hot(w, length, on_value=True, off_value=False) & ok[:, None])
        total = total + tf.one_hot(owner, slots + 1, dtype=tf.int32) * tf.where(ok, size, 0)[:, None]
        return r + 1, total, taken

    def more(r, total, _):
        return (r < tf.reduce_max(words)) & tf.reduce_any(
            tf.reduce_any(total < budget, axis=1) & (r < words))

    _, _, taken = tf.while_loop(
        more, body, (tf.constant(0), tf.zeros([batch, slots + 1], tf.int32),
                     tf.zeros([batch, length], tf.bool)))
    return candidates & tf.gather(taken, word, batch_dims=1)
