"""Real ``seqio.Task`` registrations: BERT pretraining and TSV/JSONL classification.

Pretraining tasks produce google-research/bert's features (records.py) from text files with
the same shard builder the preprocess stage uses, so a task read uncached gives the examples
the stage cached (shard after shard). A ``seqio.CacheDatasetPlaceholder`` marks the whole
pipeline as cacheable; ``get_dataset(use_cached=True)`` reads the preprocess stage's
directory. seqio looks for caches under ``<global cache dir>/<task name>/COMPLETED``; a stage
directory is named by stage id, not task name, so the task is pointed at it directly
(``cache_dir=``).

Registering a name again replaces the earlier task (handy in notebooks and tests).
Heavy module: imports seqio and TensorFlow.

A train split masked at training time (``dynamic_masking``) is read unmasked, with its
``word_starts`` feature; its validation split is masked as always.

Usage:
    register_pretraining_task_from_stage(preprocess_stage)      # name = stage.params["task"]
    register_pretraining_mixture("mix", {"wiki": 0.7, "books": 0.3})  # tasks registered
    register_pretraining_from_plan(plan)                  # every task, and the mixture
    ds = seqio.get_mixture_or_task(name).get_dataset(split="train", sequence_length=None,
                                                     use_cached=True, shuffle=False)
    register_classification_task("stdlib_packages", train_file, dev_file, ["sentence"],
                                 "label", labels, vocab_dir, max_seq_length=128)
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import seqio
import tensorflow as tf

from runexp.tasks.classification import encode_examples, labels_of, load_examples
from runexp.tasks.pretraining_shards import (PretrainingConfig, ShardStats, cached_tokenizer,
                                             iter_shard_batches)
from runexp.tasks.records import feature_spec, seqio_dtype
from runexp.tasks.seqio_vocabulary import BertVocabulary
from runexp.tasks.text_files import expand_globs

_TOKEN_FEATURES = ("input_ids", "masked_lm_ids")  # features whose values are vocab ids
_SHUFFLE_BUFFER = 10_000


def _replace_task(name: str, **kwargs) -> seqio.Task:
    seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(name, **kwargs)


def _features(spec: Mapping[str, tuple], vocab: seqio.Vocabulary,
              ranks: Optional[Mapping[str, int]] = None) -> dict[str, seqio.Feature]:
    out = {}
    for name, (shape, dtype) in spec.items():
        vocabulary = vocab if name in _TOKEN_FEATURES else seqio.PassThroughVocabulary(
            vocab.vocab_size)
        out[name] = seqio.Feature(vocabulary, add_eos=False, dtype=tf.as_dtype(seqio_dtype(dtype)),
                                  rank=(ranks or {}).get(name, len(shape)))
    return out


def register_bert_pretraining_task(name: str, vocab_dir: str, train_files: Sequence[str],
                                   validation_files: Sequence[str] = (), num_shards: int = 1,
                                   cache_dir: Optional[str] = None,
                                   **params: Any) -> seqio.Task:
    """Registers a BERT pretraining task (splits "train" and "validation").

    Args:
      name: the task name.
      vocab_dir: a vocab stage directory.
      train_files, validation_files: globs of text files (one sentence a line, blank line
        between documents).
      num_shards: shards per split (part of what decides the examples, as in preprocess).
      cache_dir: the preprocess stage directory holding this task's cache, if any.
      **params: PretrainingConfig fields (max_seq_length, masked_lm_prob, dupe_factor, ...).
    """
    config = PretrainingConfig.from_params(params)
    files = {"train": tuple(expand_globs(train_files))}
    if validation_files:
        files["validation"] = tuple(expand_globs(validation_files))
    spec = feature_spec(config.max_seq_length, config.max_predictions_per_seq)

    def signature(split: str) -> dict:
        # A split masked at training time also has word_starts (tasks/records.py).
        return {k: tf.TensorSpec(shape, tf.as_dtype(seqio_dtype(dtype))) for k, (shape, dtype)
                in feature_spec(config.max_seq_length, config.max_predictions_per_seq,
                                config.is_dynamic(split)).items()}

    def generate(split: str):
        numpy_dtypes = {k: s.dtype.as_numpy_dtype for k, s in signature(split).items()}
        for shard in range(num_shards):
            for batch in iter_shard_batches(files[split], vocab_dir, config, split, shard,
                                            num_shards, ShardStats()):
                batch = {k: v.astype(numpy_dtypes[k]) for k, v in batch.items()}
                for i in range(len(batch["input_ids"])):
                    yield {k: v[i] for k, v in batch.items()}

    def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None):
        del shuffle_files, seed  # the examples' order is part of what the seed decides
        return tf.data.Dataset.from_generator(lambda: generate(split),
                                              output_signature=signature(split))

    task = _replace_task(
        name,
        source=seqio.FunctionDataSource(dataset_fn, splits=list(files)),
        output_features=_features(spec, BertVocabulary(vocab_dir)),
        preprocessors=[seqio.CacheDatasetPlaceholder()],
        shuffle_buffer_size=_SHUFFLE_BUFFER)
    if cache_dir:
        task._cache_dir = cache_dir  # seqio's own attribute for a found cache (see docstring)
    return task


def register_pretraining_task_from_stage(stage) -> seqio.Task:
    """Registers the task a preprocess ``Stage`` materialised, reading its cache directory."""
    p, inputs = dict(stage.params), stage.inputs
    return register_bert_pretraining_task(
        p.pop("task"), vocab_dir=inputs["vocab_dir"], train_files=inputs["train_files"],
        validation_files=inputs.get("validation_files") or (),
        num_shards=int(p.pop("num_shards", 1) or 1), cache_dir=stage.output_dir, **p)


def register_pretraining_mixture(name: str, rates: Mapping[str, float]) -> seqio.Mixture:
    """Registers a ``seqio.Mixture`` of registered pretraining tasks (task -> rate), in task
    name order as the pretrain stage samples them. Registering a name again replaces it.

    A mixture of tasks masked at training time yields their unmasked train examples; pass
    ``passthrough_features=["word_starts"]`` to ``get_dataset`` to keep what masking needs.
    """
    seqio.MixtureRegistry.remove(name)
    return seqio.MixtureRegistry.add(name, [(task, float(rates[task])) for task in sorted(rates)])


def register_pretraining_from_plan(plan) -> list[str]:
    """Registers what a compiled plan pretrains on: every preprocess stage's task, and the
    pretrain stage's mixture when it trains on one. Returns the names registered."""
    names = []
    for stage in plan.stages:
        if stage.kind == "preprocess":
            names.append(register_pretraining_task_from_stage(stage).name)
    for stage in plan.stages:
        if stage.kind == "pretrain" and stage.params.get("mixture"):
            register_pretraining_mixture(stage.params["mixture"], stage.params["mixture_rates"])
            names.append(stage.params["mixture"])
    return names


def register_classification_task(name: str, train_file: str, dev_file: str,
                                 text_fields: Sequence[str], label_field: str,
                                 labels: Optional[Sequence[str]], vocab_dir: str,
                                 max_seq_length: int) -> seqio.Task:
    """Registers a classification task ("train" and "validation" splits) from TSV or JSONL.

    Features: input_ids, input_mask, segment_ids (int32 [max_seq_length]), label_ids (int32).
    ``labels`` None takes the sorted labels of the train file.
    """
    files = {"train": train_file, "validation": dev_file}
    if labels is None:
        labels = labels_of(load_examples(train_file, text_fields, label_field))
    labels = list(labels)
    seq = [max_seq_length]
    spec = {"input_ids": (seq, "int64"), "input_mask": (seq, "int64"),
            "segment_ids": (seq, "int64"), "label_ids": ([], "int64")}

    def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None):
        del shuffle_files, seed
        examples = load_examples(files[split], text_fields, label_field)
        arrays = encode_examples(examples, cached_tokenizer(vocab_dir), labels, max_seq_length)
        return tf.data.Dataset.from_tensor_slices(arrays)

    return _replace_task(
        name,
        source=seqio.FunctionDataSource(dataset_fn, splits=list(files)),
        output_features=_features(spec, BertVocabulary(vocab_dir), ranks={"label_ids": 0}),
        shuffle_buffer_size=_SHUFFLE_BUFFER)
