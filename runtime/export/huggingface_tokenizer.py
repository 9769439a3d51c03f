"""A vocab stage's vocabulary as Hugging Face tokenizer files, giving the ids runexp trained on.

    names = write_tokenizer_files(vocab_dir, out_dir, max_seq_length=128)
    # then, in any process with transformers:
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer("Return the value.", "Raise an error.")   # input_ids, token_type_ids, ...

``tokenizer.json`` is built with Hugging Face's ``tokenizers`` library (no transformers) as
the pipeline runexp's own tokenizer (tasks/vocabulary/tokenizer.py) runs:

- WordPiece (``vocab.txt``): google-research/bert's FullTokenizer. ``BertNormalizer`` alone
  is not it: its text cleaning also deletes private-use and unassigned characters (BERT keeps
  them, and they become ``[UNK]``), its lower-casing maps a final ``Σ`` to ``σ`` (Python's
  ``str.lower``, which BERT uses, gives ``ς``), and its WordPiece model gives up on words of
  more than 100 characters where BERT allows 200. So BERT's cleaning is written as regular
  expressions, a final sigma is marked before lower-casing, and ``BertNormalizer`` only
  spaces out CJK ideographs, strips accents and lower-cases (uncased vocabs).
- SentencePiece (``spm.model``): the model's own normalisation (its precompiled character
  map, extra-whitespace removal, the ``▁`` dummy prefix), the text lower-cased first when
  uncased as runexp does, and the model's pieces and scores (``Unigram``; ``BPE`` with merges
  ranked by the merged piece's score). User-defined pieces are isolated before the model,
  as SentencePiece always emits them whole. Control pieces (``[CLS]``...) and the unknown
  piece get scores below any path of ordinary pieces: SentencePiece never makes them from
  text. The roles are the model's (compiler/vocab_roles.py ``sentencepiece_roles``): ALBERT's
  ``<pad>`` and ``<unk>`` are the pad and unknown tokens.

Both: ``[CLS] a [SEP]`` and ``[CLS] a [SEP] b [SEP]`` with token type ids 0 then 1 (the
post-processor). The one difference left on purpose: a literal special token in the text
("[MASK]", "[SEP]") is that token, as every Hugging Face BERT reads it, so that
``pipeline("fill-mask")`` works as users write it; runexp's tokenizer (google-research/bert's)
reads it as the characters "[", "mask", "]". Ordinary text never spells them.

``tokenizer_config.json`` names ``PreTrainedTokenizerFast``, which reads tokenizer.json as it
is: transformers' ``BertTokenizer`` (version 5) rebuilds its pipeline from flags and keeps
only the vocabulary and post-processor of tokenizer.json, so it would bring back the
differences above. The config also records ``do_lower_case``, ``tokenize_chinese_chars`` and
``strip_accents`` as runexp trains, for readers of ``vocab.txt`` (WordPiece directories get
one, with BERT's flags ``BertTokenizer("vocab.txt", do_lower_case=...)`` reads alike on most
text). Light: no TensorFlow.
"""

from __future__ import annotations

import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors

from runexp.tasks.vocabulary.tokenizer import SPM_FILE, SPM_WORD_START, VOCAB_FILE, load_tokenizer
from runexp.tasks.vocabulary.wordpiece import load_vocab

TOKENIZER_FILE = "tokenizer.json"
NOTES_FILE = "tokenizer_notes.md"  # where equality has a known limit (SentencePiece)
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
MAX_CHARS_PER_WORD = 200  # google-research/bert's: a longer word is [UNK]

# BERT's _clean_text (as tasks/vocabulary/wordpiece.py): NUL, U+FFFD, control characters but tab and
# line breaks, and format characters go; tab, line breaks and space separators become spaces.
_DELETED = r"[\x{0}\x{FFFD}\p{Cf}]|[\p{Cc}&&[^\t\n\r]]"
_WHITESPACE = r"[\t\n\r\p{Zs}]"
# BERT's punctuation: every ASCII non-alphanumeric, and Unicode's P* categories.
_PUNCTUATION = r"[!-/:-@\[-`{-~]|\p{P}"
# Python's str.lower gives a final sigma (Unicode's Final_Sigma: after a cased letter, with
# up to a few case-ignorable characters between, and before no cased letter); the tokenizers
# library's lower-casing maps every Σ to σ.
_FINAL_SIGMA = (r"(?<=\p{Cased}|\p{Cased}\p{Case_Ignorable}|\p{Cased}\p{Case_Ignorable}{2}"
                r"|\p{Cased}\p{Case_Ignorable}{3})\x{03A3}(?!\p{Case_Ignorable}*\p{Cased})")

SENTENCEPIECE_TIES = """\
# tokenizer.json and runexp's SentencePiece ids

tokenizer.json gives the ids runexp trained on (the `sentencepiece` library over spm.model,
the text lower-cased first when uncased) except where two segmentations of a word score
exactly the same: the same pieces in another order, as in a run of one letter ("xxxxxxx":
"xxx" + "x" + "xxx" or "x" + "xxx" + "xxx"). The two libraries break such ties differently
and no setting of tokenizer.json changes that; ordinary text has none (none in thousands of
held-out lines of English and Chinese text).
"""

# sentencepiece_model.proto's piece types.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def write_tokenizer_files(vocab_dir: str, out_dir: str, *, max_seq_length: int) -> list[str]:
    """Writes the Hugging Face tokenizer files of a vocab stage's directory.

    Args:
      vocab_dir: the vocab stage's output: report.json (type, do_lower_case) and vocab.txt
        or spm.model; its casing is the report's, as for every runexp stage.
      out_dir: where to write (created if missing).
      max_seq_length: the longest input the model was trained on (``model_max_length``).

    Returns:
      The names of the files written: tokenizer.json, tokenizer_config.json,
      special_tokens_map.json; vocab.txt for a WordPiece vocabulary; for a SentencePiece one
      tokenizer_notes.md, which says where the ids can differ (``SENTENCEPIECE_TIES``).
    """
    tokenizer = load_tokenizer(vocab_dir)
    lower = bool(tokenizer.do_lower_case)
    roles = tokenizer.special_pieces()
    os.makedirs(out_dir, exist_ok=True)
    names = [TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE]
    if os.path.exists(os.path.join(vocab_dir, SPM_FILE)) and not os.path.exists(
            os.path.join(vocab_dir, VOCAB_FILE)):
        pipeline = sentencepiece_pipeline(os.path.join(vocab_dir, SPM_FILE), lower)
        with open(os.path.join(out_dir, NOTES_FILE), "w", encoding="utf-8") as f:
            f.write(SENTENCEPIECE_TIES)
        names.append(NOTES_FILE)
    else:
        vocab = load_vocab(os.path.join(vocab_dir, VOCAB_FILE))
        pipeline = wordpiece_pipeline(vocab, lower, roles["[UNK]"])
        _write_vocab_txt(vocab, os.path.join(out_dir, VOCAB_FILE))
        names.append(VOCAB_FILE)
    ids = tokenizer.special_ids()
    pipeline.post_processor = bert_template(roles, ids)
    # Special tokens (decode(skip_special_tokens=True) drops them), at the vocab's own ids.
    pipeline.add_special_tokens([AddedToken(piece, special=True, normalized=False)
                                 for piece in roles.values()])
    pipeline.save(os.path.join(out_dir, TOKENIZER_FILE))
    special = {f"{role[1:-1].lower()}_token": piece for role, piece in roles.items()}
    with open(os.path.join(out_dir, SPECIAL_TOKENS_MAP_FILE), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2, ensure_ascii=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as it is (docstring)
        "model_max_length": int(max_seq_length),
        "do_lower_case": lower,
        "tokenize_chinese_chars": True,
        "strip_accents": lower,  # BERT strips accents exactly when it lower-cases
        # A literal "[MASK]" is the mask token, as for every BERT on the Hub (docstring).
        "split_special_tokens": False,
        "padding_side": "right",
        "truncation_side": "right",
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        **special,
    }
    with open(os.path.join(out_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return names


def bert_template(roles: dict, ids: dict) -> processors.TemplateProcessing:
    """``[CLS] a [SEP]`` / ``[CLS] a [SEP] b [SEP]``, token type ids 0 then 1."""
    cls, sep = roles["[CLS]"], roles["[SEP]"]
    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, ids["[CLS]"]), (sep, ids["[SEP]"])])


def wordpiece_pipeline(vocab: dict[str, int], do_lower_case: bool, unk_token: str
                       ) -> Tokenizer:
    """google-research/bert's FullTokenizer over ``vocab`` (module docstring)."""
    pipeline = Tokenizer(models.WordPiece(vocab, unk_token=unk_token,
                                          continuing_subword_prefix="##",
                                          max_input_chars_per_word=MAX_CHARS_PER_WORD))
    steps = [normalizers.Replace(Regex(_DELETED), ""),
             normalizers.Replace(Regex(_WHITESPACE), " ")]
    if do_lower_case:
        steps.append(normalizers.Replace(Regex(_FINAL_SIGMA), "\u03c2"))
    steps.append(normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=True,
                                            strip_accents=do_lower_case,
                                            lowercase=do_lower_case))
    pipeline.normalizer = normalizers.Sequence(steps)
    pipeline.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(_PUNCTUATION), behavior="isolated")])
    pipeline.decoder = decoders.WordPiece(prefix="##")
    return pipeline


def _write_vocab_txt(vocab: dict[str, int], path: str) -> None:
    """vocab.txt as runexp reads it (stripped tokens, line = id), one token a line."""
    tokens = {i: t for t, i in vocab.items()}
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(tokens.get(i, f"[unused_{i}]") + "\n"
                        for i in range(max(tokens) + 1)))


def _model_proto(model_path: str):
    from sentencepiece import sentencepiece_model_pb2  # light: the protobuf of the model

    proto = sentencepiece_model_pb2.ModelProto()
    with open(model_path, "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def sentencepiece_pipeline(model_path: str, do_lower_case: bool) -> Tokenizer:
    """runexp's SentencePiece tokenizer: ``spm.encode(text.lower() if uncased)``."""
    proto = _model_proto(model_path)
    pieces = list(proto.pieces)
    normal = [p.score for p in pieces if p.type == _NORMAL]
    floor = min(normal, default=0.0)
    # Below any path of ordinary pieces over the same text: never chosen, as in SentencePiece.
    never = [(p.piece, len(p.piece) * floor - 10.0 * (len(p.piece) + 1)) for p in pieces]
    vocab = [never[i] if p.type in (_CONTROL, _UNKNOWN, _UNUSED) else (p.piece, p.score)
             for i, p in enumerate(pieces)]
    unk_id = next(i for i, p in enumerate(pieces) if p.type == _UNKNOWN)
    byte_fallback = bool(proto.trainer_spec.byte_fallback)
    if proto.trainer_spec.model_type == proto.trainer_spec.BPE:
        model = models.BPE(vocab={p: i for i, (p, _) in enumerate(vocab)},
                           merges=_bpe_merges(pieces), unk_token=pieces[unk_id].piece,
                           fuse_unk=True, byte_fallback=byte_fallback, dropout=None,
                           ignore_merges=False)
    else:
        model = models.Unigram(vocab, unk_id=unk_id, byte_fallback=byte_fallback)
    pipeline = Tokenizer(model)
    spec = proto.normalizer_spec
    steps = []
    if do_lower_case:  # runexp lower-cases with Python's str.lower before the model
        steps += [normalizers.Replace(Regex(_FINAL_SIGMA), "\u03c2"), normalizers.Lowercase()]
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""),
                  normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPM_WORD_START))
    pipeline.normalizer = normalizers.Sequence(steps)
    user_defined = sorted((p.piece for p in pieces if p.type == _USER_DEFINED), key=len,
                          reverse=True)
    if user_defined:  # emitted whole, never part of another piece
        pipeline.pre_tokenizer = pre_tokenizers.Split(
            Regex("|".join(_regex_escape(p) for p in user_defined)), behavior="isolated")
    steps = [decoders.Replace(SPM_WORD_START, " ")]
    if byte_fallback:
        steps.append(decoders.ByteFallback())
    steps += [decoders.Fuse(), decoders.Strip(content=" ", left=1)]
    pipeline.decoder = decoders.Sequence(steps)
    return pipeline


def _bpe_merges(pieces) -> list[tuple[str, str]]:
    """SentencePiece BPE merges two pieces into a piece of the vocabulary, the highest scored
    first: the merges of every ordinary piece's splits, ranked by its score."""
    normal = {p.piece: (p.score, i) for i, p in enumerate(pieces) if p.type == _NORMAL}
    ranked = []
    for piece, (score, i) in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-score, i, left, right))
    return [(left, right) for _, _, left, right in sorted(ranked)]


def _regex_escape(text: str) -> str:
    """``text`` as a literal in the tokenizers library's (Oniguruma) regular expressions."""
    return "".join(f"\\x{{{ord(ch):X}}}" for ch in text)
