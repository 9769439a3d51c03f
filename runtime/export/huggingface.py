"""The export's ``huggingface/``: a transformers BERT directory, loadable with
``AutoModel.from_pretrained("huggingface")`` and the Auto classes of its heads.

- ``config.json``: BertForPreTraining (a pretraining export: encoder, pooler, masked-LM and
  next-sentence heads) or BertForSequenceClassification (a fine-tuned one: encoder, pooler,
  classifier; ``id2label``/``label2id``), with every field that makes transformers compute
  what runexp computes (runtime/huggingface_config.py).
- ``model.safetensors``: the weights under transformers' names (runtime/huggingface_weights.py),
  written with safetensors' numpy API: no torch.
- the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ``vocab.txt`` for a
  WordPiece vocabulary), written by runtime/export/huggingface_tokenizer.py.

Usage:
    written = save_huggingface(model, out_dir, vocab_dir=..., seq_length=128, pad_token_id=0)
    save_huggingface(classifier, out_dir, ..., labels=["neg", "pos"])
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

from runexp.runtime import huggingface_config, huggingface_weights
from runexp.runtime.export.huggingface_tokenizer import write_tokenizer_files

HUGGINGFACE_DIR = "huggingface"
def save_huggingface(model, out_dir: str, *, vocab_dir: str, seq_length: int,
                     pad_token_id: Optional[int], labels: Optional[Sequence[str]] = None) -> list[str]:
    """Writes ``out_dir`` (created) for ``model``: a BertPretrainer, or a BertClassifier
    with its ``labels`` in id order. Returns the names of the files written."""
    os.makedirs(out_dir, exist_ok=True)
    architecture = (huggingface_config.SEQUENCE_CLASSIFICATION if labels is not None
                    else huggingface_config.PRETRAINING)
    config = huggingface_config.huggingface_config(
        model.config, architecture=architecture, pad_token_id=pad_token_id, labels=labels,
        regression=getattr(model, "regression", False))
    with open(os.path.join(out_dir, huggingface_config.CONFIG_FILE), "w",
              encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save_weights(model.google_variables(), os.path.join(out_dir,
                                                         huggingface_config.WEIGHTS_FILE))
    written = [huggingface_config.CONFIG_FILE, huggingface_config.WEIGHTS_FILE]
    return written + write_tokenizer_files(vocab_dir, out_dir, max_seq_length=seq_length)


def save_weights(variables, path: str) -> None:
    """model.safetensors of {Google name: variable}, under transformers' names."""
    from safetensors.numpy import save_file

    arrays = {name: var.numpy() for name, var in variables.items()}
    # "format": "pt" is what transformers' loader expects of a PyTorch-layout file.
    save_file(huggingface_weights.to_huggingface(arrays), path, metadata={"format": "pt"})
