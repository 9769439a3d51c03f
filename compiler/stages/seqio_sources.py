"""Planning the inputs of a pretraining task read through seqio: ``tfds``,
``seqio_documents`` and ``seqio_bert_features`` (compiler/specs/source.py).

The compiler stays free of TensorFlow, seqio and the user's code, so what it can check
here is what is on disk:
- ``tfds``: the prepared dataset in a local ``tfds_data_dir`` (TFDS's default directory when
  empty) is fingerprinted by its files, and its splits are checked against
  ``dataset_info.json``; one on gs:// is checked at run time.
- ``seqio_documents``, ``seqio_bert_features``: the task is registered by a module the gin
  file imports; the module's source is fingerprinted (compiler/user_modules.py). Whether it
  registers ``seqio_task``, and with which features, is checked when the stage runs
  (tasks/sources/seqio_sources.py), and the plan says so.

The size of a seqio source is unknown when planning, so ``num_shards = 0`` becomes the
shard count of an unknown size (compiler/shard_count.py).
"""

from __future__ import annotations

import json
import os
import re

from runexp.compiler import uris
from runexp.compiler.fingerprint import digest, file_digest
from runexp.compiler.specs.source_formats import SOURCE_FORMATS, TFDS_DATASET
from runexp.compiler.stages.common import AT_RUN_TIME, PlanContext, StageBuilder
from runexp.compiler.user_modules import planned_modules
from runexp.compiler.shard_count import auto_num_shards

TASK = "bert_pretraining_task"
# [namespace:]name[/config][:version]
_TFDS_NAME = re.compile(r"^(?:([a-z][\w-]*):)?([a-z][a-z0-9_]*)(?:/([\w.+-]+))?"
                        r"(?::(\d+\.[\d*]+\.[\d*]+))?$")
_SMALL_FILE = 1 << 20  # dataset files up to this size are fingerprinted by content
RUN_TIME_CHECK = "checked at run time (the compiler never imports seqio or your modules)"


def seqio_source_inputs(ctx: PlanContext, task: str, p: dict, b: StageBuilder
                        ) -> tuple[dict, dict, list]:
    """Inputs, their fingerprints and dependencies of a seqio source (module docstring)."""
    fmt = p["format"]
    _refuse_files(ctx, task, fmt)
    if SOURCE_FORMATS[fmt].reads == TFDS_DATASET:
        inputs, fps = _tfds(ctx, task, p, b)
    else:
        inputs, fps = _user_task(ctx, task, p, b)
    if p["num_shards"] == 0:
        b.set("num_shards", auto_num_shards(None),
              "auto: a seqio source's size is known at run time only (the count of an "
              "unknown size; set num_shards for a small source)")
    if p.get("validation_split") and p["validation_split"] == p.get("train_split"):
        ctx.c.warn(f"{task}: validation_split is the train split: evaluation will measure "
                   "memorisation, not generalisation",
                   ctx.loc(TASK, "validation_split", task),
                   hint="hold out examples the model never trains on (a TFDS slice such as "
                        "'train[:95%]' / 'train[95%:]' works for tfds)")
    return inputs, fps, []


def _refuse_files(ctx: PlanContext, task: str, fmt: str) -> None:
    """train_files and validation_files name text or TFRecord files; a seqio source has its
    own splits."""
    for param in ("train_files", "validation_files"):
        if ctx.r.get(TASK, param, task):
            ctx.c.error(f"{task}: {param} does not apply to format {fmt!r}: its examples come "
                        "from the source's splits (train_split, validation_split)",
                        ctx.loc(TASK, param, task),
                        hint="remove the binding (for runs/pretrain.gin: CORPUS_FILES = [] "
                             "and HELDOUT_FILES = []), or choose a text format")


def _user_task(ctx: PlanContext, task: str, p: dict, b: StageBuilder) -> tuple[dict, dict]:
    """seqio_documents, seqio_bert_features: the user's task, registered by a gin import."""
    where = ctx.loc(TASK, "format", task)
    if not p["seqio_task"]:
        ctx.c.error(f"{task}: format {p['format']!r} reads a seqio task of yours, but "
                    f"{task}/bert_pretraining_task.seqio_task is not set", where,
                    hint=f"set {task}/bert_pretraining_task.seqio_task = 'my_task' (the name "
                         "your module registers with seqio.TaskRegistry.add)")
    if not ctx.modules:
        ctx.c.error(f"{task}: format {p['format']!r} reads the seqio task "
                    f"{p['seqio_task'] or '?'!r}, but no gin file imports the module that "
                    "registers it", where,
                    hint="add `import my_project.tasks` (your module) to the gin file; runexp "
                         "imports it when the stage runs")
    else:
        b.provenance["seqio_task"] = (b.provenance.get("seqio_task", "") +
                                      f"; registered by the gin imports, {RUN_TIME_CHECK}")
    modules, fps = planned_modules(ctx)
    return {"modules": modules}, fps


def _tfds(ctx: PlanContext, task: str, p: dict, b: StageBuilder) -> tuple[dict, dict]:
    """A TFDS dataset: its prepared files, fingerprinted (module docstring)."""
    name, data_dir = p["tfds_name"], p["tfds_data_dir"]
    where = ctx.loc(TASK, "tfds_name", task) or ctx.loc(TASK, "format", task)
    if not name:
        ctx.c.error(f"{task}: format 'tfds' reads a TFDS dataset, but "
                    f"{task}/bert_pretraining_task.tfds_name is not set", where,
                    hint=f"set {task}/bert_pretraining_task.tfds_name = 'wikipedia/"
                         "20230601.en' (name[/config][:version])")
        return {}, {"tfds": AT_RUN_TIME}
    match = _TFDS_NAME.match(name)
    if match is None:
        ctx.c.error(f"{task}: tfds_name {name!r} is not name[/config][:version]", where,
                    hint="e.g. 'my_dataset', 'wikipedia/20230601.en' or 'c4/en:3.0.1'")
        return {}, {"tfds": AT_RUN_TIME}
    if data_dir and not uris.is_gcs(data_dir):
        b.params["tfds_data_dir"] = data_dir = uris.absolute(data_dir)
    root = data_dir or os.environ.get("TFDS_DATA_DIR") or \
        os.path.expanduser("~/tensorflow_datasets")
    namespace, dataset, config, version = match.groups()
    if uris.is_gcs(root) or namespace:  # on gs://, or a community dataset (namespace:)
        b.provenance["tfds_data_dir"] = (b.provenance.get("tfds_data_dir", "") +
                                         "; the dataset is " + RUN_TIME_CHECK)
        return {}, {"tfds": AT_RUN_TIME}
    dataset_dir = os.path.join(root, *[part for part in (dataset, config, version)
                                       if part and "*" not in part])
    infos = _dataset_infos(dataset_dir)
    if not infos:
        ctx.c.error(f"{task}: TFDS dataset {name!r} is not prepared in {root} (no "
                    f"dataset_info.json under {dataset_dir})",
                    ctx.loc(TASK, "tfds_data_dir", task) or where,
                    hint=f"prepare it first (tfds build {dataset} --data_dir={root}), "
                         "or point tfds_data_dir at the directory holding it (gs://tfds-data/"
                         "datasets has TFDS's public ones)")
        return {}, {"tfds": AT_RUN_TIME}
    _check_splits(ctx, task, p, infos)
    return {}, {"tfds": _listing_digest(dataset_dir)}


def _dataset_infos(dataset_dir: str) -> list[dict]:
    """The dataset_info.json of every version (and config) under ``dataset_dir``."""
    out = []
    for dirpath, dirnames, filenames in os.walk(dataset_dir):
        dirnames.sort()
        if "dataset_info.json" in filenames:
            try:
                with open(os.path.join(dirpath, "dataset_info.json"), encoding="utf-8") as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                out.append({})
    return out


def _check_splits(ctx: PlanContext, task: str, p: dict, infos: list[dict]) -> None:
    """Each split named (``train``, ``train[:90%]``, ``train+test``) is one the prepared
    dataset has."""
    known = sorted({s.get("name") for info in infos for s in info.get("splits", [])
                    if s.get("name")})
    if not known:
        return  # an unreadable dataset_info.json: TFDS says what is wrong at run time
    for param in ("train_split", "validation_split"):
        for part in filter(None, p.get(param, "").split("+")):
            base = part.split("[")[0].strip()
            if base not in known:
                ctx.c.error(f"{task}: {param} {p[param]!r}: the TFDS dataset {p['tfds_name']!r}"
                            f" has no split {base!r}", ctx.loc(TASK, param, task),
                            hint=f"its splits: {', '.join(known)}")


def _listing_digest(dataset_dir: str) -> str:
    """A prepared dataset's fingerprint: each file's name and size, with its content for
    the small ones (metadata) and its modification time for the others (data shards, which
    TFDS never rewrites in place), so a dry run stays fast on a large dataset."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(dataset_dir):
        dirnames.sort()
        for f in sorted(filenames):
            path = os.path.join(dirpath, f)
            st = os.stat(path)
            rel = os.path.relpath(path, dataset_dir)
            if st.st_size <= _SMALL_FILE:
                entries.append({**file_digest(path), "name": rel})
            else:
                entries.append({"name": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return digest(entries)
