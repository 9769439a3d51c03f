"""A vocab stage's directory: train a vocabulary or adopt one, and report on it.

A vocab directory (see ``tokenizer.py``) holds one vocabulary: ``vocab.txt`` (WordPiece,
BERT's layout: line i is the token of id i; what runexp trains by default,
tasks/vocabulary/wordpiece_trainer.py) or ``spm.model`` (SentencePiece, ALBERT-style, on request; then
no ``vocab.txt`` exists to mislead a consumer into reading SentencePiece pieces as
WordPiece); and ``report.json``, with diagnostics measured before any accelerator time is
spent: the UNK rate and word pieces per whitespace-separated word on held-out text.

Vocabularies runexp trains have ``[PAD]``=0, ``[UNK]``=1, ``[CLS]``, ``[SEP]``, ``[MASK]`` at
2, 3, 4 (SentencePiece: control symbols, never produced from text, so a literal "[SEP]" in
the corpus stays text). An adopted SentencePiece model may spell the padding and unknown
pieces otherwise (ALBERT's: ``<pad>``=0, ``<unk>``=1): they play those roles all the same, and
report.json's ``special_pieces`` names the piece of each role.

Usage:
    train_vocab("wordpiece", sentences, out_dir, vocab_size=8000, do_lower_case=True)
    vocab_type = adopt_vocab("/path/vocab.txt", out_dir)
    report = write_report(out_dir, vocab_type, do_lower_case=True, heldout_lines=lines)
"""

from __future__ import annotations

import io
import json
import os
import shutil
from typing import Sequence

from runexp.compiler.formats.huggingface_dir import TOKENIZER_FILE, wordpiece_vocab
from runexp.tasks.vocabulary.tokenizer import (REPORT_FILE, SPECIAL_TOKENS, SPM_FILE, VOCAB_FILE,
                                    Tokenizer, load_tokenizer)
from runexp.tasks.vocabulary.wordpiece_trainer import train_wordpiece

UNK_WARNING_RATE = 0.01
_SAMPLE_WORDS = ("function", "returns", "asynchronous", "unittest", "tkinter", "émigré")


def train_sentencepiece(sentences: Sequence[str], out_dir: str, vocab_size: int,
                        do_lower_case: bool, model_type: str = "unigram",
                        num_threads: int = 2) -> None:
    """Trains ``spm.model`` in-process on ``sentences`` (ALBERT-style: the model is the only
    vocabulary; no vocab.txt). Lower-casing is folded into the model's normalisation
    (``nmt_nfkc_cf``), so a consumer using the model alone lower-cases as training did."""
    import sentencepiece as spm
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
    if not sentences:
        raise ValueError("no text to train a vocabulary on")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
        pad_piece="[PAD]", unk_piece="[UNK]", control_symbols=list(SPECIAL_TOKENS[2:]),
        character_coverage=0.9995, hard_vocab_limit=False, num_threads=num_threads,
        normalization_rule_name="nmt_nfkc_cf" if do_lower_case else "nmt_nfkc",
        shuffle_input_sentence=False, minloglevel=2)
    with open(os.path.join(out_dir, SPM_FILE), "wb") as f:
        f.write(model.getvalue())


def train_vocab(vocab_type: str, sentences: Sequence[str], out_dir: str, vocab_size: int,
                do_lower_case: bool, model_type: str = "unigram", num_threads: int = 2) -> str:
    """Trains the vocabulary of ``vocab_type`` ("wordpiece": vocab.txt, the default;
    "sentencepiece": spm.model) into ``out_dir``; returns the type."""
    if vocab_type == "wordpiece":
        train_wordpiece(sentences, out_dir, vocab_size, do_lower_case, num_threads)
    elif vocab_type == "sentencepiece":
        train_sentencepiece(sentences, out_dir, vocab_size, do_lower_case, model_type,
                            num_threads)
    else:
        raise ValueError(f"vocab_type must be 'wordpiece' or 'sentencepiece', got {vocab_type!r}")
    return vocab_type


def adopt_vocab(vocab_path: str, out_dir: str) -> str:
    """Copies a given ``.model`` (SentencePiece) or ``vocab.txt`` (WordPiece), or writes the
    vocab.txt of a Hugging Face ``tokenizer.json``'s WordPiece model; returns the type."""
    if vocab_path.endswith(".model"):
        shutil.copyfile(vocab_path, os.path.join(out_dir, SPM_FILE))
        return "sentencepiece"
    if os.path.basename(vocab_path) == TOKENIZER_FILE:
        with open(os.path.join(out_dir, VOCAB_FILE), "w", encoding="utf-8") as f:
            f.writelines(token + "\n" for token in wordpiece_vocab(vocab_path))
        return "wordpiece"
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
    report["special_ids"] = tokenizer.special_ids()
    # Which piece plays each role: an adopted model may spell them otherwise (ALBERT: <pad>).
    report["special_pieces"] = tokenizer.special_pieces()
    if report["unk_rate"] > UNK_WARNING_RATE:
        report["warning"] = (
            f"UNK rate {report['unk_rate']:.2%} on {measured_on} is above "
            f"{UNK_WARNING_RATE:.0%} ({report['measured_on_pieces']:,} pieces of "
            f"{report['measured_on_lines']:,} lines): words the vocab cannot spell become "
            "[UNK] and are lost to the model; check do_lower_case and the vocab's language")
    with open(os.path.join(out_dir, REPORT_FILE), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True, ensure_ascii=False)
    return report
