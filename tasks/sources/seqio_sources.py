"""Documents read through seqio: a TFDS dataset, or a seqio task of the user's.

Formats ``tfds`` and ``seqio_documents`` (compiler/specs/source.py). The preprocess stage
reads the documents once, in order, and writes them as JSONL (``{"text": ...}``, one a
line) in its spill directory; from there the usual sharded pipeline builds the instances
(format ``jsonl``). So a seqio source costs one sequential pass and its instances are made
exactly as a text corpus's would be. The vocab stage trains on ``iter_documents``.

The user's task is registered by a module a gin file imports (``import my_project.tasks``).
The compiler only finds and fingerprints that module (compiler/user_modules.py);
``import_user_modules`` imports it here, in the stage's process.

The contract for a document task: ``seqio.get_mixture_or_task(seqio_task).get_dataset(
split=..., sequence_length=None, use_cached=False, shuffle=False)`` gives examples with a
scalar ``tf.string`` feature ``text_field`` (UTF-8), one document each. Untokenized: runexp
tokenizes with the experiment's vocabulary. The output is deterministic: no shuffling, and
the seeded preprocessors of the task get a fixed seed (``DOCUMENT_SEED``), so the vocab and
preprocess stages see the same documents.

Heavy module: imports seqio and TensorFlow.

Usage:
    import_user_modules(ctx.inputs.get("modules", []))
    for text in iter_documents(source_spec, "train", modules): ...
    files, config = write_documents(ctx, config, spill_dir)  # the preprocess stage
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import sys
import traceback
from typing import Iterator, Mapping, Sequence

import seqio
import tensorflow as tf

from runexp.compiler.errors import UserError, did_you_mean
from runexp.compiler.specs.source import SourceSpec
from runexp.compiler.specs.source_formats import SEQIO_TASK, TFDS_DATASET

DOCUMENTS_DIR = "documents"  # under the spill directory: <split>.jsonl
DOCUMENT_SEED = 0
# Line breaks that json.dumps(ensure_ascii=False) leaves raw: escaped, so that a JSONL line
# is one document whatever splits lines.
_RAW_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}

# task or mixture name -> (module, gin import) of the user's module that registered it.
_REGISTERED_BY: dict[str, tuple[str, str]] = {}
_IMPORTED: dict[str, str] = {}  # module -> its gin import's location


def _registered() -> set[str]:
    return set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())


def import_user_modules(modules: Sequence[Mapping]) -> None:
    """Imports the gin imports of a plan (``[{"module", "sys_path", "path", "gin_import"}]``,
    compiler/user_modules.py): each ``sys_path`` first on sys.path, then the module. An
    import that fails is one UserError naming the module, the gin file and the line of the
    user's code that raised."""
    for m in modules or ():
        name, where = m["module"], m.get("gin_import", "")
        root = m.get("sys_path") or ""
        if root and root not in sys.path:
            sys.path.insert(0, root)
        if name in _IMPORTED:
            continue
        before = _registered()
        try:
            module = importlib.import_module(name)
        except Exception as e:  # the user's code: whatever it raises is told once, clearly
            frames = traceback.extract_tb(e.__traceback__)
            at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
            raise UserError(
                f"gin import {name!r} ({where}) failed: {type(e).__name__}: {e}{at}\n"
                f"  hint: check it alone: PYTHONPATH={root or '.'} python -c 'import {name}'"
            ) from e
        _check_same_file(module, m)
        _IMPORTED[name] = where
        for registered in _registered() - before:
            _REGISTERED_BY[registered] = (name, where)


def _check_same_file(module, planned: Mapping) -> None:
    """The module imported is the file the plan fingerprinted (not one imported earlier
    from elsewhere, which would run other code than the plan says)."""
    path, found = planned.get("path"), getattr(module, "__file__", None)
    if not path or not found or not os.path.exists(path):
        return
    if not os.path.samefile(path, found):
        raise UserError(
            f"gin import {planned['module']!r} ({planned.get('gin_import', '')}): this "
            f"process already has it from {found}, but the plan found {path}\n"
            "  hint: run the experiment in a fresh process (runexp's command line)")


def registered_by(name: str) -> str:
    """Which module registered the seqio task ``name`` (or which modules were imported)."""
    if name in _REGISTERED_BY:
        module, where = _REGISTERED_BY[name]
        return f"registered by {module} (gin import at {where})"
    imported = ", ".join(f"{m} ({w})" for m, w in _IMPORTED.items()) or "none"
    return f"the gin imports: {imported}"


def splits_of(source: SourceSpec) -> list[str]:
    """runexp's splits a source has: train, and validation when it names one."""
    return ["train"] + (["validation"] if source.validation_split else [])


def source_split(source: SourceSpec, split: str) -> str:
    """The source's split read as runexp's ``split`` ("train" or "validation")."""
    if split not in ("train", "validation"):
        raise ValueError(f"split is 'train' or 'validation', not {split!r}")
    return source.train_split if split == "train" else source.validation_split


def iter_documents(source: SourceSpec, split: str, modules: Sequence[Mapping] = ()
                   ) -> Iterator[str]:
    """The documents of runexp's ``split`` ("train" or "validation") of a ``tfds`` or
    ``seqio_documents`` source, in order, streamed (the gin imports ``modules`` imported
    first). Each document's text decoded as UTF-8 (invalid bytes replaced)."""
    import_user_modules(modules)
    reads = source.source_format.reads
    if reads == TFDS_DATASET:
        ds, what = _tfds_dataset(source, split)
    elif reads == SEQIO_TASK and source.makes_instances:
        ds, what = _task_dataset(source, split)
    else:
        raise ValueError(f"format {source.format!r} is not read as documents")
    field = source.text_field
    _check_text_feature(ds.element_spec, field, what)
    texts = ds.map(lambda ex: ex[field], num_parallel_calls=tf.data.AUTOTUNE,
                   deterministic=True).prefetch(tf.data.AUTOTUNE)
    try:
        for text in texts.as_numpy_iterator():
            yield text.decode("utf-8", errors="replace")
    except tf.errors.OpError as e:
        raise UserError(f"reading {what} failed: {e.message.strip()}") from e


def _tfds_dataset(source: SourceSpec, split: str) -> tuple[tf.data.Dataset, str]:
    """A prepared TFDS dataset's split, in file order (never downloads or prepares)."""
    name, data_dir = source.tfds_name, source.tfds_data_dir or None
    wanted = source_split(source, split)
    what = f"TFDS dataset {name!r} split {wanted!r} (data dir {data_dir or 'TFDS default'})"
    try:
        data = seqio.TfdsDataSource(name, tfds_data_dir=data_dir, splits={split: wanted},
                                    read_only=True)
        return data.get_dataset(split, shuffle=False), what
    except Exception as e:  # TFDS's own errors: not found, not prepared, unknown split
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"cannot read {what}: {type(e).__name__}: {first}\n"
            f"  hint: prepare it first (tfds build ... --data_dir=DIR) and set tfds_data_dir "
            "to DIR; tfds_name is name[/config][:version]") from e


def _task_dataset(source: SourceSpec, split: str) -> tuple[tf.data.Dataset, str]:
    """The user's seqio task's split, unshuffled, with a fixed seed (module docstring)."""
    name = source.seqio_task
    wanted = source_split(source, split)
    if name in seqio.MixtureRegistry.names():
        raise UserError(
            f"seqio_task {name!r} is a seqio mixture ({registered_by(name)}): a document source is "
            "one task\n  hint: declare one bert_pretraining_task per task and mix them with "
            "bert_pretraining_mixture.rates (runexp builds the mixture)")
    if name not in seqio.TaskRegistry.names():
        raise UserError(
            f"seqio task {name!r} is not registered ({registered_by(name)})\n"
            f"  hint: {did_you_mean(name, sorted(seqio.TaskRegistry.names())) or ''} the "
            "module registering it (seqio.TaskRegistry.add) must be imported by the gin "
            "file: import my_project.tasks")
    task = seqio.get_mixture_or_task(name)
    what = f"seqio task {name!r} split {wanted!r} ({registered_by(name)})"
    if wanted not in task.splits:
        raise UserError(f"{what}: the task has no split {wanted!r} (its splits: "
                        f"{', '.join(task.splits)})\n  hint: set train_split / "
                        "validation_split to one of them")
    try:
        ds = task.get_dataset(sequence_length=None, split=wanted, use_cached=False,
                              shuffle=False, seed=DOCUMENT_SEED, num_epochs=1,
                              try_in_mem_cache=False)
    except Exception as e:  # the user's source or preprocessors
        raise UserError(f"{what}: get_dataset failed: {type(e).__name__}: {e}\n"
                        f"  hint: {_CONTRACT}") from e
    return ds, what


_CONTRACT = ("a seqio_documents task's examples are documents: get_dataset(split, "
             "sequence_length=None, use_cached=False, shuffle=False) must give a scalar "
             "tf.string feature text_field per example, untokenized (runexp tokenizes); "
             "declare it in output_features as seqio.Feature(seqio.PassThroughVocabulary(1), "
             "dtype=tf.string, rank=0, add_eos=False), or leave it out of output_features")


def _check_text_feature(spec, field: str, what: str) -> None:
    """The examples have ``field`` as a scalar string; else one UserError with the
    contract."""
    features = spec if isinstance(spec, Mapping) else {}
    setting = f"text_field = {field!r}"
    if field not in features:
        have = ", ".join(sorted(features)) or "none (the examples are not dicts)"
        raise UserError(f"{what}: its examples have no feature {field!r} ({setting}); "
                        f"features: {have}\n  hint: {_CONTRACT}"
                        + ("; or set text_field to the one holding the text" if features
                           else ""))
    s = features[field]
    if not isinstance(s, tf.TensorSpec) or s.dtype != tf.string or s.shape.rank != 0:
        got = f"{s.dtype.name} of shape {s.shape}" if isinstance(s, tf.TensorSpec) else \
            type(s).__name__
        raise UserError(f"{what}: feature {field!r} is {got}, not a scalar string\n"
                        f"  hint: {_CONTRACT}"
                        + ("; the task tokenizes it: remove its tokenize preprocessor"
                           if isinstance(s, tf.TensorSpec) and s.dtype.is_integer else ""))


def _jsonl_line(text: str) -> str:
    line = json.dumps({"text": text}, ensure_ascii=False)
    for raw, escaped in _RAW_BREAKS.items():
        line = line.replace(raw, escaped)
    return line + "\n"


def write_documents(ctx, config, spill_dir: str):
    """Reads a seqio source's documents once and writes them as JSONL in
    ``<spill_dir>/documents/<split>.jsonl`` (empty documents left out). Returns
    ``({split: (path,)}, config)`` with the config's source now ``jsonl`` over those
    files, for the usual shard builder (tasks/instances/pretraining_shards.py)."""
    source: SourceSpec = config.source
    modules = ctx.inputs.get("modules") or ()
    out_dir = os.path.join(spill_dir, DOCUMENTS_DIR)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    files = {}
    for split in splits_of(source):
        path = os.path.join(out_dir, f"{split}.jsonl")
        documents = empty = replaced = size = 0
        with open(path, "w", encoding="utf-8") as f:
            for text in iter_documents(source, split, modules):
                if not text.strip():
                    empty += 1
                    continue
                replaced += "\ufffd" in text
                line = _jsonl_line(text)
                f.write(line)
                documents += 1
                size += len(line)
        what = _describe(source, split)
        if documents == 0:
            raise UserError(f"{what} gave no documents" + (f" ({empty} empty)" if empty
                                                             else ""))
        ctx.progress(f"read {documents:,} documents ({size / 1e6:.1f} MB of JSONL) from "
                     f"{what}" + (f"; {empty:,} empty ones left out" if empty else "")
                     + (f"; {replaced:,} with invalid UTF-8 replaced" if replaced else ""))
        files[split] = (path,)
    jsonl = dataclasses.replace(source, format="jsonl", text_field="text")
    return files, dataclasses.replace(config, source=jsonl)


def _describe(source: SourceSpec, split: str) -> str:
    wanted = source_split(source, split)
    if source.source_format.reads == TFDS_DATASET:
        return f"TFDS dataset {source.tfds_name!r} split {wanted!r}"
    return f"seqio task {source.seqio_task!r} split {wanted!r}"
