"""BERT pretraining shards: read, tokenize, plan instances, mask, serialise.

A split is built in two phases, so that its cost is linear in its size. Phase 1
(tasks/instances/split_index.py) reads and tokenises each input byte once, by byte ranges, into the
split's index of documents and blocks. Phase 2, here: ``write_shard`` takes the blocks
``assign_blocks`` gives shard k (balanced by size, spread over the whole split), plans
instances block by block, each block with its own seed ``(random_seed, split, block)``, and
masks and writes them in a shuffled order (``(random_seed, split, shard)``). A random next
segment is drawn from any other document of the split.

So the instances (their segments, lengths and labels) do not depend on the shard count:
only which shard holds them, their order, which side truncation cuts and their masks do;
nothing depends on the number of worker processes. Memory per worker: the shard's tokens,
sentence offsets and plan (~1.5 bytes per byte of text at ``dupe_factor`` 5) plus the
split's document index (16 bytes per document); the compiler's ``auto_num_shards`` keeps
shards at most 64 MiB of text. Instances are built, masked, serialised and written one batch
at a time, already in their final order.

With ``packing`` the train split's instances are packed into rows batch by batch (up to
``BATCH_SIZE`` instances packed together, tasks/instances/packing.py), after they are masked: each
instance is made and masked as unpacked, so packing changes which row holds it, not it.

Both the preprocess stage (parallel, to TFRecords) and the seqio task's uncached source
(sequential, to feature dicts; the index built in-process, from one range) build shards
here, so both give the same examples.

A later pretraining phase makes its examples from the first phase's splits: that stage
keeps their indexes (``plan_shard_jobs(..., index_dir=...)``), the later one builds its
shards from them (``plan_prebuilt_shard_jobs``) and reads no corpus byte.

Usage:
    config = PretrainingConfig.from_params(stage.params)
    jobs = plan_shard_jobs({"train": files}, vocab_dir, config, num_shards, work_dir)
    jobs = plan_prebuilt_shard_jobs(index_root, vocab_dir, config, num_shards, work_dir)
    for split, shard, stats in run_shard_jobs(jobs, pool.imap_unordered): ...
    summary.update(summary_fields(totals))  # input_bytes, input_bytes_read
    for batch in iter_shard_batches(files, vocab_dir, config, "train", 0, 4, ShardStats()):
        batch["input_ids"]  # [<= BATCH_SIZE, max_seq_length]

Light: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import shutil
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from runexp.compiler.specs.preprocess import PreprocessSpec
from runexp.compiler.specs.source import SourceSpec
from runexp.tasks.sources import input_files
from runexp.tasks.instances.masking import MaskingConfig
from runexp.tasks.instances.document_store import DocumentStore
from runexp.tasks.instances.packing import pack_batch
from runexp.tasks.instances.pretraining_instances import InstanceConfig, build_batch, plan_instances
from runexp.tasks.sources.text_files import InputIssues
from runexp.tasks.instances.split_index import (SPILL_DIR, RangeJob, RangeResult,
                                      build_split_index, plan_ranges, tokenize_range)
from runexp.tasks.instances.split_reader import local_index, open_index
from runexp.tasks.vocabulary.tokenizer import Tokenizer, cached_tokenizer  # noqa: F401 (re-exported)
from runexp.tasks.cache.records import TFRecordWriter, encode_instance_batch, shard_path

BATCH_SIZE = 1024


class PretrainingConfig(PreprocessSpec):
    """The preprocess stage's spec, with what building shards needs from the tokenizer."""

    def masking_config(self, tokenizer: Tokenizer, word_level: bool = False) -> MaskingConfig:
        return MaskingConfig(self.masking, tokenizer.vocab_size, tokenizer.mask_id,
                             tokenizer.cls_id, tokenizer.sep_id,
                             tokenizer.word_start_table() if word_level else None)

    def instance_config(self, tokenizer: Tokenizer, split: str = "train") -> InstanceConfig:
        dynamic = self.is_dynamic(split)
        masking = self.masking_config(tokenizer, self.masking.word_level or dynamic)
        # With masks drawn at training time, more passes would only duplicate instances.
        dupe_factor = 1 if dynamic else self.dupe_factor
        return InstanceConfig(self.max_seq_length, self.short_seq_prob, self.random_next_prob,
                              dupe_factor, masking, self.pair_objective, dynamic)

    def masking_spec(self, tokenizer: Tokenizer) -> dict:
        """What the training input pipeline needs to mask (records.write_masking)."""
        return {**self.masking_config(tokenizer).to_json(), "random_seed": self.random_seed,
                "splits": ["train"]}


def shard_key(seed: int, split: str, shard: int) -> str:
    return f"{seed}:{split}:{shard}"


def shard_rng(seed: int, split: str, shard: int) -> random.Random:
    # A str seed is hashed with SHA-512 by random.Random: stable across runs and platforms.
    return random.Random(shard_key(seed, split, shard))


def shard_np_rng(seed: int, split: str, shard: int) -> np.random.Generator:
    digest = hashlib.sha256(shard_key(seed, split, shard).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


@dataclasses.dataclass
class ShardStats:
    documents: int = 0
    sentences: int = 0
    document_tokens: int = 0
    unk_tokens: int = 0
    instances: int = 0
    tokens: int = 0   # non-padding input tokens
    masked: int = 0   # predicted positions (weight 1)
    random_next: int = 0  # pair label 1 (random next for nsp, swapped for sop)
    input_bytes: int = 0  # the split's text (in shard 0's stats)
    # Bytes read from it: in shard 0's stats with run_shard_jobs; without it, in the stats of
    # each job that built a local index (one per worker process). Not in counts(): it is a
    # cost, which depends on how the jobs were run, not a property of the output.
    input_bytes_read: int = 0
    rows: int = 0  # packed rows (packing: records; instances stay the instances in them)
    issues: InputIssues = dataclasses.field(default_factory=InputIssues)

    COUNTS = ("documents", "sentences", "document_tokens", "unk_tokens", "instances", "tokens",
              "masked", "random_next", "input_bytes")

    def add(self, other: "ShardStats") -> None:
        for name in self.COUNTS + ("input_bytes_read", "rows"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.issues.add(other.issues)

    def counts(self) -> dict[str, int]:
        """The output's counts; ``rows`` only for a packed split (an unpacked one's stats
        stay as they were before packing existed)."""
        out = {name: getattr(self, name) for name in self.COUNTS}
        if self.rows:
            out["rows"] = self.rows
        return out

    @property
    def records(self) -> int:
        """The split's records: its rows when packed, else its instances."""
        return self.rows or self.instances


def summary_fields(totals: Mapping[str, ShardStats]) -> dict:
    """The preprocess MANIFEST's cost fields, over all splits: ``input_bytes`` (text),
    ``input_bytes_read`` (by all workers together) and their ratio."""
    size = sum(s.input_bytes for s in totals.values())
    read = sum(s.input_bytes_read for s in totals.values())
    return {"input_bytes": size, "input_bytes_read": read,
            "read_per_input_byte": round(read / size, 4) if size else 0.0}


def packing_summary(stats: ShardStats, max_seq_length: int) -> dict:
    """A packed split's MANIFEST entry: its ``instances``, ``rows``, the packing ``factor``
    (instances a row), ``fill`` (real tokens / row tokens) and ``unpacked_fill`` (what one
    instance a row would fill); compiler/estimates.py reads it."""
    rows = max(stats.rows, 1)
    return {"instances": stats.instances, "rows": stats.rows,
            "factor": round(stats.instances / rows, 4),
            "fill": round(stats.tokens / (rows * max_seq_length), 4),
            "unpacked_fill": round(stats.tokens / (max(stats.instances, 1) * max_seq_length),
                                   4)}


def shard_documents(files: Sequence[str], vocab_dir: str, split: str, shard: int,
                    num_shards: int, random_seed: int = 0,
                    text_format: str = SourceSpec.format,
                    text_field: str = SourceSpec.text_field) -> DocumentStore:
    """The shard's documents (tests, inspection)."""
    index = local_index(files, vocab_dir, text_format, text_field)
    return index.shard_store(index.shard_blocks(shard, num_shards), random_seed, split)[0]


def iter_shard_batches(files: Sequence[str], vocab_dir: str, config: PretrainingConfig,
                       split: str, shard: int, num_shards: int, stats: ShardStats,
                       batch_size: int = BATCH_SIZE, index_dir: str | None = None,
                       count_reads: bool = True) -> Iterator[dict[str, np.ndarray]]:
    """The shard's instances in their final order, as batches of padded feature arrays.

    Args:
      files: the split's text files (expanded, sorted), in ``config.source.format``.
      vocab_dir: a vocab stage directory.
      config: data parameters.
      split: split name (part of the seed).
      shard, num_shards: which shard.
      stats: counts, filled in as the shard is read and built.
      index_dir: the split's index (run_shard_jobs); None: built here, once per process.
      count_reads: the bytes read to build the index count in ``stats`` (False: an index an
        earlier stage built and paid for).
    """
    tokenizer = cached_tokenizer(vocab_dir)
    index = open_index(index_dir) if index_dir else local_index(
        files, vocab_dir, config.source.format, config.source.text_field,
        config.masking.word_segmenter)
    if shard == 0:  # the split's input counts, once
        stats.issues.add(index.issues())
        stats.input_bytes += index.meta["input_bytes"]
    if count_reads and (index_dir and shard == 0 or not index_dir and index.read_here):
        # The bytes read for the index: once (run_shard_jobs), or by each process that
        # built a local index.
        stats.input_bytes_read += index.meta["input_bytes_read"]
    index.read_here = False
    blocks = index.shard_blocks(shard, num_shards)
    store, plan_blocks = index.shard_store(blocks, config.random_seed, split)
    stats.documents += store.num_documents
    stats.sentences += store.num_sentences
    stats.document_tokens += store.num_tokens
    stats.unk_tokens += int(np.count_nonzero(store.ids() == tokenizer.unk_id))
    if not store.num_documents:
        return
    instance_config = config.instance_config(tokenizer, split)
    plan = plan_instances(store, instance_config, random.Random(), plan_blocks,
                          index.split_doc_starts)
    np_rng = shard_np_rng(config.random_seed, split, shard)
    plan.reorder(np_rng.permutation(len(plan)))
    py_rng = shard_rng(config.random_seed, split, shard)
    source = index.source()
    packed = config.is_packed(split)
    for start in range(0, len(plan), batch_size):
        batch = build_batch(store, plan, slice(start, start + batch_size), instance_config,
                            np_rng, py_rng, source)
        stats.instances += len(batch["input_ids"])
        stats.tokens += int(batch["input_mask"].sum())
        stats.masked += int(batch["masked_lm_weights"].sum())
        stats.random_next += int(batch["next_sentence_labels"].sum())
        if packed:  # the batch's instances packed into rows (tasks/instances/packing.py), in order
            batch = pack_batch(batch, config.max_seq_length, config.predictions_per_row)
            stats.rows += len(batch["input_ids"])
        yield batch


def build_shard(files: Sequence[str], vocab_dir: str, config: PretrainingConfig, split: str,
                shard: int, num_shards: int) -> tuple[list[dict[str, list]], ShardStats]:
    """A whole shard as a list of feature dicts of Python lists (small data, tests)."""
    stats = ShardStats()
    out = []
    for batch in iter_shard_batches(files, vocab_dir, config, split, shard, num_shards, stats):
        lists = {k: v.tolist() for k, v in batch.items()}
        out.extend(dict(zip(lists, row)) for row in zip(*lists.values()))
    return out, stats


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """One unit of parallel work: build a shard and write it as a TFRecord file.

    ``index_dir``: the split's index, built by run_shard_jobs before the shards; None: each
    worker process builds the index itself (reads the whole split: for small data only).
    ``keep_index``: run_shard_jobs leaves the index in place (a later phase reads it);
    ``prebuilt``: an earlier stage built the index (run_shard_jobs neither builds nor deletes
    it, and its reads are not counted).
    """
    files: tuple[str, ...]
    vocab_dir: str
    config: PretrainingConfig
    split: str
    shard: int
    num_shards: int
    out_path: str
    index_dir: str | None = None
    keep_index: bool = False
    prebuilt: bool = False


def write_shard(job: ShardJob) -> tuple[str, int, ShardStats]:
    """Builds a shard and writes its TFRecord file (a top-level function, for worker pools)."""
    stats = ShardStats()
    with TFRecordWriter(job.out_path) as writer:
        for batch in iter_shard_batches(job.files, job.vocab_dir, job.config, job.split,
                                        job.shard, job.num_shards, stats,
                                        index_dir=job.index_dir,
                                        count_reads=not job.prebuilt):
            writer.write_batch(*encode_instance_batch(batch))
    return job.split, job.shard, stats


def plan_shard_jobs(files_by_split: Mapping[str, Sequence[str]], vocab_dir: str,
                    config: PretrainingConfig, num_shards: int, out_dir: str,
                    spill_dir: str | None = None, index_dir: str | None = None
                    ) -> list[ShardJob]:
    """The shard jobs of a preprocess stage (run them with run_shard_jobs): every split with
    files, ``num_shards`` shards each, written to ``out_dir`` (records.shard_path). The
    splits' indexes (about half a byte per byte of text: tokens, sentence offsets) live in
    ``<spill_dir>/<split>`` while the jobs run; default spill_dir: ``out_dir/.preprocess-
    spill``. Both are deleted by run_shard_jobs; with ``index_dir`` the indexes are built in
    ``<index_dir>/<split>`` instead, and kept (``plan_prebuilt_shard_jobs`` reads them)."""
    spill_dir = spill_dir or os.path.join(out_dir, SPILL_DIR)
    jobs = []
    for split, files in files_by_split.items():
        if not files:
            continue
        split_index = os.path.join(index_dir or spill_dir, split)
        for shard in range(num_shards):
            jobs.append(ShardJob(tuple(files), vocab_dir, config, split, shard, num_shards,
                                 shard_path(out_dir, split, shard, num_shards), split_index,
                                 keep_index=index_dir is not None))
    return jobs


def prebuilt_splits(index_root: str) -> list[str]:
    """The splits whose index an earlier stage kept in ``<index_root>/<split>``."""
    if not os.path.isdir(index_root):
        return []
    return sorted(name for name in os.listdir(index_root)
                  if os.path.isfile(os.path.join(index_root, name, "meta.json")))


def plan_prebuilt_shard_jobs(index_root: str, vocab_dir: str, config: PretrainingConfig,
                             num_shards: int, out_dir: str) -> list[ShardJob]:
    """The shard jobs of a later pretraining phase: every split indexed in ``index_root``
    (an earlier stage's kept indexes), ``num_shards`` shards each, written to ``out_dir``.
    No corpus file is read: the documents are the index's tokens."""
    return [ShardJob((), vocab_dir, config, split, shard, num_shards,
                     shard_path(out_dir, split, shard, num_shards),
                     os.path.join(index_root, split), prebuilt=True)
            for split in prebuilt_splits(index_root) for shard in range(num_shards)]


def plan_range_jobs(jobs: Sequence[ShardJob]) -> tuple[dict, list[RangeJob]]:
    """Phase 1's work for ``jobs``: {index dir: a job of that split} for the splits to index
    (not those of a prebuilt index), and their RangeJobs (byte ranges, one per shard). Each
    index directory is made anew."""
    splits: dict[str, ShardJob] = {}
    for job in jobs:
        if job.index_dir and not job.prebuilt:
            splits.setdefault(job.index_dir, job)
    range_jobs: list[RangeJob] = []
    for index_dir, job in splits.items():
        shutil.rmtree(index_dir, ignore_errors=True)
        os.makedirs(index_dir)
        sizes = [input_files.size(p) for p in job.files]
        for k, segments in enumerate(plan_ranges(sizes, job.num_shards)):
            range_jobs.append(RangeJob(job.files, job.vocab_dir, index_dir, k, segments,
                                       job.config.source.format, job.config.source.text_field,
                                       job.config.masking.word_segmenter))
    return splits, range_jobs


def run_shard_jobs(jobs: Sequence[ShardJob], imap: Callable = map,
                   progress: Callable[[str], None] | None = None
                   ) -> Iterator[tuple[str, int, ShardStats]]:
    """Runs shard jobs in two phases and yields ``write_shard``'s results as they come.

    Phase 1 cuts each split's files into ``num_shards`` byte ranges and tokenises each once
    (``tokenize_range``, in parallel); the parent then joins them into the split's index
    (``build_split_index``); phase 2 builds the shards (``write_shard``, in parallel). The
    index directories are deleted at the end, but those of jobs that keep them; the jobs of
    a prebuilt index skip phase 1.

    Args:
      jobs: from plan_shard_jobs (jobs without an index_dir just run write_shard).
      imap: ``map``, or a worker pool's ``imap_unordered``.
      progress: reports a line per range tokenised.
    """
    splits, range_jobs = plan_range_jobs(jobs)
    try:
        results: dict[str, list[RangeResult]] = {d: [] for d in splits}
        done = 0
        for index_dir, result in imap(_tokenize_range_keyed, range_jobs):
            results[index_dir].append(result)
            done += 1
            if progress is not None:
                progress(f"[{done}/{len(range_jobs)}] read {os.path.basename(index_dir)} range "
                         f"{result.index}: {result.bytes_read:,} bytes, "
                         f"{result.sentences:,} sentences, {result.tokens:,} tokens")
        for index_dir, job in splits.items():
            build_split_index([r for r in range_jobs if r.index_dir == index_dir],
                              results[index_dir], cached_tokenizer(job.vocab_dir).vocab_size)
        yield from imap(write_shard, jobs)
    finally:
        remove_split_indexes(splits)


def remove_split_indexes(splits: Mapping[str, ShardJob]) -> None:
    """Deletes the splits' index directories (and their spill directory once empty), but
    those a later pretraining phase keeps."""
    for index_dir, job in splits.items():
        if job.keep_index:
            continue
        shutil.rmtree(index_dir, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(index_dir))
        except OSError:
            pass


def _tokenize_range_keyed(job: RangeJob) -> tuple[str, RangeResult]:
    return job.index_dir, tokenize_range(job)
