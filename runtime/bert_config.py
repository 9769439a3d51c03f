"""Google's ``bert_config.json``: the model's shape as a ``BertConfig``, the file written beside
a checkpoint, and the check that a vocabulary fits the model. No TensorFlow.

Usage:
    config = BertConfig.from_dict(params["model"])
    check_vocab(config, inputs.get("vocab_dir"))
    write_bert_config(config, work_dir)         # <work_dir>/bert_config.json
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping
from runexp.tasks.vocabulary.tokenizer import REPORT_FILE, load_tokenizer

CONFIG_FILE = "bert_config.json"

# The hidden_act values the encoder implements (runtime/model.py's activation table).
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_exact", "relu", "tanh", "linear")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The fields of Google's ``bert_config.json``."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BertConfig":
        """Builds a config from a ``bert_config.json`` dict; unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in d.items() if k in names})
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size ({config.hidden_size}) must be a multiple of "
                f"num_attention_heads ({config.num_attention_heads})")
        if config.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"BertConfig.hidden_act must be one of {sorted(HIDDEN_ACTS)}; "
                             f"got {config.hidden_act!r}")
        return config

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def write_bert_config(config: BertConfig, directory: str) -> str:
    path = os.path.join(directory, CONFIG_FILE)
    with open(path, "w") as f:
        json.dump(config.to_dict(), f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def check_vocab(config: BertConfig, vocab_dir: str | None) -> None:
    """Refuses a model whose vocab_size is smaller than the vocab's token count."""

    if not vocab_dir or not os.path.exists(os.path.join(vocab_dir, REPORT_FILE)):
        return

    tokens = load_tokenizer(vocab_dir).vocab_size  # vocab.txt or spm.model
    if tokens > config.vocab_size:
        raise ValueError(f"model.vocab_size is {config.vocab_size} but the vocab in "
                         f"{vocab_dir} has {tokens} tokens: token ids would fall outside the "
                         "embeddings")
