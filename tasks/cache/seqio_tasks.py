"""Real ``seqio.Task`` registrations: BERT pretraining and TSV/JSONL classification.

seqio is the data path of the pipeline: every pretraining task and mixture a plan trains or
evaluates on is registered here, by one factory (``register_bert_pretraining_task``), and
read with ``get_dataset(..., use_cached=True)`` (runtime/pretraining_data.py).

Caches. A preprocess stage directory is a seqio cache root: the task's cache is
``<stage dir>/<task name>/`` (records, ``info.<split>.json``, ``stats.<split>.json``,
``COMPLETED``; tasks/cache/records.py). Registering a task makes its cache root a seqio global cache
dir (first in the list, so the latest registration of a name finds its own cache), and
``seqio.Task.cache_dir`` finds the cache by itself.

Two ways to register a task, one factory:
- from its text files (``train_files`` given): the task also reads uncached, with the same
  shard builder as the preprocess stage, so uncached gives the examples the stage cached
  (shard after shard);
- from its cache alone (no text files): what the runtime does with the stage directories it
  is given; splits and shapes are the cache's, the cache is required.

Dynamic masking (RoBERTa). A split the preprocess stage left unmasked (``masking.json``; its
records carry ``word_starts``) is masked by a preprocessor after the
``CacheDatasetPlaceholder``: example ``i`` of the task's stream (after the cache read and the
repeat of ``num_epochs``, before the shuffle buffer) gets its mask from the stateless seed
pair ``[key, i]`` (tasks/instances/dynamic_masking.py; a stream read by position gives ``i`` as the
feature ``STREAM_POSITION``); ``key`` is drawn by seqio's own seeded-map
machinery from ``get_dataset``'s ``seed`` (and TensorFlow's global seed, which the pretrain
stage sets), mixed with a hash of the task's ``random_seed`` and name, so the members of a
mixture draw differently. The same seed gives the same masks at the same positions: a resumed
run that skips N batches sees what an uninterrupted one saw, and the next epoch (later
positions) masks every example anew. Statically masked splits pass through unchanged.

Fine-tuning: ``register_classification_task`` (TSV or JSONL files, one split per dev set) is
what the finetune stage reads through.

Registering a name again replaces the earlier task (handy in notebooks and tests).
Heavy module: imports seqio and TensorFlow.

Usage:
    register_experiment("runexp_output/quickstart")      # what runexp.tasks.register does
    register_pretraining_task_from_stage(preprocess_stage)      # name = stage.params["task"]
    register_cached_pretraining_task(stage_dir)           # the task a stage dir caches
    register_pretraining_mixture("mix", {"wiki": 0.7, "books": 0.3})  # tasks registered
    ds = seqio.get_mixture_or_task(name).get_dataset(split="train", sequence_length=None,
                                                     use_cached=True, shuffle=False)
    register_classification_task("stdlib_packages", train_file, {"dev": dev_file},
                                 ["sentence"], "label", labels, vocab_dir, max_seq_length=128)
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import seqio
import tensorflow as tf

from runexp.compiler.specs.preprocess import MAX_INSTANCES_PER_ROW
from runexp.compiler.specs.source import SourceSpec
from runexp.tasks.cache import records
from runexp.compiler.formats.classification_files import DataFileError, load_examples
from runexp.tasks.sources.classification import encode_examples, labels_of
from runexp.tasks.instances.dynamic_masking import mask_batch
from runexp.tasks.instances.masking import MaskingConfig
from runexp.tasks.instances.packing import PACKED_FEATURES
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats, cached_tokenizer,
                                             iter_shard_batches)
from runexp.tasks.cache.records import feature_spec, seqio_dtype
from runexp.tasks.vocabulary.seqio_vocabulary import seqio_vocabulary
from runexp.tasks.sources.text_files import expand_globs
from runexp.compiler.plan import Plan
from runexp.compiler.specs import FinetuneSpec
from runexp.runtime import storage

_TOKEN_FEATURES = ("input_ids", "masked_lm_ids")  # features whose values are vocab ids
_SHUFFLE_BUFFER = 10_000
_MASK_BATCH = 256  # examples the dynamic masking preprocessor masks at once
PLAN_FILE = "plan.json"
# An int64 feature a stream read by position gives each example: its position in the task's
# stream, what dynamic masking keys its mask with (removed by the masking).
STREAM_POSITION = "stream_position"


def add_cache_root(cache_root: str) -> None:
    """Makes ``cache_root`` (a directory holding ``<task>/`` caches) the first of seqio's
    global cache dirs: seqio takes the first dir holding a task's cache, so the latest
    registration of a task name finds its own. (``seqio.add_global_cache_dirs`` appends.)"""
    dirs = [d for d in seqio.get_global_cache_dirs() if d != cache_root]
    seqio.set_global_cache_dirs([cache_root, *dirs])


def _replace_task(name: str, **kwargs) -> seqio.Task:
    seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(name, **kwargs)


def _features(spec: Mapping[str, tuple], vocab: seqio.Vocabulary,
              ranks: Optional[Mapping[str, int]] = None) -> dict[str, seqio.Feature]:
    out = {}
    for name, (shape, dtype) in spec.items():
        vocabulary = vocab if name in _TOKEN_FEATURES else seqio.PassThroughVocabulary(
            vocab.vocab_size)
        # A packed task's own features are in its packed train split only.
        out[name] = seqio.Feature(vocabulary, add_eos=False, dtype=tf.as_dtype(seqio_dtype(dtype)),
                                  rank=(ranks or {}).get(name, len(shape)),
                                  required=name not in PACKED_FEATURES)
    return out


def task_key(random_seed: int, task: str) -> int:
    """What a task mixes into its dynamic masking key (stable across platforms)."""
    digest = hashlib.sha256(f"{random_seed}:{task}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # a non-negative int64


@seqio.map_over_dataset(num_seeds=1)
def _seqio_seed(unused_element, seed):
    """seqio's seed pair for the next seeded preprocessor (from ``get_dataset``'s seed)."""
    del unused_element
    return tf.stack(seed)


def dynamic_masking(task: str, masking_spec: Callable[[], Optional[dict]]):
    """The seqio preprocessor masking a split stored unmasked (module docstring).

    Args:
      task: the task's name (part of the mask key).
      masking_spec: () -> the task's masking.json contents (records.read_masking), or None
        when no split is masked at training time; called when a dataset is made.
    """

    def preprocess(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if "word_starts" not in dataset.element_spec:
            return dataset  # a statically masked split
        spec = masking_spec()
        if spec is None:
            raise ValueError(f"task {task}: a split has word_starts but no masking.json says "
                             "how to mask it")
        config = MaskingConfig.from_json(spec)
        # seqio's seed pair for this preprocessor (two 32-bit draws) as one int64, mixed
        # with the task's own key.
        a, b = tf.unstack(_seqio_seed(tf.data.Dataset.from_tensors(
            tf.constant(0, tf.int64))).get_single_element())
        key = tf.bitwise.bitwise_xor(
            tf.bitwise.bitwise_or(tf.bitwise.left_shift(a, 32), b),
            tf.constant(task_key(int(spec["random_seed"]), task), tf.int64))

        def with_seed(position, example):
            return example, tf.stack([key, position])

        def with_own_seed(example):
            example = dict(example)
            return example, tf.stack([key, example.pop(STREAM_POSITION)])

        if STREAM_POSITION in dataset.element_spec:
            # A stream read by position (runtime/pretraining_data.py): each example says where
            # it is in the task's stream, so no count from the start is needed.
            ds = dataset.map(with_own_seed, num_parallel_calls=tf.data.AUTOTUNE)
        else:
            ds = dataset.enumerate().map(with_seed, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.batch(_MASK_BATCH).map(lambda ex, seeds: mask_batch(ex, seeds, config),
                                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.unbatch()

    return preprocess


def _read_json(path: str) -> Optional[dict]:
    """A JSON file, local or gs:// (None when it does not exist)."""
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def _read_masking(cache_dir: str) -> Optional[dict]:
    """records.read_masking, local or gs://."""
    spec = _read_json(os.path.join(cache_dir, records.MASKING_FILE))
    return spec if spec is not None and "train" in spec.get("splits", ()) else None


def _cache_shapes(cache_dir: str) -> tuple[list[str], int, int, int]:
    """(splits, max_seq_length, max_predictions_per_seq, packed) of a task cache's info
    files (the first split's; ``packed``: instances a row at most, 0 unpacked)."""
    infos = {s: _read_json(records.info_path(cache_dir, s)) for s in ("train", "validation")}
    splits = [s for s, info in infos.items() if info is not None]
    if not splits:
        raise FileNotFoundError(f"no info.<split>.json in {cache_dir}")
    features = infos[splits[0]]["features"]
    packed = features["next_sentence_weights"]["shape"][0] \
        if "instance_ids" in features else 0
    return (splits, features["input_ids"]["shape"][0],
            features["masked_lm_ids"]["shape"][0], packed)


def register_bert_pretraining_task(name: str, vocab_dir: Optional[str] = None,
                                   train_files: Sequence[str] = (),
                                   validation_files: Sequence[str] = (), num_shards: int = 1,
                                   cache_root: Optional[str] = None,
                                   **params: Any) -> seqio.Task:
    """Registers a BERT pretraining task (splits "train" and, when it has one,
    "validation"): the one factory of runexp's pretraining tasks (module docstring).

    Args:
      name: the task name.
      vocab_dir: a vocab stage directory (needed to read uncached; None: the features'
        vocabularies pass ids through).
      train_files, validation_files: globs of text files (one sentence a line, blank line
        between documents); none: the task is read from its cache only.
      num_shards: shards per split (part of what decides the examples, as in preprocess).
      cache_root: the directory holding the task's cache as ``<cache_root>/<name>/`` (the
        preprocess stage directory); made a seqio global cache dir.
      **params: PretrainingConfig fields (max_seq_length, masked_lm_prob, dupe_factor, ...).
    """
    cache_dir = records.task_cache_dir(cache_root, name) if cache_root else None
    if cache_root:
        add_cache_root(cache_root)
    cached_masking = lambda: _read_masking(cache_dir) if cache_dir else None  # noqa: E731
    if train_files:
        config = PretrainingConfig.from_params(params)
        seq, preds = config.max_seq_length, config.predictions_per_row
        packed = MAX_INSTANCES_PER_ROW if config.packing else 0
        source = _text_source(config, vocab_dir, train_files, validation_files, num_shards)

        def masking_spec():
            # The cache's record of it when there is one, else what the stage would write.
            if not config.dynamic_masking:
                return None
            return cached_masking() or config.masking_spec(cached_tokenizer(vocab_dir))
        placeholder = seqio.CacheDatasetPlaceholder()
    else:
        if cache_dir is None:
            raise ValueError(f"task {name}: give its text files or its cache_root")
        splits, seq, preds, packed = _cache_shapes(cache_dir)
        source = seqio.FunctionDataSource(_cache_only(name), splits=splits)
        masking_spec = cached_masking
        placeholder = seqio.CacheDatasetPlaceholder(required=True)
    vocab = seqio_vocabulary(vocab_dir) if vocab_dir else seqio.PassThroughVocabulary(0)
    return _replace_task(
        name, source=source, output_features=_features(feature_spec(seq, preds, packed=packed),
                                                       vocab),
        preprocessors=[placeholder, dynamic_masking(name, masking_spec)],
        shuffle_buffer_size=_SHUFFLE_BUFFER)


def _cache_only(name: str):
    def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None):
        raise ValueError(f"task {name} was registered from its cache: read it with "
                         "use_cached=True")
    return dataset_fn


def _text_source(config: PretrainingConfig, vocab_dir: Optional[str],
                 train_files: Sequence[str], validation_files: Sequence[str],
                 num_shards: int) -> seqio.DataSource:
    """The examples the preprocess stage caches, made on the fly (files listed when read)."""
    patterns = {"train": train_files}
    if validation_files:
        patterns["validation"] = validation_files

    def signature(split: str) -> dict:
        # A split masked at training time also has word_starts (tasks/cache/records.py).
        return {k: tf.TensorSpec(shape, tf.as_dtype(seqio_dtype(dtype))) for k, (shape, dtype)
                in feature_spec(config.max_seq_length,
                                config.predictions_per_row if config.is_packed(split)
                                else config.masking.max_predictions_per_seq,
                                config.is_dynamic(split),
                                MAX_INSTANCES_PER_ROW if config.is_packed(split) else 0).items()}

    def generate(split: str):
        if vocab_dir is None:
            raise ValueError("reading a pretraining task uncached needs its vocab_dir")
        files = tuple(expand_globs(patterns[split]))
        numpy_dtypes = {k: s.dtype.as_numpy_dtype for k, s in signature(split).items()}
        for shard in range(num_shards):
            for batch in iter_shard_batches(files, vocab_dir, config, split, shard,
                                            num_shards, ShardStats()):
                batch = {k: v.astype(numpy_dtypes[k]) for k, v in batch.items()}
                for i in range(len(batch["input_ids"])):
                    yield {k: v[i] for k, v in batch.items()}

    def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None):
        del shuffle_files, seed  # the examples' order is part of what the seed decides
        return tf.data.Dataset.from_generator(lambda: generate(split),
                                              output_signature=signature(split))

    return seqio.FunctionDataSource(dataset_fn, splits=list(patterns))


def register_pretraining_task_from_stage(stage, cache_root: Optional[str] = None,
                                         rebase: Callable[[Any], Any] = lambda x: x
                                         ) -> seqio.Task:
    """Registers the task a preprocess ``Stage`` materialises, with its cache under
    ``cache_root`` (default: the stage's output_dir); ``rebase`` maps the stage's input
    paths (an experiment read from another place than it was run)."""
    p, inputs = dict(stage.params), rebase(dict(stage.inputs))
    # Only a text source can be read again uncached; the others (seqio sources, adopted
    # examples) are registered from their cache.
    text = SourceSpec.pick(p).reads_text_files
    return register_bert_pretraining_task(
        p.pop("task"), vocab_dir=inputs["vocab_dir"],
        train_files=(inputs.get("train_files") or ()) if text else (),
        validation_files=(inputs.get("validation_files") or ()) if text else (),
        num_shards=int(p.pop("num_shards", 1) or 1),
        cache_root=cache_root or stage.output_dir, **p)


def register_cached_pretraining_task(data_dir: str) -> str:
    """Registers the task a preprocess stage directory caches, from the cache alone (the
    runtime's way: a stage gets its upstream directories, not their plans). Returns its
    name."""
    name, _ = records.task_cache_of(data_dir)
    register_bert_pretraining_task(name, cache_root=data_dir)
    return name


def register_pretraining_mixture(name: str, rates: Mapping[str, float]) -> seqio.Mixture:
    """Registers a ``seqio.Mixture`` of registered pretraining tasks (task -> rate), in task
    name order. Registering a name again replaces it."""
    seqio.MixtureRegistry.remove(name)
    return seqio.MixtureRegistry.add(name, [(task, float(rates[task])) for task in sorted(rates)])


def register_pretraining_from_plan(plan, output_root: Optional[str] = None) -> list[str]:
    """Registers the seqio tasks of a compiled plan: every preprocess stage's task (its cache
    in its stage directory), the pretrain stage's mixture when it trains on one, and every
    finetune stage's classification task (read from its files). Returns the names
    registered.

    ``output_root``: where the experiment is now, when not at ``plan.output_root`` (stage
    directories and inputs under the plan's root are read there instead)."""
    rebase = _rebaser(plan.output_root, output_root)
    names = []
    for stage in plan.stages:
        if stage.kind == "preprocess":
            # Pretraining in phases: a task's later phase comes later in the plan and
            # replaces the earlier registration (its cache, its length).
            root = rebase(stage.output_dir)
            name = register_pretraining_task_from_stage(stage, root, rebase).name
            if name not in names:
                names.append(name)
    for stage in plan.stages:
        if stage.kind == "pretrain" and stage.params.get("mixture"):
            register_pretraining_mixture(stage.params["mixture"], stage.params["mixture_rates"])
            names.append(stage.params["mixture"])
    for stage in plan.stages:
        if stage.kind == "finetune":
            names.append(_register_finetune_task(stage, rebase).name)
    return names


def _register_finetune_task(stage, rebase: Callable[[Any], Any]) -> seqio.Task:
    """The classification task a finetune ``Stage`` trains on (its files as planned)."""

    spec, inputs = FinetuneSpec.from_stage(stage), rebase(dict(stage.inputs))
    one = lambda v: v if isinstance(v, str) else v[0]  # noqa: E731 - a planned file (list)
    dev = {name: one(f) for name, f in (inputs.get("dev_files") or {}).items()}
    if inputs.get("dev_file"):
        dev = {"dev": one(inputs["dev_file"]), **dev}
    return register_classification_task(
        spec.task, one(inputs["train_file"]), dev, spec.data.text_fields,
        spec.data.label_field, spec.data.labels, inputs["vocab_dir"], spec.max_seq_length,
        columns=spec.data.columns, regression=spec.data.task_kind().regression)


def _rebaser(old_root: str, new_root: Optional[str]) -> Callable[[Any], Any]:
    """Maps paths (in str, list and dict values) under ``old_root`` to ``new_root``."""
    old = old_root.rstrip("/")
    new = (new_root or old_root).rstrip("/")

    def rebase(value):
        if isinstance(value, str):
            if value == old or value.startswith(old + "/"):
                return new + value[len(old):]
            return value
        if isinstance(value, (list, tuple)):
            return [rebase(v) for v in value]
        if isinstance(value, dict):
            return {k: rebase(v) for k, v in value.items()}
        return value

    return rebase


def read_plan(output_root: str):
    """The Plan an experiment saved as ``<output_root>/plan.json`` (local or gs://)."""

    path = output_root.rstrip("/") + "/" + PLAN_FILE
    if "://" in output_root:
        text = storage.read_text(path)
    else:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{output_root} holds no runexp experiment (no {PLAN_FILE})")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    return Plan.from_json(text)


def register_experiment(output_root: str) -> list[str]:
    """Registers every pretraining task and mixture of the experiment at ``output_root``
    with its cache (runexp.tasks.register). Returns the names registered."""
    return register_pretraining_from_plan(read_plan(output_root), output_root)


def register_classification_task(name: str, train_file: str,
                                 dev_file: str | Mapping[str, str],
                                 text_fields: Sequence[str], label_field: str,
                                 labels: Optional[Sequence[str]], vocab_dir: str,
                                 max_seq_length: int, columns: Optional[Sequence[str]] = None,
                                 regression: bool = False) -> seqio.Task:
    """Registers a classification task from TSV or JSONL: split "train", and "validation"
    for one ``dev_file`` or one split per named dev set (``dev_file``: name -> file).

    Features: input_ids, input_mask, segment_ids (int32 [max_seq_length]), label_ids (int32),
    or for a ``regression`` label_values (float32: the scores; ``labels`` unused).
    ``labels`` None takes the sorted labels of the train file. An example whose label is
    not one of ``labels`` is an error (DataFileError): a dev example the model cannot
    predict would be scored wrong, or silently left out. Examples keep the files' order.
    ``columns`` names the columns of TSV files without a header line (GLUE's CoLA).
    """
    dev = {"validation": dev_file} if isinstance(dev_file, str) else dict(dev_file)
    files = {"train": train_file, **dev}
    known = [list(labels)] if labels is not None else []  # read from train when first needed
    seq = [max_seq_length]
    target, target_spec = (("label_values", ([], "float32")) if regression
                           else ("label_ids", ([], "int64")))
    spec = {"input_ids": (seq, "int64"), "input_mask": (seq, "int64"),
            "segment_ids": (seq, "int64"), target: target_spec}

    def read(path: str):
        return load_examples(path, text_fields, label_field, columns=columns,
                             numeric_labels=regression)

    def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None):
        del shuffle_files, seed
        examples = read(files[split])
        if regression:
            return tf.data.Dataset.from_tensor_slices(encode_examples(
                examples, cached_tokenizer(vocab_dir), None, max_seq_length, regression=True))
        if not known:
            known.append(labels_of(read(train_file)))
        unseen = sorted({label for _, label in examples} - set(known[0]))
        if unseen:  # checked in the dry run for local files; here for gs:// ones
            raise DataFileError(
                files[split], 0, f"{split}: labels the model is never trained on: "
                f"{', '.join(map(repr, unseen[:5]))}",
                f"the task's labels are {', '.join(map(repr, known[0][:8]))}: fix the "
                f"labels (spelling, case), or list every label in {name}/"
                "classification_task.labels")
        arrays = encode_examples(examples, cached_tokenizer(vocab_dir), known[0],
                                 max_seq_length)
        return tf.data.Dataset.from_tensor_slices(arrays)

    return _replace_task(
        name,
        source=seqio.FunctionDataSource(dataset_fn, splits=list(files)),
        output_features=_features(spec, seqio_vocabulary(vocab_dir), ranks={target: 0}),
        shuffle_buffer_size=_SHUFFLE_BUFFER)
