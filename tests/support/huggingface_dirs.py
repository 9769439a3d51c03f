"""Hugging Face BERT directories as users get them, written by transformers itself in a child
process (nothing can be downloaded here; runexp's compiler never imports transformers).

    path = save_bert_dir(tmp_path, vocab=TOKENS, lower=True)
    path = save_bert_dir(tmp_path, kind="roberta")      # another architecture
    path = save_bert_dir(tmp_path, kind="pytorch_bin")  # weights as a pickle only

``config`` overrides the small BertConfig below (e.g. the size of models/bert_tiny.gin).
"""

from __future__ import annotations

import json
import subprocess
import sys

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "value", "return", "##s", "a"]
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=128, hidden_act="gelu_new", layer_norm_eps=1e-7)

_WRITER = r"""
import json, os, sys
from transformers import (BertConfig, BertForPreTraining, BertTokenizer, RobertaConfig,
                          RobertaModel)
kind, out, vocab_file, lower, vocab_txt, config = sys.argv[1:7]
config = json.loads(config)
if kind == "roberta":
    RobertaModel(RobertaConfig(**config)).save_pretrained(out)
else:
    model = BertForPreTraining(BertConfig(**config))
    model.save_pretrained(out)
    if kind == "pytorch_bin":  # what save_pretrained wrote before safetensors (transformers 4
        import torch           # with safe_serialization=False); transformers 5 writes none
        os.remove(os.path.join(out, "model.safetensors"))
        torch.save(model.state_dict(), os.path.join(out, "pytorch_model.bin"))
tokenizer = BertTokenizer(vocab_file, do_lower_case=lower == "1")
tokenizer.save_pretrained(out)  # transformers 5: tokenizer.json, tokenizer_config.json
if vocab_txt == "1":  # as transformers 4 and converted Google checkpoints have it too
    tokenizer.backend_tokenizer.model.save(out)
"""


def save_bert_dir(tmp_path, kind: str = "bert", vocab=VOCAB, lower: bool = True,
                  vocab_txt: bool = True, vocab_size: int | None = None, name: str | None = None,
                  **config) -> str:
    """A directory save_pretrained wrote: ``kind`` "bert" (BertForPreTraining), "roberta" or
    "pytorch_bin"; the tokenizer over ``vocab`` (with vocab.txt beside tokenizer.json when
    ``vocab_txt``); config.json's vocab_size ``vocab_size`` (default: the vocab's)."""
    vocab_file = tmp_path / "source_vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    out = tmp_path / (name or kind)
    settings = {**SMALL, **config, "vocab_size": vocab_size or len(vocab)}
    subprocess.run([sys.executable, "-c", _WRITER, kind, str(out), str(vocab_file),
                    "1" if lower else "0", "1" if vocab_txt else "0", json.dumps(settings)],
                   check=True, capture_output=True, timeout=600)
    return str(out)
