"""What can be configured: every configurable, its parameters, their types and defaults.

This is the whole gin surface of runexp besides macros. A binding of a configurable or
parameter not listed here is an error with a "did you mean" hint. Configurables marked
`scoped` are registries keyed by scope: `legal/bert_pretraining_task.train_files = [...]`
declares the task `legal`; unscoped bindings of the same configurable are defaults for every
task.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

REQUIRED = object()  # default meaning "must be bound"


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter.

    Attributes:
      type: one of "int", "float", "bool", "str", "str_list", "dict".
      default: value when unbound (REQUIRED: must be bound).
      optional: None is allowed.
      choices: allowed values, for enums.
      minimum: smallest allowed number (inclusive).
      maximum: largest allowed number (inclusive).
      doc: one line for `runexp --explain` and errors.
    """

    type: str
    default: Any = REQUIRED
    optional: bool = False
    choices: tuple = ()
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    doc: str = ""


@dataclasses.dataclass(frozen=True)
class Configurable:
    params: dict
    scoped: bool = False
    doc: str = ""


def _pos(doc: str, default: Any = REQUIRED, minimum: float = 1, **kw) -> Param:
    return Param("int", default, minimum=minimum, doc=doc, **kw)


def _prob(doc: str, default: float) -> Param:
    return Param("float", default, minimum=0.0, maximum=1.0, doc=doc)


CONFIGURABLES: dict[str, Configurable] = {
    "experiment": Configurable(doc="The experiment as a whole.", params={
        "name": Param("str", None, optional=True,
                      doc="experiment name (default: the first gin file's name)"),
        "output_root": Param("str", doc="local directory or gs:// URI for every output"),
        "accelerator": Param("str", "cpu", doc="accelerator profile (see compiler/accelerators.py)"),
        "max_attempts": _pos("launches in all when a run is preempted (SIGTERM): relaunched "
                             "until done or this many", 1),
        "relaunch_backoff_s": Param("float", 30.0, minimum=0.0,
                                    doc="seconds before the first relaunch (doubled each time)"),
        "wall_time_hours": Param("float", None, optional=True, minimum=0.0,
                                 doc="stop cleanly with a checkpoint after this long (a 12-hour "
                                     "notebook: 11.5)"),
        "tpu": Param("str", None, optional=True,
                     doc="TPU name or grpc:// address (None: $TPU_NAME, else this TPU VM's own)"),
        "tpu_zone": Param("str", None, optional=True,
                          doc="the TPU's zone, e.g. 'us-central1-f' (also checked against the "
                              "bucket's location)"),
        "gcp_project": Param("str", None, optional=True, doc="the TPU's Google Cloud project"),
        "tpu_service_account": Param("str", None, optional=True,
                                     doc="the TPU's service account: preflight checks the "
                                         "bucket grants it access"),
    }),
    "builtin_corpus": Configurable(doc="The corpus built from the Python standard library.", params={
        "min_bytes": _pos("fail unless the train text has at least this many bytes", 2_000_000),
        "heldout_fraction": _prob("share of documents held out", 0.05),
        "finetune_classes": _pos("labels of the fine-tune task (stdlib packages)", 6, minimum=2),
        "seed": Param("int", 12345, doc="seed of the splits"),
    }),
    "vocab": Configurable(doc="The vocabulary: adopted from a file, or trained as a stage.", params={
        "path": Param("str", None, optional=True,
                      doc="BERT vocab.txt or SentencePiece .model to adopt; None trains one"),
        "size": _pos("vocabulary size to train", 30522, minimum=16),
        "do_lower_case": Param("bool", True, doc="lower-case (and strip accents) before tokenising"),
        "model_type": Param("str", "unigram", choices=("unigram", "bpe"),
                            doc="SentencePiece model type"),
        "max_sentences": _pos("sentences sampled to train the vocab", 1_000_000),
        "seed": Param("int", 12345, doc="sampling seed"),
    }),
    "bert_pretraining_task": Configurable(scoped=True, doc="A seqio task of BERT pretraining examples.",
                                          params={
        "train_files": Param("str_list", doc="globs: one sentence per line, blank line between documents"),
        "validation_files": Param("str_list", [], doc="held-out globs for evaluation"),
        "max_seq_length": _pos("tokens per example", 128, minimum=8),
        "max_predictions_per_seq": _pos("masked positions per example", 20),
        "masked_lm_prob": Param("float", 0.15, minimum=0.0, maximum=1.0,
                                doc="share of tokens masked"),
        "dupe_factor": _pos("static masks per instance (times each document is used)", 5),
        "short_seq_prob": _prob("share of shorter target lengths", 0.1),
        "random_next_prob": _prob("share of random next segments", 0.5),
        "mask_token_prob": _prob("of masked positions, share replaced by [MASK]", 0.8),
        "random_token_prob": _prob("of masked positions, share replaced by a random token", 0.1),
        "whole_word_masking": Param("bool", False, doc="mask whole words"),
        "pair_objective": Param("str", "nsp", choices=("nsp", "sop", "none"),
                                doc="next-sentence (nsp), sentence-order (sop) or single segments"),
        "ngram_max": _pos("mask whole-word n-grams up to this length (p ~ 1/n); 1: single words",
                          1),
        "dynamic_masking": Param("bool", False,
                                 doc="mask the train split at training time, anew each epoch "
                                     "(RoBERTa); validation stays statically masked"),
        "random_seed": Param("int", 12345, doc="seed of instance creation and masking"),
        "num_shards": _pos("output shards per split (0: one per 16 MB of text, at least 4)", 0,
                           minimum=0),
        "num_workers": _pos("worker processes (0: one per core)", 0, minimum=0),
    }),
    "bert_pretraining_mixture": Configurable(
        scoped=True, doc="A seqio mixture of bert_pretraining_tasks, sampled by rate.", params={
            "rates": Param("dict", doc="task name -> sampling rate (positive; normalised), "
                                      "e.g. {'wiki': 0.7, 'books': 0.3}"),
        }),
    "model": Configurable(doc="The BERT encoder (Google's bert_config.json fields).", params={
        "size": Param("str", "base", choices=("tiny", "mini", "small", "medium", "base", "large"),
                      doc="preset sizes; the fields below override it"),
        "hidden_size": _pos("hidden size", None, optional=True),
        "num_hidden_layers": _pos("layers", None, optional=True),
        "num_attention_heads": _pos("attention heads", None, optional=True),
        "intermediate_size": _pos("feed-forward size", None, optional=True),
        "vocab_size": _pos("embedding rows (default: the vocab's size)", None, optional=True),
        "hidden_act": Param("str", "gelu", choices=("gelu", "relu", "tanh"), doc="activation"),
        "hidden_dropout_prob": _prob("dropout", 0.1),
        "attention_probs_dropout_prob": _prob("attention dropout", 0.1),
        "max_position_embeddings": _pos("position embeddings", 512),
        "type_vocab_size": _pos("segment types", 2),
        "initializer_range": Param("float", 0.02, minimum=0.0, doc="truncated normal stddev"),
    }),
    "train": Configurable(doc="Pretraining.", params={
        "task": Param("str", None, optional=True,
                      doc="name of the bert_pretraining_task or bert_pretraining_mixture to "
                          "train on (None: fine-tune only)"),
        "steps": _pos("training steps", 100_000),
        "batch_size": _pos("global batch size", 256),
        "warmup_steps": _pos("linear warmup steps", 10_000, minimum=0),
        "learning_rate": Param("float", 1e-4, minimum=0.0, doc="peak learning rate"),
        "weight_decay": Param("float", 0.01, minimum=0.0, doc="AdamW weight decay"),
        "checkpoint_every": _pos("steps between checkpoints", 1000),
        "keep_checkpoints": _pos("checkpoints kept", 5),
        "init_checkpoint": Param("str", None, optional=True,
                                 doc="checkpoint in Google's BERT layout to start from"),
        "steps_per_loop": _pos("steps per host loop", 1),
        "log_every": _pos("steps between logs and summaries", 100),
        "seed": Param("int", 12345, doc="initialisation and data order seed"),
        "optimizer": Param("str", "adamw", choices=("adamw", "lamb", "amos"),
                           doc="AdamW as BERT; LAMB for large batches; Amos"),
        "decay": Param("str", "linear", choices=("linear", "polynomial"),
                       doc="learning-rate decay after warmup"),
        "decay_power": Param("float", 1.0, minimum=0.0, doc="power of polynomial decay"),
        "end_learning_rate": Param("float", 0.0, minimum=0.0, doc="rate at the last step"),
        "clip_norm": Param("float", 1.0, minimum=0.0, doc="global-norm clipping (0: off)"),
        "grad_accum_steps": _pos("micro-batches accumulated per step (batch / k each)", 1),
        "compute_dtype": Param("str", "float32", choices=("float32", "bfloat16", "mixed_float16"),
                               doc="bfloat16 on TPU; mixed_float16 (loss scaling) on GPU"),
        "jit_compile": Param("bool", None, optional=True,
                             doc="XLA-compile the training step (None: where it is faster, "
                                 "one replica on CPU or GPU; TPU steps are always compiled)"),
        "eval_every": _pos("steps between held-out evaluations during training (0: off)", 0,
                           minimum=0),
    }),
    "evaluate": Configurable(doc="Held-out MLM/NSP evaluation after pretraining.", params={
        "enabled": Param("bool", True, doc="run the evaluate stage"),
        "batch_size": _pos("evaluation batch size", 64),
        "max_examples": _pos("cap on evaluated examples", None, optional=True),
    }),
    "classification_task": Configurable(scoped=True, doc="A sentence (pair) classification task.",
                                        params={
        "train_file": Param("str", doc="TSV with a header, or JSONL"),
        "dev_file": Param("str", None, optional=True, doc="TSV with a header, or JSONL"),
        "dev_files": Param("dict", None, optional=True,
                           doc="several named dev sets, scored each: {'matched': ..., "
                               "'mismatched': ...}"),
        "text_fields": Param("str_list", ["sentence"], doc="one field, or two for pairs"),
        "label_field": Param("str", "label", doc="the label column"),
        "labels": Param("str_list", None, optional=True, doc="labels; None reads them from train"),
    }),
    "finetune": Configurable(doc="Fine-tuning, after pretraining or from a released checkpoint.",
                             params={
        "task": Param("str", None, optional=True, doc="classification_task name; None: no fine-tune"),
        "init_checkpoint": Param("str", None, optional=True,
                                 doc="checkpoint in Google's BERT layout to fine-tune (None: the "
                                     "pretrain stage's)"),
        "steps": _pos("training steps", 1000),
        "batch_size": _pos("global batch size", 32),
        "learning_rate": Param("float", 2e-5, minimum=0.0, doc="peak learning rate"),
        "warmup_steps": _pos("warmup steps", 100, minimum=0),
        "weight_decay": Param("float", 0.01, minimum=0.0, doc="AdamW weight decay"),
        "max_seq_length": _pos("tokens per example", 128, minimum=8),
        "seed": Param("int", 12345, doc="seed"),
    }),
    "export": Configurable(doc="SavedModel, Google-layout checkpoint, bert_config.json, vocab.",
                           params={
        "enabled": Param("bool", True, doc="run the export stage"),
    }),
}
