"""The encoder that training stages share: its bert_config, and whether a checkpoint fits it."""

from __future__ import annotations

import json
import os
import re
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.errors import Location
from runexp.compiler.model_sizes import bert_config
from runexp.compiler.plan import Stage
from runexp.compiler.specs import ModelSpec
from runexp.compiler.formats.huggingface_dir import (RUNEXP_ACTIVATION, TOKENIZER_CONFIG_FILE,
                                             HuggingFaceDir)
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.stages.huggingface_init import HuggingFaceInit
from runexp.compiler.formats.checkpoint_index import CheckpointIndexError, read_index

# Google's released checkpoints live in directories named like uncased_L-12_H-768_A-12.
GOOGLE_RELEASE = re.compile(r"(?:^|/)(?:wwm_)?(?P<name>uncased|cased|multi_cased|multilingual|"
                            r"chinese)_L-(?P<layers>\d+)_H-(?P<hidden>\d+)_A-(?P<heads>\d+)/")
# Those trained on lower-cased text (google-research/bert's tokenization.py says which).
LOWER_CASED_RELEASES = ("uncased", "multilingual", "chinese")
# bert_config.json fields that must equal the model's for a checkpoint to load.
MODEL_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "vocab_size", "max_position_embeddings", "type_vocab_size", "hidden_act")


def model_config(ctx: PlanContext, b: StageBuilder, vocab: Stage,
                 hf: Optional[HuggingFaceInit] = None) -> Optional[dict]:
    """Sets the ``model`` param: the size preset, model.* overrides, the vocab's size; the
    activation and embedding rows of a Hugging Face init_checkpoint's config.json unless
    model.hidden_act / model.vocab_size are bound."""
    size = ctx.r.get("model", "size")
    overrides = {s.name: ctx.r.get("model", s.name) for s in ModelSpec.settings()
                 if s.name != "size"}
    if size is None:
        return None
    note = ""
    if hf is not None and hf.record is not None and ctx.loc("model", "hidden_act") is None:
        act = RUNEXP_ACTIVATION.get(hf.record.hidden_act)
        if act is None:
            ctx.c.error(f"init_checkpoint {hf.path}: config.json's hidden_act "
                        f"{hf.record.hidden_act!r} is not one runexp computes",
                        ctx.loc("train", "init_checkpoint") or ctx.loc("finetune",
                                                                       "init_checkpoint"),
                        hint=f"runexp has {', '.join(sorted(RUNEXP_ACTIVATION))}")
        elif act != overrides["hidden_act"]:
            overrides["hidden_act"] = act
            note = f"; hidden_act {act!r} from {hf.path.rstrip('/')}/config.json"
    vocab_size = vocab.params.get("vocab_size")
    if hf is not None and hf.record is not None and overrides["vocab_size"] is None:
        # The embedding table's rows, which a vocabulary may leave partly unused.
        overrides["vocab_size"] = hf.record.vocab_size
        note += f"; vocab_size {hf.record.vocab_size} from {hf.path.rstrip('/')}/config.json"
    if overrides["vocab_size"] is None and vocab_size is None and vocab.params.get("vocab_path"):
        ctx.c.error("the vocab on gs:// is only counted at run time, so the model's "
                    "vocab_size is unknown", ctx.loc("model", "size"),
                    hint="set model.vocab_size to the vocab's token count (for a released "
                         "checkpoint: the rows of its embedding table, in bert_config.json)")
    if overrides["vocab_size"] is None:
        overrides["vocab_size"] = vocab_size
    elif vocab_size and overrides["vocab_size"] < vocab_size:
        padded = -(-vocab_size // 128) * 128
        ctx.c.error(f"model.vocab_size ({overrides['vocab_size']}) is smaller than the "
                    f"vocabulary ({vocab_size} tokens)", ctx.loc("model", "vocab_size"),
                    hint=f"set model.vocab_size = {padded} (the vocab size padded to a "
                         "multiple of 128) or leave it unset")
    config = bert_config(size, overrides)
    if config["hidden_size"] % config["num_attention_heads"]:
        ctx.c.error(f"hidden_size ({config['hidden_size']}) is not a multiple of "
                    f"num_attention_heads ({config['num_attention_heads']})",
                    ctx.loc("model", "num_attention_heads"),
                    hint="choose heads that divide the hidden size")
    b.set("model", config,
          f"model.size = {size!r} @ {ctx.r.provenance('model', 'size').short()}{note}")
    return config


def check_init_checkpoint(ctx: PlanContext, init: str, model: dict,
                          location: Optional[Location], accel,
                          hf: Optional[HuggingFaceInit] = None,
                          vocab: Optional[Stage] = None) -> None:
    """The checkpoint must fit the model and the casing: a Hugging Face directory by its
    config.json and tokenizer files; a Google checkpoint by the name of a Google release
    directory (cheap, also on gs://) and a local bert_config.json beside it."""
    if accel is not None and accel.needs_gcs and not uris.is_gcs(init):
        ctx.c.error(f"a TPU cannot read the local init_checkpoint {init!r}", location,
                    hint="copy the checkpoint to gs:// and point INIT_CHECKPOINT there")
    if hf is not None:
        if hf.record is not None:
            lower = (vocab.params if vocab else {}).get("do_lower_case")
            _check_fit(ctx, _huggingface_fields(ctx, hf.record, lower, location), model,
                       location, f"{hf.path.rstrip('/')}/config.json")
        return
    expected: dict = {}
    release = GOOGLE_RELEASE.search(init)
    if release:
        expected = {"num_hidden_layers": int(release["layers"]),
                    "hidden_size": int(release["hidden"]),
                    "num_attention_heads": int(release["heads"])}
        lower = release["name"] in LOWER_CASED_RELEASES
        if ctx.r.get("vocab", "do_lower_case") != lower:
            ctx.c.error(f"DO_LOWER_CASE is {not lower} but the checkpoint "
                        f"{release.group(0).strip('/')} was trained "
                        f"{'lower-cased' if lower else 'cased'}",
                        ctx.loc("vocab", "do_lower_case") or location,
                        hint=f"set DO_LOWER_CASE = {lower}")
    config_path = os.path.join(os.path.dirname(init), "bert_config.json")
    if not uris.is_gcs(init) and os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            ctx.c.error(f"cannot read {config_path}: {e}", location)
            return
        expected.update({k: v for k, v in config.items() if k in MODEL_FIELDS})
    if not uris.is_gcs(init):  # the variables' shapes: the truth, over names and configs
        expected.update(_local_checkpoint_shapes(ctx, init, location))
    _check_fit(ctx, expected, model, location, "its bert_config.json")


def _check_fit(ctx: PlanContext, expected: dict, model: dict, location: Optional[Location],
               config_name: str) -> None:
    wrong = [f"{k}: checkpoint {v!r}, model {model.get(k)!r}" for k, v in sorted(
        expected.items()) if model.get(k) is not None and model.get(k) != v]
    if wrong:
        only_vocab = len(wrong) == 1 and wrong[0].startswith("vocab_size:")
        ctx.c.error(f"the init checkpoint does not fit the model ({'; '.join(wrong)})",
                    location or ctx.loc("model", "size"),
                    hint="use the vocab the checkpoint was trained with (VOCAB = its vocab.txt)"
                    if only_vocab else "choose the model size of the checkpoint (e.g. include "
                    f"models/bert_large.gin) or set model.* to {config_name}")


def _huggingface_fields(ctx: PlanContext, record: HuggingFaceDir, lower: Optional[bool],
                        location: Optional[Location]) -> dict:
    """The model fields a Hugging Face directory pins down; its tokenizer checked against
    the experiment's casing (runexp tokenises as google-research/bert's FullTokenizer)."""
    for problem in record.unsupported:
        ctx.c.error(f"init_checkpoint {record.path} computes something runexp's BERT does "
                    f"not: {problem} ({record.path}/config.json)", location,
                    hint="give a BERT directory with google-research/bert's computation "
                         "(absolute positions, layer-norm epsilon 1e-12, an encoder)")
    where = f"{record.path}/{TOKENIZER_CONFIG_FILE}"
    if lower is not None and lower != record.do_lower_case:
        ctx.c.error(f"DO_LOWER_CASE is {lower} but the tokenizer of init_checkpoint "
                    f"{record.path} {'lower-cases' if record.do_lower_case else 'keeps case'} "
                    f"({where})", ctx.loc("vocab", "do_lower_case") or location,
                    hint=f"set DO_LOWER_CASE = {record.do_lower_case}")
    strips = record.do_lower_case if record.strip_accents is None else record.strip_accents
    if strips != record.do_lower_case or not record.tokenize_chinese_chars:
        ctx.c.error(f"the tokenizer of init_checkpoint {record.path} sets strip_accents="
                    f"{record.strip_accents}, tokenize_chinese_chars="
                    f"{record.tokenize_chinese_chars} ({where}): runexp tokenises as "
                    "google-research/bert does (accents stripped exactly when lower-casing, "
                    "CJK characters split)", location,
                    hint="use a BERT tokenizer with those settings, or a checkpoint trained "
                         "with them")
    fields = {name: getattr(record, name) for name in MODEL_FIELDS}
    fields["hidden_act"] = RUNEXP_ACTIVATION.get(record.hidden_act, record.hidden_act)
    return fields


_LAYER = re.compile(r"^bert/encoder/layer_(\d+)/")


def _local_checkpoint_shapes(ctx: PlanContext, prefix: str,
                             location: Optional[Location]) -> dict:
    """The model fields a local checkpoint's variables pin down (Google's names), read from
    its .index (compiler/formats/checkpoint_index.py); a missing or corrupt checkpoint is an error."""

    try:
        variables = read_index(prefix)
    except FileNotFoundError:
        folder = os.path.dirname(prefix) or "."
        found = sorted(f[:-len(".index")] for f in (os.listdir(folder) if os.path.isdir(folder)
                                                    else []) if f.endswith(".index"))
        ctx.c.error(f"no checkpoint at {prefix} ({os.path.basename(prefix)}.index does not "
                    "exist)", location,
                    hint=(f"checkpoints in {folder}: "
                          + ", ".join(os.path.join(folder, f) for f in found[:3])
                          if found else f"{folder} holds no checkpoint (no *.index file)")
                    + "; INIT_CHECKPOINT is a prefix, e.g. .../bert_model.ckpt")
        return {}
    except (OSError, CheckpointIndexError) as e:
        ctx.c.error(f"the checkpoint {prefix} cannot be read: {prefix}.index: {e}", location,
                    hint="copy the checkpoint again (all of .index and .data-*), or point "
                         "INIT_CHECKPOINT at another one")
        return {}
    shape = {name: dims for name, (_, dims) in variables.items()}
    out = {}
    pinned = {"bert/embeddings/word_embeddings": ("vocab_size", "hidden_size"),
              "bert/embeddings/position_embeddings": ("max_position_embeddings", None),
              "bert/embeddings/token_type_embeddings": ("type_vocab_size", None),
              "bert/encoder/layer_0/intermediate/dense/kernel": (None, "intermediate_size")}
    for name, fields in pinned.items():
        dims = shape.get(name)
        if dims and len(dims) == 2:
            out.update({field: dim for field, dim in zip(fields, dims) if field})
    layers = {int(m.group(1)) for m in map(_LAYER.match, shape) if m}
    if layers:
        out["num_hidden_layers"] = max(layers) + 1
    return out
