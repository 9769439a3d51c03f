"""A vocabulary runexp trains is read exactly as runexp trained with it: google-research/bert's
FullTokenizer and seqio's BertWordPieceVocabulary over the exported vocab.txt give the ids
runexp's tokenizer gave, on every held-out line of the quickstart corpus and of a Chinese
corpus."""

import os
import random
import unicodedata

import pytest
from tests.support.chinese_corpus import CATALOGS, chinese_sentences

from runexp.tasks.vocabulary import vocab_dir
from runexp.tasks.sources.text_documents import iter_documents
from runexp.tasks.vocabulary.tokenizer import load_tokenizer

bert_tokenization = pytest.importorskip("bert.tokenization")


def _lines(path):
    return [line for doc in iter_documents([path]) for line in doc]


@pytest.fixture(scope="module")
def english(small_corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("wp_en"))
    train = _lines(os.path.join(small_corpus, "train.txt"))
    vocab_dir.train_vocab("wordpiece", train, out, vocab_size=4000, do_lower_case=True)
    held = _lines(os.path.join(small_corpus, "heldout.txt"))
    vocab_dir.write_report(out, "wordpiece", True, held)
    return out, held


@pytest.fixture(scope="module")
def chinese(tmp_path_factory):
    sentences = chinese_sentences()
    if len(sentences) < 5000:
        pytest.fail(f"too little Chinese text in {CATALOGS} ({len(sentences)} lines): the "
                    "machine's zh_CN translations are this test's corpus")
    random.Random(0).shuffle(sentences)
    held, train = sentences[:2000], sentences[2000:]
    out = str(tmp_path_factory.mktemp("wp_zh"))
    vocab_dir.train_vocab("wordpiece", train, out, vocab_size=8000, do_lower_case=True)
    vocab_dir.write_report(out, "wordpiece", True, held)
    return out, held


def _full_tokenizer(vocab, lower):
    bert_tokenization.FLAGS.mark_as_parsed()  # its scripts parse --preserve_unused_tokens
    return bert_tokenization.FullTokenizer(vocab_file=os.path.join(vocab, "vocab.txt"),
                                           do_lower_case=lower)


@pytest.mark.parametrize("corpus", ["english", "chinese"])
def test_full_tokenizer_gives_the_training_ids(corpus, request):
    vocab, held = request.getfixturevalue(corpus)
    ours = load_tokenizer(vocab)
    theirs = _full_tokenizer(vocab, True)
    differ = [line for line in held
              if theirs.convert_tokens_to_ids(theirs.tokenize(line)) != ours.encode(line)]
    assert not differ, differ[:5]
    report = vocab_dir.measure(ours, held)
    assert report["unk_rate"] < 0.01, report


@pytest.mark.parametrize("corpus", ["english", "chinese"])
def test_seqio_bert_wordpiece_vocabulary_gives_the_training_ids(corpus, request):
    pytest.importorskip("seqio")
    from runexp.tasks.vocabulary.seqio_vocabulary import seqio_vocabulary

    import tensorflow as tf

    vocab, held = request.getfixturevalue(corpus)
    ours = load_tokenizer(vocab)
    theirs = seqio_vocabulary(vocab)
    # Its tokenizer (tensorflow_text's BertTokenizer), flattened: seqio's own encode()
    # squeezes a padded [words, pieces] tensor, so a word of several pieces comes back padded
    # with zeros (seqio 0.0.20); the pieces themselves are what is compared here.
    batch = theirs.tf_tokenizer.tokenize(tf.constant(held))
    ids = [row.flat_values.numpy().tolist() for row in batch]
    differ = [line for line, got in zip(held, ids) if got != ours.encode(line)]
    # tensorflow_text lower-cases by NFKC case folding, google-research/bert by str.lower():
    # full-width punctuation (，：（）) becomes ASCII in one and not in the other. That is the
    # only difference allowed: every other line is identical.
    folded = [line for line in differ if any(
        unicodedata.normalize("NFKC", ch).lower() != ch.lower() for ch in line)]
    assert folded == differ, [line for line in differ if line not in folded][:5]
    if corpus == "english":
        assert not differ


def test_chinese_characters_are_one_token_each(chinese):
    vocab, held = chinese
    tok = load_tokenizer(vocab)
    line = next(line for line in held if sum("\u4e00" <= c <= "\u9fff" for c in line) >= 6)
    pieces = tok.tokenize(line)
    cjk = [p for p in pieces if any("\u4e00" <= c <= "\u9fff" for c in p)]
    assert cjk and all(len(p.lstrip("#")) == 1 for p in cjk), pieces


@pytest.mark.parametrize("corpus", ["english", "chinese"])
def test_hugging_face_bert_tokenizer_gives_the_training_ids(corpus, request):
    """Hugging Face's fast BERT tokenizer (the `tokenizers` library behind transformers'
    BertTokenizerFast), over the exported vocab.txt."""
    tokenizers = pytest.importorskip("tokenizers")

    vocab, held = request.getfixturevalue(corpus)
    ours = load_tokenizer(vocab)
    theirs = tokenizers.BertWordPieceTokenizer(os.path.join(vocab, "vocab.txt"),
                                               lowercase=True)
    got = theirs.encode_batch(held, add_special_tokens=False)
    differ = [line for line, enc in zip(held, got) if enc.ids != ours.encode(line)]
    assert not differ, differ[:5]
