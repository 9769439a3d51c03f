"""runexp's variables (google-research/bert's TF1 names) <-> transformers' BERT parameter
names, both directions, and the tensors converted between them. The one table the export
(runtime/export/huggingface.py) and the init_checkpoint loader (runtime/checkpoints.py)
share. numpy only: no TensorFlow, no torch.

    bert/encoder/layer_0/attention/self/query/kernel [in, out]
        <-> bert.encoder.layer.0.attention.self.query.weight [out, in]   (transposed)
    bert/embeddings/LayerNorm/gamma <-> bert.embeddings.LayerNorm.weight
    cls/predictions/output_bias     <-> cls.predictions.bias
    cls/seq_relationship/output_weights [2, hidden] <-> cls.seq_relationship.weight (as is)
    output_weights [labels, hidden] <-> classifier.weight (as is)

TF Dense kernels are [in, out] and torch Linear weights [out, in]: every ``kernel`` is
transposed; the ``output_weights`` of Google's heads are already [out, in]. The masked-LM
decoder is tied to the word embeddings on both sides, so transformers' checkpoints carry no
``cls.predictions.decoder.*`` and neither does an export.

Usage:
    tensors = to_huggingface({name: var.numpy() for name, var in variables.items()})
    arrays, unused = from_huggingface(safetensors.numpy.load(data), variables)
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

import numpy as np

_LAYER = re.compile(r"/layer_(\d+)/")
# Google leaf names -> transformers'.
_LEAVES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}
# Whole names whose transformers spelling is not a rule of the parts.
_SPECIAL = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "output_weights": "classifier.weight",
    "output_bias": "classifier.bias",
}
_EMBEDDING_TABLES = ("word_embeddings", "token_type_embeddings", "position_embeddings")

# Names of transformers' checkpoints that carry no weight of their own: the decoder tied to
# the word embeddings and its bias tied to cls.predictions.bias (older savers wrote them),
# and position_ids, a buffer some older checkpoints hold.
TIED_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
_BUFFERS = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$")
# What BertModel.save_pretrained (AutoModel) writes: the encoder without the "bert." prefix.
_ENCODER_ROOTS = ("embeddings.", "encoder.", "pooler.")


def huggingface_name(google_name: str) -> str:
    """The transformers parameter name of a runexp (Google TF1) variable name."""
    if google_name in _SPECIAL:
        return _SPECIAL[google_name]
    scope, _, leaf = google_name.rpartition("/")
    if leaf in _EMBEDDING_TABLES and scope == "bert/embeddings":
        return f"bert.embeddings.{leaf}.weight"
    if leaf not in _LEAVES or not google_name.startswith(("bert/", "cls/")):
        raise KeyError(f"no transformers name for the variable {google_name!r}")
    scope = _LAYER.sub(lambda m: f"/layer/{m.group(1)}/", scope + "/").rstrip("/")
    return f"{scope.replace('/', '.')}.{_LEAVES[leaf]}"


def transposed(google_name: str) -> bool:
    """Whether the tensor is transposed between the two layouts (Dense kernels)."""
    return google_name.endswith("/kernel")


def name_table(google_names: Iterable[str]) -> dict[str, str]:
    """{Google name: transformers name} for a model's variables; one-to-one."""
    table = {name: huggingface_name(name) for name in google_names}
    if len(set(table.values())) != len(table):
        raise ValueError("two variables map to one transformers name")  # a bug in the rules
    return table


def to_huggingface(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{Google name: array} -> {transformers name: float32 array, contiguous}."""
    out = {}
    for name, value in arrays.items():
        value = np.asarray(value, dtype=np.float32)
        out[huggingface_name(name)] = np.ascontiguousarray(value.T if transposed(name)
                                                           else value)
    return out


def canonical_name(hf_name: str) -> str:
    """A transformers checkpoint name as BertForPreTraining spells it today: the "bert."
    prefix of a bare BertModel added, the legacy LayerNorm ``gamma``/``beta`` renamed."""
    if hf_name.startswith(_ENCODER_ROOTS):
        hf_name = "bert." + hf_name
    if ".LayerNorm." in hf_name:
        hf_name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", hf_name))
    return hf_name


def from_huggingface(tensors: Mapping[str, np.ndarray], google_names: Iterable[str]
                     ) -> tuple[dict[str, np.ndarray], list[str]]:
    """A transformers checkpoint's tensors in runexp's layout.

    Args:
      tensors: {transformers name: array}, e.g. ``safetensors.numpy.load_file(...)``; a
        BertModel's bare names and legacy ``gamma``/``beta`` are accepted.
      google_names: the runexp model's variable names (what to look for).

    Returns:
      ({Google name: array, transposed back}, for the names found; the transformers names
      no runexp variable takes, tied copies and buffers left out).

    Raises:
      ValueError: the tied decoder differs from the word embeddings (an untied model,
        which runexp cannot hold).
    """
    canonical = {}
    for name, value in tensors.items():
        canonical[canonical_name(name)] = value
    out = {}
    table = name_table(google_names)
    for google, hf in table.items():
        if hf in canonical:
            value = np.asarray(canonical[hf])
            out[google] = value.T if transposed(google) else value
    # Older savers wrote the tied copies; a decoder bias alone still carries the MLM bias.
    decoder_weight, decoder_bias = TIED_DECODER
    word = "bert/embeddings/word_embeddings"
    if decoder_weight in canonical and word in out and not np.array_equal(
            canonical[decoder_weight], out[word]):
        raise ValueError(f"{decoder_weight} differs from the word embeddings: the masked-LM "
                         "decoder is not tied, and runexp's is the word embeddings")
    bias = "cls/predictions/output_bias"
    if decoder_bias in canonical and bias in table:
        if bias not in out:
            out[bias] = np.asarray(canonical[decoder_bias])
        elif not np.array_equal(canonical[decoder_bias], out[bias]):
            raise ValueError(f"{decoder_bias} differs from cls.predictions.bias")
    taken = set(table.values()) | set(TIED_DECODER)
    unused = sorted(name for name in canonical
                    if name not in taken and not _BUFFERS.search(name))
    return out, unused
