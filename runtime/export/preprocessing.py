"""Raw text to encoder inputs inside the graph, exactly as runexp tokenises, and the
preprocessing SavedModel built on it.

The tokenisers (``graph_tokenizer``) give the ids ``load_tokenizer(vocab_dir).encode`` gives:

- WordPiece (``vocab.txt``): google-research/bert's FullTokenizer, from tensorflow_text pieces
  (``regex_split`` with the delimiters of ``tf_text.BertTokenizer``, then
  ``tf_text.WordpieceTokenizer``) behind BERT's own text cleaning. ``tf_text.BertTokenizer``
  alone differs from BERT on real text: its lower-casing is ICU's NFKC case folding (``´``
  becomes a space plus an accent, ``…`` three full stops, ``ß`` "ss", ``ﬁ`` "fi", full-width
  letters ASCII), it turns control and format characters into word breaks where BERT deletes
  them (``a\\u200bb``), it keeps U+FFFD and does not break words at no-break and other
  Unicode spaces, and its word limit is 100 bytes where BERT's is 200 characters. So the text
  is cleaned, lower-cased (``tf.strings.lower``: Python's ``str.lower``), NFD-normalised and
  stripped of accents here, as BERT does, and longer words become ``[UNK]`` here.
- SentencePiece (``spm.model``): ``tf_text.FastSentencepieceTokenizer`` (unigram models) or
  ``tf_text.SentencepieceTokenizer`` (BPE) over the model, the text lower-cased first when
  ``do_lower_case`` (as runexp's tokenizer and vocab training do); see
  ``SentencePieceGraphTokenizer`` for why two.

Residual differences: the character tables. Python (here ``unicodedata`` 14.0) and the
regular expressions / ICU tables inside TensorFlow (newer Unicode versions) disagree on a few
thousand code points assigned after Unicode 14 (Python deletes them as unassigned) and on 41
case mappings of recent letters; no text written with older characters is affected.

Packing (``pack_inputs``) is google-research/bert's run_classifier: ``[CLS] a [SEP]``,
``[CLS] a [SEP] b [SEP]`` with segment ids 0 then 1, a pair truncated by dropping the last
token of the longer side (the second on a tie) until it fits, zero padding. (tensorflow_text's
``ShrinkLongestTrimmer`` trims the first side on a tie, so it is not used.)

The SavedModel (``Preprocessor``), shaped like TF Hub's BERT preprocessors:
    pre = tf.saved_model.load("preprocessing")
    pre(tf.constant(["Return the value."]))      # input_word_ids, input_mask, input_type_ids
    a, b = pre.tokenize(tf.constant(["q1"])), pre.tokenize(tf.constant(["q2"]))
    pre.bert_pack_inputs([a, b])                  # sentence pairs, at pre.seq_length
    pre.bert_pack_inputs([a, b], seq_length=64)   # another length
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import tensorflow as tf
import tensorflow_text as tf_text

from runexp.runtime.export.encoder import set_vocab_attributes
from runexp.tasks.vocabulary.tokenizer import REPORT_FILE, SPM_FILE, VOCAB_FILE, load_tokenizer
from runexp.tasks.vocabulary.wordpiece import load_vocab

UNK = "[UNK]"
MAX_CHARS_PER_WORD = 200  # google-research/bert's WordpieceTokenizer: a longer word is [UNK]
_MAX_BYTES_PER_WORD = 4 * MAX_CHARS_PER_WORD  # longer words were replaced before

# BERT's _clean_text as google-research/bert and runexp's tasks/vocabulary/wordpiece.py do it, as RE2
# patterns: deleted are NUL, U+FFFD, control (Cc) but \t \n \r, and format (Cf)
# characters; private-use and unassigned ones are kept (they become [UNK]).
# BERT's whitespace (\t \n \r, Zs) and what Python's str.split also breaks at (Zl, Zp)
# become spaces.
_DELETED = r"\x{FFFD}|[^\P{Cc}\t\n\r]|\p{Cf}"
_WHITESPACE = r"[\t\n\r\p{Z}]"
# BasicTokenizer's split, as tf_text.BertTokenizer writes it: spaces go; punctuation (ASCII
# non-alphanumerics and \p{P}) and CJK ideographs are words of their own.
_KEEP = "|".join([
    r"[!-/]", r"[:-@]", r"[\[-`]", r"[{-~]", r"[\p{P}]",
    r"[\x{4E00}-\x{9FFF}]", r"[\x{3400}-\x{4DBF}]", r"[\x{20000}-\x{2A6DF}]",
    r"[\x{2A700}-\x{2B73F}]", r"[\x{2B740}-\x{2B81F}]", r"[\x{2B820}-\x{2CEAF}]",
    r"[\x{F900}-\x{FAFF}]", r"[\x{2F800}-\x{2FA1F}]",
])
_DELIMITERS = r"\s+|" + _KEEP

_STRINGS = tf.TensorSpec([None], tf.string)
_TOKENS = tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)


def vocab_report(vocab_dir: str) -> dict:
    """The vocab stage's report.json: ``type`` ("wordpiece" or "sentencepiece"),
    ``do_lower_case``."""
    with open(os.path.join(vocab_dir, REPORT_FILE), encoding="utf-8") as f:
        return json.load(f)


def vocab_file(vocab_dir: str) -> str:
    """The file that is the vocabulary: spm.model for SentencePiece, else vocab.txt."""
    kind = vocab_report(vocab_dir)["type"]
    return os.path.join(vocab_dir, SPM_FILE if kind == "sentencepiece" else VOCAB_FILE)


class WordPieceGraphTokenizer(tf.Module):
    """google-research/bert's FullTokenizer in the graph (see the module docstring)."""

    def __init__(self, vocab_path: str, do_lower_case: bool):
        super().__init__()
        self.do_lower_case = bool(do_lower_case)
        vocab = load_vocab(vocab_path)  # runexp's reading: stripped lines, last duplicate wins
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(list(vocab), tf.string),
                tf.constant(list(vocab.values()), tf.int64)), default_value=-1)
        self.wordpiece = tf_text.WordpieceTokenizer(
            self.table, suffix_indicator="##", max_bytes_per_word=_MAX_BYTES_PER_WORD,
            token_out_type=tf.int64, unknown_token=UNK)

    def normalize(self, text):
        """BERT's text cleaning, and its lower-casing and accent stripping if uncased."""
        text = tf.strings.regex_replace(text, _DELETED, "")
        text = tf.strings.regex_replace(text, _WHITESPACE, " ")
        if self.do_lower_case:
            text = tf.strings.lower(text, encoding="utf-8")
            text = tf_text.normalize_utf8(text, "NFD")
            text = tf.strings.regex_replace(text, r"\p{Mn}", "")
        return text

    def words(self, text):
        """BasicTokenizer: [batch] strings -> [batch, (words)] strings."""
        words = tf_text.regex_split(self.normalize(text), _DELIMITERS, _KEEP)
        long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD
        return words.with_flat_values(tf.where(long, UNK, words.flat_values))

    def tokenize(self, text):
        """[batch] strings -> [batch, (pieces)] int32 ids."""
        pieces = self.wordpiece.tokenize(self.words(text))  # [batch, (words), (pieces)]
        return tf.cast(pieces.merge_dims(1, 2), tf.int32)


def lower_utf8(text):
    """``tf.strings.lower`` (Python's ``str.lower``), safe for NUL characters (at which ICU
    would end the string)."""
    parts = tf.strings.split(text, sep="\x00")  # [batch, (parts)]
    lowered = tf.strings.lower(parts.flat_values, encoding="utf-8")
    lengths = parts.row_lengths()
    last = tf.ragged.range(lengths).flat_values == tf.repeat(lengths - 1, lengths)
    lowered = tf.strings.join([lowered, tf.where(last, "", "\x00")])
    return tf.strings.reduce_join(parts.with_flat_values(lowered), axis=-1)


def _unigram_without_byte_fallback(model: bytes) -> bool:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    return (proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM
            and not proto.trainer_spec.byte_fallback)


class SentencePieceGraphTokenizer(tf.Module):
    """A SentencePiece model in the graph; text lower-cased first when uncased.

    Unigram models run in ``tf_text.FastSentencepieceTokenizer``, which picks the same pieces
    as the sentencepiece library runexp uses where two segmentations score the same ("mmm":
    "m" + "mm", not "mm" + "m"); ``tf_text.SentencepieceTokenizer`` (an older build of the
    library) breaks such ties the other way on about one line in 7,000 of the stdlib corpus.
    The fast one only knows unigram models: BPE models (and byte-fallback ones) run in
    ``SentencepieceTokenizer``, which matches the library on them.
    """

    def __init__(self, model_path: str, do_lower_case: bool):
        super().__init__()
        self.do_lower_case = bool(do_lower_case)
        with open(model_path, "rb") as f:
            model = f.read()
        if _unigram_without_byte_fallback(model):
            self.sentencepiece = tf_text.FastSentencepieceTokenizer(model)
        else:
            self.sentencepiece = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)

    def tokenize(self, text):
        """[batch] strings -> [batch, (pieces)] int32 ids."""
        if self.do_lower_case:
            text = lower_utf8(text)
        return tf.cast(self.sentencepiece.tokenize(text), tf.int32)


def graph_tokenizer(vocab_dir: str):
    """The in-graph tokenizer of a vocab stage's directory (its report.json's type)."""
    report = vocab_report(vocab_dir)
    lower = bool(report["do_lower_case"])
    if report["type"] == "sentencepiece":
        return SentencePieceGraphTokenizer(os.path.join(vocab_dir, SPM_FILE), lower)
    if report["type"] == "wordpiece":
        return WordPieceGraphTokenizer(os.path.join(vocab_dir, VOCAB_FILE), lower)
    raise ValueError(f"{vocab_dir}/{REPORT_FILE}: unknown vocab type {report['type']!r}")


def _keep_first(tokens: tf.RaggedTensor, counts) -> tf.RaggedTensor:
    """Each row's first ``counts[row]`` tokens."""
    starts = tokens.row_starts()
    return tf.gather(tokens.values, tf.ragged.range(starts, starts + counts))


def truncate(segments: Sequence[tf.RaggedTensor], seq_length) -> list:
    """One or two [batch, (tokens)] segments cut to fit ``seq_length`` with [CLS] and [SEP]s:
    a single segment loses its tail; a pair loses the last token of the longer side (the
    second on a tie) until it fits, as BERT's _truncate_seq_pair (in closed form)."""
    if len(segments) == 1:
        (a,) = segments
        budget = tf.cast(seq_length, a.row_splits.dtype) - 2
        return [_keep_first(a, tf.minimum(a.row_lengths(), budget))]
    if len(segments) != 2:
        raise ValueError(f"one or two segments, got {len(segments)}")
    a, b = segments
    la, lb = a.row_lengths(), tf.cast(b.row_lengths(), a.row_splits.dtype)
    budget = tf.cast(seq_length, la.dtype) - 3
    half_a, half_b = (budget + 1) // 2, budget // 2
    fits = la + lb <= budget
    # Too long: the shorter side keeps all it has if it is within its half, else both sides
    # end at their halves (the first takes the odd token, as the tie rule leaves it).
    ka = tf.where(fits, la, tf.where(lb <= half_b, budget - lb, tf.minimum(la, half_a)))
    kb = tf.where(fits | (lb <= half_b), lb, tf.maximum(budget - la, half_b))
    return [_keep_first(a, ka), _keep_first(b, tf.cast(kb, b.row_splits.dtype))]


def pack_inputs(segments: Sequence[tf.RaggedTensor], seq_length, cls_id: int,
                sep_id: int) -> dict:
    """Tokenised segments -> the encoder's int32 [batch, seq_length] inputs."""
    segments = [s.merge_dims(1, -1) if s.ragged_rank > 1 else s for s in segments]
    segments = [tf.cast(s, tf.int32) for s in segments]
    ids, types = tf_text.combine_segments(truncate(segments, seq_length),
                                          start_of_sequence_id=cls_id,
                                          end_of_segment_id=sep_id)
    ids, mask = tf_text.pad_model_inputs(ids, seq_length)
    types, _ = tf_text.pad_model_inputs(types, seq_length)
    return {"input_word_ids": tf.cast(ids, tf.int32), "input_mask": tf.cast(mask, tf.int32),
            "input_type_ids": tf.cast(types, tf.int32)}


class TextEncoder(tf.Module):
    """A vocab's in-graph tokenizer and BERT's packing at a sequence length, with no
    tf.functions of its own (the classifier traces it inside its own).

    Attributes saved with it: ``vocab_file`` (asset: vocab.txt, or spm.model for
    SentencePiece, then also ``sp_model_file``), ``do_lower_case``, ``seq_length``,
    ``cls_id``, ``sep_id`` (non-trainable variables). Padding is 0, as in runexp's own
    inputs.
    """

    def __init__(self, vocab_dir: str, seq_length: int):
        super().__init__()
        report = vocab_report(vocab_dir)
        ids = load_tokenizer(vocab_dir)
        self._cls, self._sep, self._seq_length = ids.cls_id, ids.sep_id, int(seq_length)
        self.tokenizer = graph_tokenizer(vocab_dir)
        set_vocab_attributes(self, vocab_file(vocab_dir), report["type"] == "sentencepiece",
                             report["do_lower_case"])
        self.seq_length = tf.Variable(self._seq_length, trainable=False, dtype=tf.int32,
                                      name="seq_length")
        self.cls_id = tf.Variable(ids.cls_id, trainable=False, dtype=tf.int32, name="cls_id")
        self.sep_id = tf.Variable(ids.sep_id, trainable=False, dtype=tf.int32, name="sep_id")

    def pack(self, segments, seq_length=None):
        """One or two tokenised segments -> encoder inputs (default: ``seq_length``)."""
        return pack_inputs(segments, self._seq_length if seq_length is None else seq_length,
                           self._cls, self._sep)

    def pack_text(self, texts, seq_length=None):
        """One or two [batch] string tensors -> encoder inputs."""
        return self.pack([self.tokenizer.tokenize(t) for t in texts], seq_length)


class Preprocessor(TextEncoder):
    """The preprocessing SavedModel's root: strings in, encoder inputs out (TextEncoder's
    attributes, and TF Hub's preprocessor functions)."""

    @tf.function(input_signature=[_STRINGS])
    def tokenize(self, text):
        """[batch] strings -> [batch, (tokens)] int32 ids, without [CLS]/[SEP]."""
        return self.tokenizer.tokenize(text)

    @tf.function
    def bert_pack_inputs(self, segments, seq_length=None):
        """A list of one or two tokenised segments -> input_word_ids, input_mask,
        input_type_ids, int32 [batch, seq_length] (default: the export's)."""
        return self.pack(segments, seq_length)

    @tf.function(input_signature=[_STRINGS])
    def __call__(self, text):
        """[batch] single sentences -> the encoder inputs at ``seq_length``."""
        return self.pack_text([text])

    def trace(self) -> None:
        """The concrete functions the SavedModel keeps: ``bert_pack_inputs`` for one and two
        segments, with the default and with a given ``seq_length``."""
        for n in (1, 2):
            self.bert_pack_inputs.get_concrete_function([_TOKENS] * n)
            self.bert_pack_inputs.get_concrete_function([_TOKENS] * n,
                                                        tf.TensorSpec([], tf.int32))


def save_preprocessing(vocab_dir: str, seq_length: int, path: str) -> Preprocessor:
    """Writes the preprocessing SavedModel of ``vocab_dir`` at ``seq_length`` to ``path``;
    ``serving_default``: ``text`` [batch] -> the encoder inputs."""
    module = Preprocessor(vocab_dir, seq_length)
    module.trace()
    serve = tf.function(lambda text: module(text)).get_concrete_function(
        tf.TensorSpec([None], tf.string, name="text"))
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    return module
