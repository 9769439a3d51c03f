"""One shard of BERT pretraining data: read, tokenize, plan instances, mask, serialise.

Document i of a split (in sorted file order) belongs to shard ``i % num_shards``. A shard is
built from its own documents only (random next segments come from the same shard, as when
the reference script runs once per input file), with its own generators seeded from
``(random_seed, split, shard)``, so the output depends on the seed and the shard count only,
never on the number of worker processes.

Memory is bounded by the shard's token count, about 4 bytes a token (pretraining_instances.
DocumentStore), plus a small plan per instance; instances are built, masked, serialised and
written one batch at a time, already in their final shuffled order, so nothing grows with
``dupe_factor`` (the reference holds every instance of every input as Python objects).

Both the preprocess stage (parallel, to TFRecords) and the seqio task's uncached source
(sequential, to feature dicts) build shards here, so both give the same examples.

Usage:
    config = PretrainingConfig.from_params(stage.params)
    stats = write_shard(ShardJob(files, vocab_dir, config, "train", 0, 4, out_path))[2]
    for batch in iter_shard_batches(files, vocab_dir, config, "train", 0, 4, ShardStats()):
        batch["input_ids"]  # [<= BATCH_SIZE, max_seq_length]

Light: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from runexp.tasks.masking import MaskingConfig
from runexp.tasks.pretraining_instances import (PAIR_OBJECTIVES, DocumentStore, InstanceConfig,
                                                build_batch, plan_instances)
from runexp.tasks.text_files import InputIssues, iter_located_documents
from runexp.tasks.tokenizer import Tokenizer, load_tokenizer

BATCH_SIZE = 1024
_LINES_PER_CALL = 4096


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    """The preprocess stage's data parameters (docs/STAGES.md, "preprocess")."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    dupe_factor: int = 5
    short_seq_prob: float = 0.1
    random_next_prob: float = 0.5
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    whole_word_masking: bool = False
    ngram_max: int = 1
    pair_objective: str = "nsp"
    random_seed: int = 12345
    dynamic_masking: bool = False  # the train split unmasked, masked at training time

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "PretrainingConfig":
        """Picks this config's fields out of a stage's params (others are ignored; missing
        ones, e.g. in plans made before an option existed, take the defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in params.items() if k in names and v is not None})
        if config.pair_objective not in PAIR_OBJECTIVES:
            raise ValueError(f"pair_objective must be one of {PAIR_OBJECTIVES}, "
                             f"got {config.pair_objective!r}")
        if config.max_seq_length < 5:
            raise ValueError(f"max_seq_length must be at least 5, got {config.max_seq_length}")
        if int(config.ngram_max) < 1:
            raise ValueError(f"ngram_max must be at least 1, got {config.ngram_max}")
        if config.dynamic_masking and int(config.ngram_max) > 1:
            raise ValueError("dynamic_masking does not do n-gram masking: use ngram_max = 1")
        return config

    def is_dynamic(self, split: str) -> bool:
        """Only the train split is masked at training time; validation keeps static masks,
        so evaluations stay comparable across runs."""
        return bool(self.dynamic_masking) and split == "train"

    def instance_config(self, tokenizer: Tokenizer, split: str = "train") -> InstanceConfig:
        dynamic = self.is_dynamic(split)
        word_level = self.whole_word_masking or self.ngram_max > 1 or dynamic
        masking = MaskingConfig(
            masked_lm_prob=self.masked_lm_prob,
            max_predictions_per_seq=self.max_predictions_per_seq,
            vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id,
            cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
            mask_token_prob=self.mask_token_prob, random_token_prob=self.random_token_prob,
            whole_word_masking=self.whole_word_masking, ngram_max=int(self.ngram_max),
            word_start=tokenizer.word_start_table() if word_level else None)
        # With masks drawn at training time, more passes would only duplicate instances.
        dupe_factor = 1 if dynamic else self.dupe_factor
        return InstanceConfig(self.max_seq_length, self.short_seq_prob, self.random_next_prob,
                              dupe_factor, masking, self.pair_objective, dynamic)

    def masking_spec(self, tokenizer: Tokenizer) -> dict:
        """What the training input pipeline needs to mask (records.write_masking)."""
        return {"masked_lm_prob": self.masked_lm_prob,
                "max_predictions_per_seq": self.max_predictions_per_seq,
                "mask_token_prob": self.mask_token_prob,
                "random_token_prob": self.random_token_prob,
                "whole_word_masking": bool(self.whole_word_masking),
                "vocab_size": tokenizer.vocab_size, "mask_id": tokenizer.mask_id,
                "cls_id": tokenizer.cls_id, "sep_id": tokenizer.sep_id,
                "random_seed": self.random_seed, "splits": ["train"]}


_TOKENIZERS: dict[tuple, Tokenizer] = {}


def cached_tokenizer(vocab_dir: str) -> Tokenizer:
    """One tokenizer per vocab dir and process (its word cache is worth keeping); a vocab
    rewritten in the same directory (its files' times and sizes changed) is loaded again."""
    stamp = []
    for name in ("report.json", "vocab.txt", "spm.model"):
        try:
            st = os.stat(os.path.join(vocab_dir, name))
            stamp.append((st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append(None)
    key = (vocab_dir, *stamp)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(vocab_dir)
    return _TOKENIZERS[key]


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
    issues: InputIssues = dataclasses.field(default_factory=InputIssues)

    COUNTS = ("documents", "sentences", "document_tokens", "unk_tokens", "instances", "tokens",
              "masked", "random_next")

    def add(self, other: "ShardStats") -> None:
        for name in self.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.issues.add(other.issues)

    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.COUNTS}


def read_shard_documents(files: Sequence[str], tokenizer: Tokenizer, shard: int,
                         num_shards: int, stats: ShardStats) -> DocumentStore:
    """The shard's documents, tokenised into a DocumentStore; bad input counted in stats."""
    store = DocumentStore()
    unk = tokenizer.unk_id
    pending: list[tuple[str, int, list[str]]] = []
    pending_lines = 0

    def flush():
        lines = [line for _, _, doc in pending for line in doc]
        ids, counts = tokenizer.encode_lines(lines)
        doc_lines = np.fromiter((len(doc) for _, _, doc in pending), np.int64, len(pending))
        sentences = store.add_encoded(ids, counts, doc_lines)
        for (path, line, _), n in zip(pending, sentences.tolist()):
            if not n:
                stats.issues.note("empty_documents", path, line)
        stats.documents += int(np.count_nonzero(sentences))
        stats.sentences += int(sentences.sum())
        stats.document_tokens += len(ids)
        stats.unk_tokens += int(np.count_nonzero(ids == unk))
        pending.clear()

    def wanted(i: int) -> bool:
        return i % num_shards == shard

    # Documents are tokenised a few thousand lines at a time (tokenizer.encode_lines).
    for located in iter_located_documents(files, stats.issues, wanted):
        pending.append(located)
        pending_lines += len(located[2])
        if pending_lines >= _LINES_PER_CALL:
            flush()
            pending_lines = 0
    if pending:
        flush()
    return store


def iter_shard_batches(files: Sequence[str], vocab_dir: str, config: PretrainingConfig,
                       split: str, shard: int, num_shards: int, stats: ShardStats,
                       batch_size: int = BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
    """The shard's instances in their final order, as batches of padded feature arrays.

    Args:
      files: the split's text files (expanded, sorted).
      vocab_dir: a vocab stage directory.
      config: data parameters.
      split: split name (part of the seed).
      shard, num_shards: which shard.
      stats: counts, filled in as the shard is read and built.
    """
    tokenizer = cached_tokenizer(vocab_dir)
    store = read_shard_documents(files, tokenizer, shard, num_shards, stats)
    if not store.num_documents:
        return
    instance_config = config.instance_config(tokenizer, split)
    rng = shard_rng(config.random_seed, split, shard)
    np_rng = shard_np_rng(config.random_seed, split, shard)
    plan = plan_instances(store, instance_config, rng)
    for start in range(0, len(plan), batch_size):
        batch = build_batch(store, plan, slice(start, start + batch_size), instance_config,
                            np_rng, rng)
        stats.instances += len(batch["input_ids"])
        stats.tokens += int(batch["input_mask"].sum())
        stats.masked += int(batch["masked_lm_weights"].sum())
        stats.random_next += int(batch["next_sentence_labels"].sum())
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
    """One unit of parallel work: build a shard and write it as a TFRecord file."""
    files: tuple[str, ...]
    vocab_dir: str
    config: PretrainingConfig
    split: str
    shard: int
    num_shards: int
    out_path: str


def write_shard(job: ShardJob) -> tuple[str, int, ShardStats]:
    """Builds a shard and writes its TFRecord file (a top-level function, for worker pools)."""
    from runexp.tasks.records import TFRecordWriter, encode_instance_batch
    stats = ShardStats()
    with TFRecordWriter(job.out_path) as writer:
        for batch in iter_shard_batches(job.files, job.vocab_dir, job.config, job.split,
                                        job.shard, job.num_shards, stats):
            writer.write_batch(*encode_instance_batch(batch))
    return job.split, job.shard, stats
