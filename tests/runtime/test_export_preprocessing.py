"""The exported preprocessing SavedModel tokenises real text exactly as runexp does.

Text: lines of the quickstart corpus (tasks/sources/stdlib_corpus.py: every sixth stdlib module's
docstring and comment sentences, and all of pydoc's help topics, which hold most of the
corpus's non-ASCII text: curly quotes, ellipses, accents, ß) and hand-written hard cases.
Vocabs trained on those lines: SentencePiece models (unigram, lower-cased; BPE, cased) and
WordPiece vocab.txt files of real ``##`` pieces (lower-cased and cased). Each is exported with
``save_preprocessing``, loaded with ``tf.saved_model.load``, and its ``tokenize`` ids must
equal ``load_tokenizer(vocab_dir).encode`` on every line; for WordPiece also
google-research/bert's ``FullTokenizer`` over the same vocab.txt. Packing (``__call__``,
``bert_pack_inputs``) must equal the finetune stage's ``encode_examples``, truncation
included.
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from runexp.runtime.export import preprocessing
from runexp.tasks.sources import stdlib_corpus
from runexp.tasks.sources.classification import _truncate_pair, encode_examples
from runexp.tasks.vocabulary.tokenizer import load_tokenizer

try:
    from bert import tokenization as bert_tokenization
except ImportError:  # pragma: no cover - depends on the environment
    bert_tokenization = None

HARD_LINES = [
    "Héllo, naïve café — Ångström's résumé at the Zürich Straße.",
    "中文字符 mixed with 日本語のテキスト and 한국어 text.",
    "Control\x00chars\x07 and\ttabs\r\nand\x1b escapes \ufffd replaced.",
    "Non-breaking\u00a0space, ideographic\u3000space, line\u2028separator, zero\u200bwidth.",
    "Form\x0cfeed, soft\u00adhyphen, private\ue000use, tag\U000E0041char.",
    "¿Qué pasa? «quoted» “smart quotes” ‘single’ (parens) [brackets] {braces} <angle>.",
    "The parameter ´timeout´ must be numeric; try…finally, 0, 1, …, n.",
    "Greek ΑΣ.Β ΟΔΟΣ, Cyrillic Привет мир, Turkish İstanbul ı, ligature ﬁnance, full-width Ｆｕｌｌ.",
    "Emoji 🙂 and math ∑ ∞ ≤ ≥ ± × ÷ and arrows → ← ↔.",
    "x" * 250 + " after a word of 250 characters, " + "y" * 200 + " is exactly 200, "
    + "é" * 150 + " is 150 characters in 300 bytes.",
    "Combining: e\u0301 o\u0308 A\u030a, precomposed: é ö Å; Vietnamese: Tiếng Việt.",
    "   leading and trailing whitespace   ",
    "",
    "UPPER lower MiXeD CamelCase snake_case dotted.name.path e.g. i.e. etc.",
    "FileInput([files[, inplace[, backup]]], *, mode=None) and DD-Mmm-YYYY, U+0001..U+007F.",
]


@pytest.fixture(scope="module")
def lines():
    """~7,400 corpus lines (about 1,000 with non-ASCII characters) and the hard cases."""
    out = []
    for _, path in itertools.islice(stdlib_corpus.iter_stdlib_modules(), 0, None, 6):
        docstrings, comments = stdlib_corpus.module_sentences(path)
        out += docstrings + comments
    out += [s for _, docs, comments in stdlib_corpus._topic_documents() for s in docs + comments]
    assert len(out) > 5000 and sum(not line.isascii() for line in out) > 200
    return out + HARD_LINES


def _train_sentencepiece(lines, out, model_type, lower, vocab_size=2000):
    """spm.model trained as the vocab stage trains it (tasks/vocabulary/vocab_dir.py: runexp's special
    pieces, case folded into the normalisation when uncased) and its report.json."""
    import io

    import sentencepiece as spm

    os.makedirs(out)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="[PAD]",
        unk_piece="[UNK]", control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        character_coverage=0.9995, hard_vocab_limit=False, num_threads=2,
        normalization_rule_name="nmt_nfkc_cf" if lower else "nmt_nfkc",
        shuffle_input_sentence=False, minloglevel=2)
    with open(os.path.join(out, "spm.model"), "wb") as f:
        f.write(model.getvalue())
    _write_report(out, "sentencepiece", lower)
    return out


def _write_report(out, vocab_type, lower):
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"type": vocab_type, "do_lower_case": lower}, f)


def _wordpiece_from(spm_dir, out, lower):
    """A WordPiece vocab.txt of real ## pieces: the SentencePiece model's pieces in WordPiece
    spelling ("▁word" -> "word", "piece" -> "##piece"), BERT's specials first."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(spm_dir, "spm.model"))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        token = piece[1:] if piece.startswith("\u2581") else "##" + piece
        if token.strip("#") and token not in tokens and not piece.startswith("["):
            tokens.append(token)
    os.makedirs(out)
    with open(os.path.join(out, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    _write_report(out, "wordpiece", lower)
    return out


@pytest.fixture(scope="module")
def vocab_dirs(lines, tmp_path_factory):
    """{name: vocab dir}: SentencePiece unigram (uncased) and BPE (cased); WordPiece
    vocab.txt files, uncased and cased."""
    root = tmp_path_factory.mktemp("vocabs")
    dirs = {
        "sentencepiece": _train_sentencepiece(lines, str(root / "spm"), "unigram", True),
        "sentencepiece_bpe_cased": _train_sentencepiece(lines, str(root / "bpe"), "bpe", False),
        "spm_cased": _train_sentencepiece(lines, str(root / "spm_cased"), "unigram", False),
    }
    dirs["wordpiece"] = _wordpiece_from(dirs["sentencepiece"], str(root / "wp"), True)
    dirs["wordpiece_cased"] = _wordpiece_from(dirs["spm_cased"], str(root / "wp_cased"), False)
    return dirs


def _export(vocab_dir: str, path: str, seq_length: int = 128):
    preprocessing.save_preprocessing(vocab_dir, seq_length, path)
    return tf.saved_model.load(path)


@pytest.mark.parametrize("name", ["wordpiece", "wordpiece_cased", "sentencepiece",
                                  "sentencepiece_bpe_cased"])
def test_tokenize_gives_runexps_ids_on_real_text(name, lines, vocab_dirs, tmp_path):
    vocab_dir = vocab_dirs[name]
    ours = load_tokenizer(vocab_dir)
    loaded = _export(vocab_dir, str(tmp_path / "preprocessing"))
    got = loaded.tokenize(tf.constant(lines)).to_list()
    want = [ours.encode(line) for line in lines]
    mismatches = [(line, g, w) for line, g, w in zip(lines, got, want) if g != w]
    assert not mismatches, mismatches[:3]
    pieces = sum(map(len, want))
    assert pieces > 100_000 and sum(w.count(ours.unk_id) for w in want) > 0  # [UNK] path ran
    assert loaded.do_lower_case.numpy() == ours.do_lower_case
    vocab_name = "spm.model" if name.startswith("sentencepiece") else "vocab.txt"
    with open(loaded.vocab_file.asset_path.numpy().decode(), "rb") as f, \
            open(os.path.join(vocab_dir, vocab_name), "rb") as g:
        assert f.read() == g.read()
    assert hasattr(loaded, "sp_model_file") == name.startswith("sentencepiece")

    if name.startswith("wordpiece") and bert_tokenization is not None:
        # google-research/bert's FullTokenizer over the same vocab.txt (pure Python, slow:
        # on every line with a non-ASCII or control character and every fourth other one;
        # tests/tasks/test_parity_reference.py compares it with runexp's on all of them).
        bert_tokenization.FLAGS.mark_as_parsed()
        theirs = bert_tokenization.FullTokenizer(
            vocab_file=os.path.join(vocab_dir, "vocab.txt"), do_lower_case=ours.do_lower_case)
        chosen = [i for i, line in enumerate(lines)
                  if i % 4 == 0 or not (line.isascii() and line.isprintable())]
        differ = [lines[i] for i in chosen
                  if got[i] != theirs.convert_tokens_to_ids(theirs.tokenize(lines[i]))]
        # Every line, the private-use and unassigned characters included (BERT deletes Cc
        # and Cf only, and so does runexp).
        assert not differ, differ[:3]


def test_packing_is_the_finetune_encoding(lines, vocab_dirs, tmp_path):
    """Single texts and pairs, cut hard (20 tokens), as encode_examples encodes them."""
    vocab_dir = vocab_dirs["wordpiece"]
    tokenizer = load_tokenizer(vocab_dir)
    loaded = _export(vocab_dir, str(tmp_path / "preprocessing"), seq_length=20)
    assert int(loaded.seq_length.numpy()) == 20
    firsts, seconds = lines[:400], lines[400:800]

    want = encode_examples([((a,), "x") for a in firsts], tokenizer, ["x"], 20)
    got = loaded(tf.constant(firsts))
    assert set(got) == {"input_word_ids", "input_mask", "input_type_ids"}
    for ours, theirs in (("input_word_ids", "input_ids"), ("input_mask", "input_mask"),
                         ("input_type_ids", "segment_ids")):
        np.testing.assert_array_equal(got[ours].numpy(), want[theirs])
    signature = loaded.signatures["serving_default"](text=tf.constant(firsts))
    np.testing.assert_array_equal(signature["input_word_ids"].numpy(), want["input_ids"])

    pairs = encode_examples([((a, b), "x") for a, b in zip(firsts, seconds)], tokenizer,
                            ["x"], 20)
    packed = loaded.bert_pack_inputs([loaded.tokenize(tf.constant(firsts)),
                                      loaded.tokenize(tf.constant(seconds))])
    np.testing.assert_array_equal(packed["input_word_ids"].numpy(), pairs["input_ids"])
    np.testing.assert_array_equal(packed["input_mask"].numpy(), pairs["input_mask"])
    np.testing.assert_array_equal(packed["input_type_ids"].numpy(), pairs["segment_ids"])
    assert (pairs["segment_ids"].max(axis=1) == 1).all()  # every pair kept some of b

    # Another length for the same model.
    longer = encode_examples([((a, b), "x") for a, b in zip(firsts, seconds)], tokenizer,
                             ["x"], 48)
    packed = loaded.bert_pack_inputs([loaded.tokenize(tf.constant(firsts)),
                                      loaded.tokenize(tf.constant(seconds))], seq_length=48)
    np.testing.assert_array_equal(packed["input_word_ids"].numpy(), longer["input_ids"])


def test_pair_truncation_is_berts_for_every_pair_of_lengths():
    """The closed form in ``truncate`` against BERT's token-by-token loop."""
    lengths = [(a, b) for a in range(0, 23) for b in range(0, 23)]
    for seq_length in (3, 4, 5, 8, 9, 16):
        la = [a for a, _ in lengths]
        lb = [b for _, b in lengths]
        first = tf.RaggedTensor.from_row_lengths(tf.range(sum(la)), la)
        second = tf.RaggedTensor.from_row_lengths(tf.range(sum(lb)), lb)
        ka, kb = preprocessing.truncate([first, second], seq_length)
        for (a, b), got_a, got_b in zip(lengths, ka.row_lengths().numpy(),
                                        kb.row_lengths().numpy()):
            x, y = list(range(a)), list(range(b))
            _truncate_pair(x, y, seq_length - 3)
            assert (got_a, got_b) == (len(x), len(y)), (seq_length, a, b)
