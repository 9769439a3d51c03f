"""A ``seqio.Vocabulary`` over a runexp vocab directory (WordPiece or SentencePiece).

seqio needs a vocabulary per output feature, for decoding and for its own checks; this one
delegates to ``tokenizer.load_tokenizer`` so seqio and the rest of runexp tokenize alike.
Heavy module: imports seqio and TensorFlow.

Usage:
    vocab = BertVocabulary(vocab_dir)
    vocab.encode("Return the value.")  # ids, no [CLS]/[SEP]
"""

from __future__ import annotations

from typing import Sequence

import seqio
import tensorflow as tf

from runexp.tasks.tokenizer import load_tokenizer


class BertVocabulary(seqio.Vocabulary):
    """Encodes without adding [CLS]/[SEP] (the instance builder does); no EOS."""

    def __init__(self, vocab_dir: str):
        self.vocab_dir = vocab_dir
        self._tokenizer = None
        super().__init__(extra_ids=0)

    @property
    def tokenizer(self):
        """Loaded on first use: registering a task reads no vocab files."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.vocab_dir)
        return self._tokenizer

    @property
    def eos_id(self):
        return None

    @property
    def unk_id(self):
        return self.tokenizer.unk_id

    @property
    def _base_vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def _encode(self, s: str) -> Sequence[int]:
        return self.tokenizer.encode(s)

    def _decode(self, ids) -> str:
        tok = self.tokenizer
        specials = {tok.pad_id, tok.cls_id, tok.sep_id}
        ids = [int(i) for i in ids if int(i) not in specials]
        if hasattr(tok, "processor"):  # SentencePiece
            return tok.processor.decode(ids)
        return " ".join(tok.id_to_token(i) for i in ids).replace(" ##", "")

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        def encode(x):
            return tf.constant(self._encode(x.numpy().decode("utf-8")), tf.int32)
        ids = tf.py_function(encode, [s], tf.int32)
        return tf.ensure_shape(ids, [None])

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        def decode(x):
            return tf.constant(self._decode(x.numpy().tolist()))
        text = tf.py_function(decode, [ids], tf.string)
        return tf.ensure_shape(text, [])

    def __eq__(self, other) -> bool:
        return isinstance(other, BertVocabulary) and other.vocab_dir == self.vocab_dir

    def __hash__(self) -> int:
        return hash(self.vocab_dir)
