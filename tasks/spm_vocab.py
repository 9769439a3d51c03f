"""Build a vocab directory: train SentencePiece, or adopt a given model or BERT vocab.txt.

A vocab directory (see ``tokenizer.py``) holds ``vocab.txt`` in BERT's layout (line i is the
token of id i), ``spm.model`` for SentencePiece vocabs, and ``report.json`` with diagnostics
measured before any accelerator time is spent: the UNK rate and word pieces per
whitespace-separated word on held-out text.

SentencePiece models runexp trains have ``[PAD]``=0, ``[UNK]``=1 and the control symbols
``[CLS]``, ``[SEP]``, ``[MASK]`` at 2, 3, 4 (control symbols are never produced from text, so a
literal "[SEP]" in the corpus stays text). Their ``vocab.txt`` writes ``▁foo`` as ``foo`` and a
non-initial ``bar`` as ``##bar``, the WordPiece convention.

Usage:
    train_sentencepiece(train_files, out_dir, vocab_size=8000, do_lower_case=True,
                                 model_type="unigram", max_sentences=300_000, seed=0)
    vocab_type = adopt_vocab("/path/vocab.txt", out_dir)
    report = write_report(out_dir, vocab_type, do_lower_case=True, heldout_lines=lines)
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from typing import Iterable, Optional, Sequence

from runexp.tasks.text_files import sample_lines, sample_sentences
from runexp.tasks.tokenizer import (REPORT_FILE, SPECIAL_TOKENS, SPM_FILE, SPM_WORD_START,
                                    VOCAB_FILE, Tokenizer, load_tokenizer)

UNK_WARNING_RATE = 0.01
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")  # byte-fallback pieces keep their spelling
_SAMPLE_WORDS = ("function", "returns", "asynchronous", "unittest", "tkinter", "émigré")


def train_sentencepiece(train_files: Sequence[str], out_dir: str, vocab_size: int,
                        do_lower_case: bool, model_type: str = "unigram",
                        max_sentences: int = 300_000, seed: int = 0,
                        num_threads: int = 2,
                        documents: Optional[Iterable[Sequence[str]]] = None) -> None:
    """Trains ``spm.model`` in-process on a seeded sample of sentences and writes
    ``vocab.txt``. The sentences are the lines of ``train_files`` (sentence_lines), or those
    of ``documents`` (lists of sentences, read in their format) when given."""
    import sentencepiece as spm
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
    lines = (sample_lines(train_files, max_sentences, seed) if documents is None
             else sample_sentences(documents, max_sentences, seed))
    if not lines:
        raise ValueError(f"no text in {list(train_files) or 'the documents given'}")
    if do_lower_case:
        lines = [line.lower() for line in lines]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
        pad_piece="[PAD]", unk_piece="[UNK]", control_symbols=list(SPECIAL_TOKENS[2:]),
        character_coverage=0.9995, hard_vocab_limit=False, num_threads=num_threads,
        shuffle_input_sentence=False, minloglevel=2)
    with open(os.path.join(out_dir, SPM_FILE), "wb") as f:
        f.write(model.getvalue())
    write_wordpiece_vocab(os.path.join(out_dir, SPM_FILE), os.path.join(out_dir, VOCAB_FILE))


def spm_piece_to_wordpiece(piece: str) -> str:
    """``▁foo`` -> ``foo``; ``bar`` -> ``##bar``; specials, byte pieces, a bare ``▁`` unchanged."""
    if piece in SPECIAL_TOKENS or piece == SPM_WORD_START or _BYTE_PIECE.fullmatch(piece):
        return piece
    if piece.startswith(SPM_WORD_START):
        return piece[len(SPM_WORD_START):]
    return "##" + piece


def write_wordpiece_vocab(model_path: str, vocab_path: str) -> None:
    """Writes the BERT-layout vocab.txt of a SentencePiece model (line i = id i)."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=model_path)
    seen: set[str] = set()
    with open(vocab_path, "w", encoding="utf-8", newline="\n") as f:
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            token = spm_piece_to_wordpiece(piece)
            if token in seen or not token.strip():
                token = piece  # keep every line unique and non-empty, so line i stays id i
            seen.add(token)
            f.write(token + "\n")


def adopt_vocab(vocab_path: str, out_dir: str) -> str:
    """Copies a given ``.model`` (SentencePiece) or ``vocab.txt`` (WordPiece); returns the type."""
    if vocab_path.endswith(".model"):
        shutil.copyfile(vocab_path, os.path.join(out_dir, SPM_FILE))
        write_wordpiece_vocab(os.path.join(out_dir, SPM_FILE), os.path.join(out_dir, VOCAB_FILE))
        return "sentencepiece"
    shutil.copyfile(vocab_path, os.path.join(out_dir, VOCAB_FILE))
    return "wordpiece"


def measure(tokenizer: Tokenizer, lines: Sequence[str]) -> dict:
    """UNK rate (share of pieces that are UNK) and pieces per whitespace word."""
    pieces = unks = words = 0
    for line in lines:
        ids = tokenizer.encode(line)
        pieces += len(ids)
        unks += sum(1 for i in ids if i == tokenizer.unk_id)
        words += len(line.split())
    return {"unk_rate": unks / max(pieces, 1), "pieces_per_word": pieces / max(words, 1),
            "measured_on_lines": len(lines), "measured_on_pieces": pieces}


def write_report(out_dir: str, vocab_type: str, do_lower_case: bool,
                 heldout_lines: Sequence[str], measured_on: str = "held-out text") -> dict:
    """Writes report.json (type, sizes, diagnostics, a few words' pieces) and returns it.

    ``measured_on`` names the text the diagnostics come from (in the warning)."""
    report = {"type": vocab_type, "do_lower_case": do_lower_case}
    with open(os.path.join(out_dir, REPORT_FILE), "w", encoding="utf-8") as f:
        json.dump(report, f)  # load_tokenizer needs type and casing first
    tokenizer = load_tokenizer(out_dir)
    report["vocab_size"] = tokenizer.vocab_size
    report.update(measure(tokenizer, heldout_lines))
    report["sample_words"] = {w: tokenizer.tokenize(w) for w in _SAMPLE_WORDS}
    report["special_ids"] = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    if report["unk_rate"] > UNK_WARNING_RATE:
        report["warning"] = (
            f"UNK rate {report['unk_rate']:.2%} on {measured_on} is above "
            f"{UNK_WARNING_RATE:.0%} ({report['measured_on_pieces']:,} pieces of "
            f"{report['measured_on_lines']:,} lines): words the vocab cannot spell become "
            "[UNK] and are lost to the model; check do_lower_case and the vocab's language")
    with open(os.path.join(out_dir, REPORT_FILE), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True, ensure_ascii=False)
    return report
