"""Hugging Face's BERT ``config.json`` beside runexp's ``BertConfig``: the one written into an
export's ``huggingface/``, and the check that a Hugging Face directory given as
``init_checkpoint`` computes what the runexp model computes. No TensorFlow, no torch.

Every field that changes what the network computes is written and checked: a model that
loads but computes something else (another GELU, layer-norm epsilon, attention heads,
position scheme) is the failure this module exists to prevent.

Usage:
    config_json = huggingface_config(config, architecture="BertForPreTraining", pad_token_id=0)
    problems = config_problems(json.load(f), model_config)   # [] when it computes the same
    fields = runexp_model_fields(json.load(f))               # model.* values that fit it
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from runexp.compiler.formats.huggingface_dir import (  # noqa: F401 - one name table, re-exported
    CONFIG_FILE, HUGGINGFACE_ACTIVATION, LAYER_NORM_EPS, RUNEXP_ACTIVATION, WEIGHTS_FILE,
    unsupported_settings)
from runexp.runtime.bert_config import BertConfig

PRETRAINING = "BertForPreTraining"
SEQUENCE_CLASSIFICATION = "BertForSequenceClassification"

# BertConfig fields written as they are (transformers spells them as Google does).
_SHARED_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
                  "max_position_embeddings", "type_vocab_size", "initializer_range")
# The fields that decide what the network computes (dropout and initialisation do not).
_COMPUTE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size", "max_position_embeddings", "type_vocab_size",
                   "hidden_act")


def huggingface_config(config: BertConfig, *, architecture: str, pad_token_id: Optional[int],
                       labels: Optional[Sequence[str]] = None,
                       regression: bool = False) -> dict:
    """``config.json`` for transformers' BertForPreTraining (``architecture`` PRETRAINING)
    or BertForSequenceClassification (SEQUENCE_CLASSIFICATION, with ``labels`` in id
    order)."""
    out = {"architectures": [architecture], "model_type": "bert",
           **{name: getattr(config, name) for name in _SHARED_FIELDS},
           "hidden_act": HUGGINGFACE_ACTIVATION[config.hidden_act],
           "layer_norm_eps": LAYER_NORM_EPS,
           "position_embedding_type": "absolute",  # the only one runexp has
           # Only the embedding's padding_idx (its gradient): not what the network computes.
           "pad_token_id": None if pad_token_id is None else int(pad_token_id),
           "is_decoder": False,
           "add_cross_attention": False,
           "tie_word_embeddings": True,  # the masked-LM decoder is the word embeddings
           # runexp's classifier drops the pooled output at hidden_dropout_prob: null says so.
           "classifier_dropout": None,
           # dtype for transformers 5, torch_dtype for 4.x.
           "dtype": "float32", "torch_dtype": "float32"}
    if architecture == SEQUENCE_CLASSIFICATION:
        if not labels:
            raise ValueError("a sequence-classification config needs its labels")
        names = [str(label) for label in labels]
        # A regression's one output is its score: transformers then applies no softmax and
        # trains with mean squared error, as runexp's head.
        out.update(num_labels=len(names),
                   problem_type="regression" if regression else "single_label_classification",
                   id2label={str(i): name for i, name in enumerate(names)},
                   label2id={name: i for i, name in enumerate(names)})
    elif architecture != PRETRAINING:
        raise ValueError(f"architecture must be {PRETRAINING} or {SEQUENCE_CLASSIFICATION}; "
                         f"got {architecture!r}")
    return out


def runexp_model_fields(hf: Mapping) -> dict:
    """The model.* values (Google's bert_config fields) a transformers BERT config.json
    describes; hidden_act translated (None when runexp has no such activation)."""
    fields = {name: hf[name] for name in _COMPUTE_FIELDS if name in hf and name != "hidden_act"}
    # transformers' defaults for fields a config.json may leave out.
    fields.setdefault("type_vocab_size", 2)
    fields.setdefault("max_position_embeddings", 512)
    fields["hidden_act"] = RUNEXP_ACTIVATION.get(hf.get("hidden_act", "gelu"))
    return fields


def config_problems(hf: Mapping, model: BertConfig) -> list[str]:
    """Why a transformers BERT config.json computes something other than ``model`` (one
    phrase each); [] when it computes the same function."""
    problems = []
    if hf.get("model_type", "bert") != "bert":
        problems.append(f"model_type is {hf.get('model_type')!r}, not 'bert'")
    act = hf.get("hidden_act", "gelu")
    if RUNEXP_ACTIVATION.get(act) is None:
        problems.append(f"hidden_act {act!r} has no runexp counterpart "
                        f"(runexp has {sorted(set(RUNEXP_ACTIVATION))})")
    elif HUGGINGFACE_ACTIVATION[model.hidden_act] != HUGGINGFACE_ACTIVATION[
            RUNEXP_ACTIVATION[act]]:
        problems.append(f"hidden_act: the checkpoint's {act!r} is runexp's "
                        f"{RUNEXP_ACTIVATION[act]!r}, the model's is {model.hidden_act!r}")
    problems += unsupported_settings(hf)
    fields = runexp_model_fields(hf)
    for name in _COMPUTE_FIELDS:
        if name != "hidden_act" and name in fields and fields[name] != getattr(model, name):
            problems.append(f"{name}: checkpoint {fields[name]!r}, model "
                            f"{getattr(model, name)!r}")
    return problems
