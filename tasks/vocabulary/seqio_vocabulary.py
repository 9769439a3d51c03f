"""The ``seqio.Vocabulary`` of a runexp vocab directory: seqio's own classes.

A WordPiece directory (``vocab.txt``) is ``seqio.BertWordPieceVocabulary`` (tensorflow_text's
``BertTokenizer`` over the same file, lower-casing as the vocab does); a SentencePiece one
(``spm.model``) is ``seqio.SentencePieceVocabulary``. The pipeline never tokenises through
them (runexp's tokenizer makes the ids, tasks/vocabulary/tokenizer.py); seqio uses them to describe and
decode the features, and a seqio or t5x user reading a finished experiment's tasks
(``runexp.tasks.register``) gets the vocabulary the model was trained with.
Heavy module: imports seqio and TensorFlow.

Usage:
    vocab = seqio_vocabulary(vocab_dir)
    vocab.decode(ids)
"""

from __future__ import annotations

import json
import os

import seqio
import tensorflow as tf

from runexp.tasks.vocabulary.tokenizer import REPORT_FILE, SPM_FILE, VOCAB_FILE


def seqio_vocabulary(vocab_dir: str) -> seqio.Vocabulary:
    """seqio's vocabulary over ``vocab_dir`` (module docstring)."""
    # tf.io.gfile: a finished experiment's vocab may be read where it is (gs:// too).
    with tf.io.gfile.GFile(os.path.join(vocab_dir, REPORT_FILE)) as f:
        report = json.load(f)
    if report["type"] == "sentencepiece":
        return seqio.SentencePieceVocabulary(os.path.join(vocab_dir, SPM_FILE), extra_ids=0)
    vocab_file = os.path.join(vocab_dir, VOCAB_FILE)
    with tf.io.gfile.GFile(vocab_file) as f:
        ids = {line.strip(): i for i, line in enumerate(f)}
    return seqio.BertWordPieceVocabulary(
        vocab_file, lower_case=bool(report["do_lower_case"]), pad_id=ids["[PAD]"],
        start_of_sequence_id=ids["[CLS]"], end_of_sequence_id=ids["[SEP]"])
