"""The one tokenizer interface of runexp, over a vocab stage's directory.

A vocab directory holds ``report.json`` (``type``: "sentencepiece" or "wordpiece",
``do_lower_case``) and the vocabulary: ``vocab.txt`` (WordPiece) or ``spm.model``
(SentencePiece). ``load_tokenizer`` picks the implementation; both expose the same methods
and special ids.

BERT's special tokens are roles (``SPECIAL_TOKENS``): a vocab.txt spells them ``[PAD]``,
``[UNK]``, ... ; a SentencePiece model's unknown and padding pieces play ``[UNK]`` and
``[PAD]`` whatever their spelling (``<unk>``, ``<pad>`` in ALBERT's and T5's models, see
compiler/vocab_roles.py), and ``special_pieces`` says which piece plays which role.

Usage:
    tok = load_tokenizer(vocab_dir)
    ids = tok.encode("Return the value.")
    tok.cls_id, tok.sep_id, tok.mask_id, tok.is_word_start(ids[1])

Light: no TensorFlow (SentencePiece's own Python module only).
"""

from __future__ import annotations

import json
import os
from itertools import chain
from typing import TYPE_CHECKING, Sequence

from runexp.compiler.specs.vocab import SPECIAL_TOKENS  # noqa: F401 - re-exported
from runexp.compiler.vocab_roles import MISSING_ROLES_HINT, sentencepiece_roles
from runexp.tasks.vocabulary.wordpiece import WordPieceTokenizer, load_vocab

if TYPE_CHECKING:  # annotations only
    import numpy as np

REPORT_FILE = "report.json"
VOCAB_FILE = "vocab.txt"
SPM_FILE = "spm.model"
SPM_WORD_START = "\u2581"  # "▁"


class Tokenizer:
    """Text to ids, special ids, and the word-start test whole-word masking needs."""

    do_lower_case: bool
    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    def tokenize(self, text: str) -> list[str]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_lines(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``encode`` of many lines at once, the preprocess hot path: (the ids of all lines
        concatenated, int32; the number of ids of each line, int32)."""
        import numpy as np
        encoded = self._encode_many(lines)
        counts = np.fromiter(map(len, encoded), np.int32, len(encoded))
        return np.fromiter(chain.from_iterable(encoded), np.int32), counts

    def _encode_many(self, lines: Sequence[str]) -> list:
        return [self.encode(line) for line in lines]

    def id_to_token(self, i: int) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int:
        """The id of ``token``; a role's name (``[UNK]``) gives the id of the piece that
        plays it when no piece is spelled so."""
        raise NotImplementedError

    def special_pieces(self) -> dict[str, str]:
        """{role: the piece that plays it}, in SPECIAL_TOKENS order."""
        return {role: self.id_to_token(i) for role, i in self.special_ids().items()}

    def special_ids(self) -> dict[str, int]:
        """{role: id}, in SPECIAL_TOKENS order."""
        return dict(zip(SPECIAL_TOKENS, (self.pad_id, self.unk_id, self.cls_id, self.sep_id,
                                         self.mask_id)))

    def is_word_start(self, token_id: int) -> bool:
        raise NotImplementedError

    def word_start_table(self) -> list[bool]:
        """``is_word_start`` for every id, for vectorised whole-word masking."""
        return [self.is_word_start(i) for i in range(self.vocab_size)]

    def _set_special_ids(self, ids: dict[str, int]) -> None:
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            ids[t] for t in SPECIAL_TOKENS)


class WordPieceVocab(Tokenizer):
    """A BERT ``vocab.txt`` with BERT's FullTokenizer rules."""

    def __init__(self, vocab_path: str, do_lower_case: bool):
        self.vocab = load_vocab(vocab_path)
        self._inverse = {i: t for t, i in self.vocab.items()}
        self.vocab_size = max(self._inverse) + 1
        self.do_lower_case = do_lower_case
        self._tokenizer = WordPieceTokenizer(self.vocab, do_lower_case)
        missing = [t for t in SPECIAL_TOKENS if t not in self.vocab]
        if missing:
            raise ValueError(f"{vocab_path} has no {', '.join(missing)} token")
        self._set_special_ids({t: self.vocab[t] for t in SPECIAL_TOKENS})

    def tokenize(self, text: str) -> list[str]:
        return self._tokenizer.tokenize(text)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def encode_lines(self, lines: Sequence[str]):
        return self._tokenizer.encode_lines(lines)

    def id_to_token(self, i: int) -> str:
        return self._inverse[i]

    def token_to_id(self, token: str) -> int:
        return self.vocab.get(token)

    def is_word_start(self, token_id: int) -> bool:
        return not self._inverse.get(token_id, "").startswith("##")


class SentencePieceVocab(Tokenizer):
    """A SentencePiece model; text is lower-cased first when ``do_lower_case``."""

    def __init__(self, model_path: str, do_lower_case: bool):
        import sentencepiece as spm  # the C++ extension; no TensorFlow
        self.processor = spm.SentencePieceProcessor(model_file=model_path)
        self.vocab_size = self.processor.get_piece_size()
        self.do_lower_case = do_lower_case
        self._pieces = [self.processor.id_to_piece(i) for i in range(self.vocab_size)]
        self._ids = {p: i for i, p in enumerate(self._pieces)}
        roles, missing = sentencepiece_roles(self.processor)
        if missing:
            raise ValueError(f"{model_path} has no piece {', '.join(missing)}: "
                             + MISSING_ROLES_HINT)
        self._roles = roles
        self._set_special_ids(roles)

    def tokenize(self, text: str) -> list[str]:
        return self.processor.encode(text.lower() if self.do_lower_case else text, out_type=str)

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text.lower() if self.do_lower_case else text)

    def _encode_many(self, lines: Sequence[str]) -> list:
        # SentencePiece encodes a list in one C++ call.
        return self.processor.encode([line.lower() for line in lines] if self.do_lower_case
                                     else list(lines))

    def id_to_token(self, i: int) -> str:
        return self._pieces[i]

    def token_to_id(self, token: str) -> int:
        i = self._ids.get(token)
        return self._roles.get(token) if i is None else i

    def is_word_start(self, token_id: int) -> bool:
        return self._pieces[token_id].startswith(SPM_WORD_START)


def load_tokenizer(vocab_dir: str) -> Tokenizer:
    """The tokenizer of a vocab stage's directory (see module docstring)."""
    with open(os.path.join(vocab_dir, REPORT_FILE), encoding="utf-8") as f:
        report = json.load(f)
    do_lower_case = bool(report["do_lower_case"])
    if report["type"] == "sentencepiece":
        return SentencePieceVocab(os.path.join(vocab_dir, SPM_FILE), do_lower_case)
    if report["type"] == "wordpiece":
        return WordPieceVocab(os.path.join(vocab_dir, VOCAB_FILE), do_lower_case)
    raise ValueError(f"{vocab_dir}/{REPORT_FILE}: unknown vocab type {report['type']!r}")


_TOKENIZERS: dict[tuple, Tokenizer] = {}


def cached_tokenizer(vocab_dir: str) -> Tokenizer:
    """One tokenizer per vocab dir and process (its word cache is worth keeping); a vocab
    rewritten in the same directory (its files' times and sizes changed) is loaded again."""
    stamp = []
    for name in ("report.json", "vocab.txt", "spm.model"):
        try:
            st = os.stat(os.path.join(vocab_dir, name))
            stamp.append((st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append(None)
    key = (vocab_dir, *stamp)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(vocab_dir)
    return _TOKENIZERS[key]
