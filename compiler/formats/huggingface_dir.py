"""What a Hugging Face BERT directory holds, read with the standard library alone.

A directory ``save_pretrained`` wrote for a BERT model (``BertModel``, ``BertForPreTraining``,
``BertForSequenceClassification``...) and its tokenizer: ``config.json``, the weights
(``model.safetensors``; older ones ``pytorch_model.bin``), and the vocabulary
(``vocab.txt`` with ``tokenizer_config.json``, or ``tokenizer.json`` alone).

    record = read_huggingface_dir("/models/bert-base-uncased")
    record.hidden_size, record.do_lower_case, record.vocab_file
    read_huggingface_dir("gs://bucket/bert", read_text=storage.read_text,
                         exists=storage.exists)

The compiler reads it to plan (never importing transformers, tokenizers, safetensors or
TensorFlow); ``HuggingFaceDirError`` says which file, what is wrong and what to do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from typing import Any, Callable, Optional

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SAFETENSORS_FILES = (WEIGHTS_FILE, "model.safetensors.index.json")
PYTORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"


class HuggingFaceDirError(ValueError):
    """A Hugging Face directory runexp cannot read as a BERT model.

    Attributes:
      file: the file (or directory) at fault.
      message: what is wrong.
      hint: what to do.
    """

    def __init__(self, file: str, message: str, hint: str):
        super().__init__(f"{file}: {message}\n  hint: {hint}")
        self.file, self.message, self.hint = file, message, hint


@dataclasses.dataclass(frozen=True)
class HuggingFaceDir:
    """A Hugging Face BERT directory's model shape and tokenizer settings.

    Attributes:
      path: the directory.
      model_type: config.json's (always "bert" here).
      architectures: config.json's, e.g. ("BertForPreTraining",).
      hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, hidden_act,
        max_position_embeddings, type_vocab_size, vocab_size, layer_norm_eps: config.json's
        (transformers' BertConfig defaults where a key is missing).
      do_lower_case, tokenize_chinese_chars, strip_accents: the tokenizer's settings
        (tokenizer_config.json, else tokenizer.json's normaliser; strip_accents None means
        "as do_lower_case", BERT's rule).
      vocab_file: vocab.txt's path, or None when the vocabulary is in tokenizer.json only.
      tokenizer_file: tokenizer.json's path, or None.
      vocab_lines: the vocabulary's size: vocab.txt's lines (else tokenizer.json's tokens).
      has_safetensors: model.safetensors (or its sharded index) exists.
      has_pytorch_bin: pytorch_model.bin (or its sharded index) exists.
      unsupported: what config.json sets that runexp's BERT does not compute (another
        layer-norm epsilon, relative positions, a decoder...), one phrase each.
    """

    path: str
    model_type: str
    architectures: tuple[str, ...]
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    vocab_size: int
    layer_norm_eps: float
    do_lower_case: bool
    tokenize_chinese_chars: bool
    strip_accents: Optional[bool]
    vocab_file: Optional[str]
    tokenizer_file: Optional[str]
    vocab_lines: int
    has_safetensors: bool
    has_pytorch_bin: bool
    unsupported: tuple[str, ...] = ()


# transformers' BertConfig defaults: a config.json may leave out what equals them.
_BERT_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "intermediate_size": 3072, "hidden_act": "gelu",
                  "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522,
                  "layer_norm_eps": 1e-12}


def _read_local(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _join(directory: str, name: str) -> str:
    return (posixpath.join(directory, name) if "://" in directory
            else os.path.join(directory, name))


def read_huggingface_dir(path: str, *, read_text: Callable[[str], str] = _read_local,
                         exists: Callable[[str], bool] = os.path.exists) -> HuggingFaceDir:
    """Reads the BERT model and tokenizer settings of a Hugging Face directory.

    Args:
      path: a local directory, or a gs:// prefix with ``read_text`` and ``exists``.
      read_text: a file's text (UTF-8), given its path or URI.
      exists: whether a file exists, given its path or URI.

    Raises:
      HuggingFaceDirError: no config.json; a model_type other than bert; PyTorch weights
        without model.safetensors; no vocabulary; a vocabulary larger than the embedding
        table; a file that is not the JSON or UTF-8 text it should be.
    """
    def file(name: str) -> str:
        return _join(path, name)

    config = _json(file(CONFIG_FILE), read_text, exists, missing_hint=(
        "give the directory that transformers' save_pretrained wrote (it holds config.json, "
        "model.safetensors and the tokenizer files)"))
    model_type = str(config.get("model_type", ""))
    if model_type != "bert":
        raise HuggingFaceDirError(
            file(CONFIG_FILE), f"model_type is {model_type or 'missing'!r}: runexp reads BERT "
            "directories (model_type 'bert') only",
            "give a BERT checkpoint (e.g. bert-base-uncased); RoBERTa, DistilBERT, DeBERTa, "
            "ModernBERT and others have other layers and tokenizers")
    has_safetensors = any(exists(file(n)) for n in SAFETENSORS_FILES)
    has_pytorch_bin = any(exists(file(n)) for n in PYTORCH_FILES)
    if has_pytorch_bin and not has_safetensors:
        raise HuggingFaceDirError(
            file(PYTORCH_FILES[0]), "the weights are PyTorch's pickle (pytorch_model.bin) "
            "and there is no model.safetensors: runexp reads safetensors only (a pickle can "
            "run code when loaded)",
            "convert it once with transformers: model = AutoModel.from_pretrained(dir); "
            "model.save_pretrained(dir, safe_serialization=True)")
    values = {k: config.get(k, default) for k, default in _BERT_DEFAULTS.items()}
    tokenizer = _tokenizer_settings(path, file, read_text, exists)
    vocab_size = int(values["vocab_size"])
    if tokenizer["vocab_lines"] > vocab_size:
        where = tokenizer["vocab_file"] or tokenizer["tokenizer_file"]
        raise HuggingFaceDirError(
            where, f"the vocabulary has {tokenizer['vocab_lines']:,} tokens but config.json's "
            f"vocab_size is {vocab_size:,}: ids past {vocab_size - 1:,} have no embedding",
            "give the vocabulary the checkpoint was trained with (a smaller one is fine: "
            "BERT directories may pad the embedding table)")
    return HuggingFaceDir(
        path=path, model_type=model_type,
        architectures=tuple(config.get("architectures") or ()),
        hidden_size=int(values["hidden_size"]),
        num_hidden_layers=int(values["num_hidden_layers"]),
        num_attention_heads=int(values["num_attention_heads"]),
        intermediate_size=int(values["intermediate_size"]),
        hidden_act=str(values["hidden_act"]),
        max_position_embeddings=int(values["max_position_embeddings"]),
        type_vocab_size=int(values["type_vocab_size"]), vocab_size=vocab_size,
        layer_norm_eps=float(values["layer_norm_eps"]),
        has_safetensors=has_safetensors, has_pytorch_bin=has_pytorch_bin,
        unsupported=tuple(unsupported_settings(config)), **tokenizer)


# runtime/layers.py's LayerNorm epsilon (google-research/bert's;
# tests/runtime/test_export_huggingface.py checks they agree).
LAYER_NORM_EPS = 1e-12


def unsupported_settings(config: dict) -> list[str]:
    """What a BERT config.json sets, beyond the model's shape and activation, that runexp's
    encoder does not compute: one phrase each ([] when it computes the same function)."""
    problems = []
    eps = float(config.get("layer_norm_eps", LAYER_NORM_EPS))
    if abs(eps - LAYER_NORM_EPS) > 1e-15:
        problems.append(f"layer_norm_eps is {eps:g}; runexp's LayerNorm uses "
                        f"{LAYER_NORM_EPS:g}")
    position = config.get("position_embedding_type", "absolute")
    if position != "absolute":
        problems.append(f"position_embedding_type is {position!r}; runexp has absolute "
                        "position embeddings only")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        problems.append("it is a decoder (is_decoder / add_cross_attention); runexp's BERT "
                        "is an encoder")
    if not config.get("tie_word_embeddings", True):
        problems.append("tie_word_embeddings is false; runexp's masked-LM decoder is the "
                        "word embeddings")
    return problems


def _json(uri: str, read_text, exists, missing_hint: str = "") -> dict:
    if missing_hint and not exists(uri):
        raise HuggingFaceDirError(uri, "no such file", missing_hint)
    try:
        value = json.loads(read_text(uri))
    except (ValueError, UnicodeDecodeError) as e:
        raise HuggingFaceDirError(uri, f"is not valid JSON ({e})",
                                  "write it again with save_pretrained") from None
    if not isinstance(value, dict):
        raise HuggingFaceDirError(uri, "is not a JSON object", "write it again with "
                                  "save_pretrained")
    return value


def _tokenizer_settings(path: str, file, read_text, exists) -> dict[str, Any]:
    """vocab_file, tokenizer_file, vocab_lines and the casing settings (see HuggingFaceDir)."""
    vocab_file = file(VOCAB_FILE) if exists(file(VOCAB_FILE)) else None
    tokenizer_file = file(TOKENIZER_FILE) if exists(file(TOKENIZER_FILE)) else None
    if vocab_file is None and tokenizer_file is None:
        raise HuggingFaceDirError(
            path, "no vocabulary: neither vocab.txt nor tokenizer.json",
            "save the tokenizer into the directory too: "
            "AutoTokenizer.from_pretrained(name).save_pretrained(dir)")
    settings: dict[str, Any] = {}
    tokens = None
    if tokenizer_file is not None:
        tokenizer = _json(tokenizer_file, read_text, exists)
        settings, tokens = _from_tokenizer_json(tokenizer)
    if exists(file(TOKENIZER_CONFIG_FILE)):  # the tokenizer's own flags come first
        config = _json(file(TOKENIZER_CONFIG_FILE), read_text, exists)
        settings.update({k: config[k] for k in ("do_lower_case", "tokenize_chinese_chars",
                                                "strip_accents") if k in config})
    if vocab_file is not None:
        try:
            text = read_text(vocab_file)
        except UnicodeDecodeError:
            raise HuggingFaceDirError(vocab_file, "is not UTF-8 text",
                                      "give the vocab.txt the tokenizer saved") from None
        lines = text.split("\n")
        tokens = len(lines) - (lines[-1] == "")  # the newline ending the last line
    strip = settings.get("strip_accents")
    return {"do_lower_case": bool(settings.get("do_lower_case", True)),
            "tokenize_chinese_chars": bool(settings.get("tokenize_chinese_chars", True)),
            "strip_accents": None if strip is None else bool(strip),
            "vocab_file": vocab_file, "tokenizer_file": tokenizer_file,
            "vocab_lines": int(tokens or 0)}


def _from_tokenizer_json(tokenizer: dict) -> tuple[dict, Optional[int]]:
    """The casing settings of tokenizer.json's BertNormalizer, and its model's token count."""
    settings: dict[str, Any] = {"do_lower_case": False}  # unless a normaliser lower-cases
    normalizer = tokenizer.get("normalizer") or {}
    parts = normalizer.get("normalizers", [normalizer]) if isinstance(normalizer, dict) else []
    for part in parts:
        if isinstance(part, dict) and part.get("type") == "BertNormalizer":
            settings = {"do_lower_case": part.get("lowercase", True),
                        "tokenize_chinese_chars": part.get("handle_chinese_chars", True),
                        "strip_accents": part.get("strip_accents")}
        elif isinstance(part, dict) and part.get("type") == "Lowercase":
            settings["do_lower_case"] = True
    vocab = (tokenizer.get("model") or {}).get("vocab")
    count = len(vocab) if isinstance(vocab, (dict, list)) else None
    return settings, count


def wordpiece_vocab(tokenizer_file: str) -> list[str]:
    """The tokens of a tokenizer.json's WordPiece model in id order: the vocab.txt that
    transformers 5's save_pretrained no longer writes beside it.

    Raises:
      HuggingFaceDirError: not a WordPiece model, ids with gaps, BERT's special tokens
        missing.
    """
    tokenizer = _json(tokenizer_file, _read_local, os.path.exists)
    model = tokenizer.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "WordPiece" or not isinstance(vocab, dict):
        raise HuggingFaceDirError(tokenizer_file, f"its model is {model.get('type')!r}, not "
                                  "BERT's WordPiece", "give a BERT tokenizer's directory")
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise HuggingFaceDirError(tokenizer_file, "its WordPiece ids are not 0..n-1 without "
                                  "gaps", "save the tokenizer again with save_pretrained")
    missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    if missing:
        raise HuggingFaceDirError(tokenizer_file, f"has no {', '.join(missing)}",
                                  "give a BERT tokenizer's directory")
    return tokens


# transformers' hidden_act -> runexp's name for the same function, and back. runexp's "gelu"
# is google-research/bert's tanh approximation; transformers' "gelu" is the exact (erf) one.
RUNEXP_ACTIVATION = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact",
                     "gelu_python": "gelu_exact", "relu": "relu", "tanh": "tanh",
                     "linear": "linear"}
HUGGINGFACE_ACTIVATION = {"gelu": "gelu_new", "gelu_new": "gelu_new", "gelu_exact": "gelu",
                          "relu": "relu", "tanh": "tanh", "linear": "linear"}
