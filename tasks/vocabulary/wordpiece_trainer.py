"""Training a true WordPiece ``vocab.txt``: the vocabulary every BERT tokenizer reads alike.

The text is first split as google-research/bert's ``BasicTokenizer`` splits it (runexp's
implementation, tasks/vocabulary/wordpiece.py: control characters dropped, CJK characters one by one,
lower-casing and accent stripping when ``do_lower_case``, punctuation split off), so the
vocabulary is learnt on the very words WordPiece will later see. SentencePiece's BPE trainer
(deterministic, multi-threaded, in C++) then learns the word pieces on those words, and its
pieces are written in WordPiece's convention, as QARiB and others convert them: a piece that
starts a word (``▁foo``) is ``foo``, one inside a word (``bar``) is ``##bar``; every
character the vocabulary covers exists in both forms, so no covered word falls back to
``[UNK]``.

The result is a plain ``vocab.txt`` (line i = id i; ``[PAD]``, ``[UNK]``, ``[CLS]``,
``[SEP]``, ``[MASK]`` at 0-4; then the characters, their ``##`` forms, then the learnt pieces
in the order BPE learnt them). runexp tokenises with its implementation of google-research/
bert's ``FullTokenizer`` over that file, so the ids any consumer computes from the exported
``vocab.txt`` (``FullTokenizer``, ``tensorflow_text.BertTokenizer`` /
``seqio.BertWordPieceVocabulary``, Hugging Face's ``BertTokenizer``) are the ids the model
was trained on. (Hugging Face ``tokenizers``' WordPiece trainer was tried first: its output
order, and at ties its pieces, change from one process to the next.)

Usage:
    train_wordpiece(sentences, out_dir, vocab_size=30522, do_lower_case=True)
"""

from __future__ import annotations

import io
import os
from typing import Sequence

from runexp.compiler.specs.vocab import SPECIAL_TOKENS
from runexp.tasks.vocabulary.wordpiece import WordPieceTokenizer

VOCAB_FILE = "vocab.txt"
CHARACTER_COVERAGE = 0.9995
_WORD_START = "\u2581"  # SentencePiece's "▁"


def _words(sentences: Sequence[str], do_lower_case: bool) -> list[str]:
    """Each sentence as BERT's BasicTokenizer splits it, words joined by single spaces."""

    basic = WordPieceTokenizer({}, do_lower_case=do_lower_case)
    out = []
    for sentence in sentences:
        words = basic.basic_tokenize(sentence)
        if words:
            out.append(" ".join(words))
    return out


def _pieces(lines: Sequence[str], vocab_size: int, num_threads: int) -> list[str]:
    """SentencePiece BPE pieces learnt on ``lines`` (space-separated words), best first."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type="bpe", character_coverage=CHARACTER_COVERAGE, hard_vocab_limit=False,
        normalization_rule_name="identity",  # the BasicTokenizer normalised already
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, split_digits=False,
        max_sentencepiece_length=24, num_threads=num_threads,
        shuffle_input_sentence=False, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())
            if not processor.is_unknown(i) and not processor.is_control(i)]


def wordpiece_tokens(pieces: Sequence[str], vocab_size: int) -> list[str]:
    """The vocab.txt lines of SentencePiece ``pieces`` (module docstring), at most
    ``vocab_size`` of them: specials, characters, ``##`` characters, then pieces."""
    chars, merged = [], []
    for piece in pieces:
        body = piece[1:] if piece.startswith(_WORD_START) else piece
        if not body:
            continue  # the bare word-start marker
        if len(body) == 1:
            if body not in chars:
                chars.append(body)
        else:
            merged.append(body if piece.startswith(_WORD_START) else "##" + body)
    alphabet = sorted(set(chars))
    tokens = list(SPECIAL_TOKENS) + alphabet + ["##" + c for c in alphabet]
    seen = set(tokens)
    for token in merged:
        if len(tokens) >= vocab_size:
            break
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    return tokens


def train_wordpiece(sentences: Sequence[str], out_dir: str, vocab_size: int,
                    do_lower_case: bool, num_threads: int = 2) -> str:
    """Trains on ``sentences`` and writes ``<out_dir>/vocab.txt``; returns its path."""
    lines = _words(sentences, do_lower_case)
    if not lines:
        raise ValueError("no text to train a vocabulary on")
    tokens = wordpiece_tokens(_pieces(lines, vocab_size, num_threads), vocab_size)
    path = os.path.join(out_dir, VOCAB_FILE)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(token + "\n" for token in tokens)
    return path
