"""Whole-word masking for Chinese (word_segmenter = 'jieba', tasks/vocabulary/chinese_words.py) on real
Chinese text (the machine's zh_CN translations, ~30,000 lines) with a WordPiece vocab trained
on it: each masked jieba word is masked whole (static masks, decoded and compared with jieba's
segmentation of the source) or marked whole (dynamic masking's ``word_starts``); the masking
statistics stay in the bands of the other masking tests; the segmenter changes the masks and
nothing else; without it, the records are those of before."""

import os
import random

import numpy as np
import pytest
from tests.support.chinese_corpus import (CATALOGS, WordReference, check_whole_words,
                                          chinese_sentences, jieba_cut, original_ids,
                                          reference_continues)

from runexp.compiler.specs import MaskingSpec
from runexp.tasks.vocabulary import vocab_dir
from runexp.tasks.instances.pretraining_shards import PretrainingConfig, build_shard, cached_tokenizer
from runexp.tasks.instances.split_index import continuation_bit, token_dtype
from runexp.tasks.instances.split_reader import local_index

pytest.importorskip("jieba")

MAX_LEN, MAX_PRED = 128, 20


@pytest.fixture(scope="module")
def zh(tmp_path_factory):
    """The corpus as documents of 8 lines, its lines in file order, and a WordPiece vocab
    of 8,000 trained on it (lower-cased, as Google's Chinese vocab)."""
    lines = chinese_sentences()
    if len(lines) < 5000:
        pytest.fail(f"too little Chinese text in {CATALOGS} ({len(lines)} lines): the "
                    "machine's zh_CN translations are this test's corpus")
    random.Random(0).shuffle(lines)
    d = tmp_path_factory.mktemp("zh")
    with open(d / "train.txt", "w", encoding="utf-8") as f:
        for i in range(0, len(lines), 8):
            f.write("".join(line + "\n" for line in lines[i:i + 8]) + "\n")
    vocab = str(d / "vocab")
    os.makedirs(vocab)
    vocab_dir.train_vocab("wordpiece", lines, vocab, vocab_size=8000, do_lower_case=True)
    vocab_dir.write_report(vocab, "wordpiece", True, lines[:10])
    return [str(d / "train.txt")], lines, vocab


@pytest.fixture(scope="module")
def reference(zh):
    _, lines, vocab = zh
    return WordReference(cached_tokenizer(vocab), lines)


def config(**overrides):
    values = dict(max_seq_length=MAX_LEN, max_predictions_per_seq=MAX_PRED,
                  masked_lm_prob=0.15, dupe_factor=2, random_seed=7, whole_word_masking=True)
    values.update(overrides)
    return PretrainingConfig.of(**values)


@pytest.fixture(scope="module")
def static(zh):
    files, _, vocab = zh
    return (build_shard(files, vocab, config(word_segmenter="jieba"), "train", 0, 1),
            build_shard(files, vocab, config(), "train", 0, 1))


def test_continuations_are_jieba_words_on_every_line(zh):
    from runexp.tasks.vocabulary.chinese_words import word_segmenter
    _, lines, vocab = zh
    tok = cached_tokenizer(vocab)
    ids, counts = tok.encode_lines(lines)
    continues, unsegmented = word_segmenter("jieba", tok).continuations(lines, ids, counts)
    assert unsegmented == []
    starts = np.concatenate([[0], np.cumsum(counts)])
    compared = with_unk = 0
    for i, line in enumerate(lines):
        ours = continues[starts[i]:starts[i + 1]].tolist()
        ref = reference_continues(tok, line, jieba_cut(line))
        if ref is None:  # an [UNK]: aligned through BERT's basic words
            with_unk += 1
            pieces = tok.tokenize(line)
            marked = [p for p, c in zip(pieces, ours) if c]
            assert all(p == "[UNK]" or len(p) == 1 and "\u3400" <= p <= "\u9fff"
                       for p in marked), line
            assert len(marked) == sum(len(w) - 1 for w in jieba_cut(line) if len(w) > 1
                                      and all("\u3400" <= ch <= "\u9fff" for ch in w)), line
            continue
        assert ours == ref, line
        compared += 1
    assert compared > 25_000 and with_unk > 50
    share = continues.mean()
    assert 0.25 < share < 0.45, share  # about a third of the tokens continue a word


def test_mixed_words_unknown_characters_and_misaligned_lines(zh):
    from runexp.tasks.vocabulary.chinese_words import word_segmenter
    _, _, vocab = zh
    tok = cached_tokenizer(vocab)
    words = word_segmenter("jieba", tok)
    # "T恤" mixes a letter with a character: left to WordPiece (as Chinese-BERT-wwm); 䶮 is
    # not in the vocab ([UNK]); "python3" is WordPiece's (## pieces, not marked here).
    line = "使用T恤和python3编程，䶮很少见"
    ids, counts = tok.encode_lines([line])
    continues, unsegmented = words.continuations([line], ids, counts)
    assert unsegmented == []
    pieces = tok.tokenize(line)
    marked = [p for p, c in zip(pieces, continues) if c]
    cut = jieba_cut(line)
    expected = [c for w in cut if len(w) > 1 and all("\u4e00" <= ch <= "\u9fff" for ch in w)
                for c in w[1:]]
    assert "[UNK]" in pieces and marked == expected and "用" in marked and "恤" not in marked
    # A line whose characters do not line up with its tokens gets no mark, and is counted.
    real_cut = words._cut
    words._cut = lambda text: real_cut(text)[1:]
    try:
        lines = ["编程语言", "no chinese here", "数据类型"]
        ids, counts = tok.encode_lines(lines)
        continues, unsegmented = words.continuations(lines, ids, counts)
    finally:
        words._cut = real_cut
    assert unsegmented == [0, 2] and not continues.any()


def test_a_misaligned_line_is_counted_with_its_file_line(zh, tmp_path):
    from runexp.tasks.vocabulary.chinese_words import word_segmenter
    _, _, vocab = zh
    words = word_segmenter("jieba", cached_tokenizer(vocab))
    path = tmp_path / "t.txt"
    path.write_text("数据类型\n编程语言\n\n坏的数据\n文件\n", encoding="utf-8")
    real_cut = words._cut
    words._cut = lambda text: real_cut(text)[1:] if "坏" in text else real_cut(text)
    try:
        index = local_index([str(path)], vocab, word_segmenter="jieba")
    finally:
        words._cut = real_cut
    issues = index.issues()
    assert issues.counts["unsegmented_lines"] == 1
    assert issues.samples["unsegmented_lines"] == [(str(path), 4)]


def test_the_index_keeps_the_mark_in_a_spare_bit(zh):
    files, _, vocab = zh
    assert token_dtype(8000, True) == np.uint16 and continuation_bit(np.uint16) == 1 << 15
    assert token_dtype(40_000) == np.uint16 and token_dtype(40_000, True) == np.int32
    assert continuation_bit(np.int32) == 1 << 30
    index = local_index(files, vocab, word_segmenter="jieba")
    assert index.continuation_bit == 1 << 15 and index.dtype == np.uint16
    assert index.meta["issues"]["counts"]["unsegmented_lines"] == 0
    plain = local_index(files, vocab)
    assert plain.continuation_bit == 0 and "continuation_bit" not in plain.meta
    store, _ = index.shard_store(index.shard_blocks(0, 1), 7, "train")
    plain_store, _ = plain.shard_store(plain.shard_blocks(0, 1), 7, "train")
    assert (store.ids() == plain_store.tokens).all()
    assert store.document(3) == plain_store.document(3)
    flagged = (store.tokens & (1 << 15)) != 0
    assert 0.25 < flagged.mean() < 0.45


def test_static_masks_cover_jieba_words_whole(static, reference):
    (out, stats), _ = static
    counts = check_whole_words(out, reference)
    assert counts["checked"] > 0.9 * len(out), counts
    assert counts["split"] == 0, counts
    assert counts["chinese_words"] > 10_000, counts
    assert stats.issues.counts["unsegmented_lines"] == 0


def test_ngram_masks_cover_jieba_words_whole(zh, reference):
    files, _, vocab = zh
    out, stats = build_shard(files, vocab, config(whole_word_masking=False, ngram_max=3,
                                                  word_segmenter="jieba", dupe_factor=1),
                             "train", 0, 1)
    counts = check_whole_words(out, reference)
    assert counts["split"] == 0 and counts["chinese_words"] > 5000, counts
    assert abs(stats.masked / stats.tokens - 0.15) < 0.02


def test_without_the_segmenter_masks_cut_chinese_words(static, reference):
    """The check has teeth: character masking (no segmenter) cuts jieba's words."""
    _, (out, _) = static
    counts = check_whole_words(out, reference)
    assert counts["split"] > 1000 and counts["chinese_words"] < counts["split"], counts


def test_masking_statistics_stay_in_the_usual_bands(static, zh):
    (out, stats), _ = static
    tok = cached_tokenizer(zh[2])
    # The bands of the whole-word and 80/10/10 tests (test_pretraining_instances.py).
    assert abs(stats.masked / stats.tokens - 0.15) < 0.02, stats.masked / stats.tokens
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
    assert abs(masked / total - 0.8) < 0.015
    assert abs(kept / total - 0.1) < 0.015
    assert abs(replaced / total - 0.1) < 0.015


def test_the_segmenter_changes_the_masks_only(static):
    """Same instances, truncation and labels with and without it: only which positions are
    masked differs (the random draws per batch are the same in number)."""
    (a, sa), (b, sb) = static
    assert len(a) == len(b) and sa.instances == sb.instances and sa.tokens == sb.tokens
    for fa, fb in zip(a, b):
        for name in ("input_mask", "segment_ids", "next_sentence_labels"):
            assert fa[name] == fb[name]
        assert original_ids(fa) == original_ids(fb)
    assert sum(fa != fb for fa, fb in zip(a, b)) > 0.5 * len(a)


def test_dynamic_masking_word_starts_are_jieba_words(zh, reference):
    files, _, vocab = zh
    out, stats = build_shard(files, vocab, config(dynamic_masking=True, word_segmenter="jieba"),
                             "train", 0, 1)
    plain, _ = build_shard(files, vocab, config(dynamic_masking=True), "train", 0, 1)
    assert len(out) == len(plain) == stats.instances > 1000
    checked = fewer = 0
    for f, g in zip(out, plain):
        assert {k: v for k, v in f.items() if k != "word_starts"} == \
            {k: v for k, v in g.items() if k != "word_starts"}
        assert all(a <= b for a, b in zip(f["word_starts"], g["word_starts"]))
        fewer += sum(g["word_starts"]) - sum(f["word_starts"])
        n = sum(f["input_mask"])
        starts = reference.word_starts(f["input_ids"], n)
        if starts is None:
            continue
        assert f["word_starts"] == [int(s) for s in starts], f["input_ids"]
        checked += 1
    assert checked > 0.9 * len(out) and fewer > 0.2 * stats.tokens


def test_a_corpus_without_chinese_gives_the_same_records(small_corpus, wordpiece_dir):
    files = [os.path.join(small_corpus, "train.txt")]
    for overrides in ({}, {"dynamic_masking": True}):
        a = build_shard(files, wordpiece_dir, config(word_segmenter="jieba", **overrides),
                        "train", 0, 1)
        b = build_shard(files, wordpiece_dir, config(**overrides), "train", 0, 1)
        assert a[0] == b[0] and a[1].counts() == b[1].counts()


def test_the_spec_needs_word_level_masking_and_masking_json_leaves_it_out(zh):
    with pytest.raises(ValueError, match="word_segmenter finds the words"):
        MaskingSpec(word_segmenter="jieba")
    MaskingSpec(word_segmenter="jieba", ngram_max=2)
    spec = config(word_segmenter="jieba", dynamic_masking=True)
    masking = spec.masking_spec(cached_tokenizer(zh[2]))
    assert "word_segmenter" not in masking and masking["whole_word_masking"] is True


def test_a_sentencepiece_vocab_is_refused(spm_dir):
    from runexp.tasks.vocabulary.chinese_words import word_segmenter
    with pytest.raises(ValueError, match="needs a WordPiece vocab"):
        word_segmenter("jieba", cached_tokenizer(spm_dir))
