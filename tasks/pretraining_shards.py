"""One shard of BERT pretraining data: read, tokenize, build instances, mask, serialise.

Document i of a split (in sorted file order) belongs to shard ``i % num_shards``. A shard is
built from its own documents only (random next segments come from the same shard, as when
the reference script runs once per input file), with its own generator seeded from
``(random_seed, split, shard)``, so the output depends on the seed and the shard count only,
never on the number of worker processes. Memory is bounded by one shard: documents are
streamed from the files and instances are serialised as they are made.

Both the preprocess stage (parallel, to TFRecords) and the seqio task's uncached source
(sequential, to feature dicts) build shards here, so both give the same examples.

Usage:
    config = PretrainingConfig.from_params(stage.params)
    records, stats = build_shard(files, vocab_dir, config, "train", shard=0, num_shards=4)

Light: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable, Mapping, Sequence

from runexp.tasks.masking import MaskingConfig
from runexp.tasks.pretraining_instances import (Instance, InstanceConfig, create_instances,
                                                to_features)
from runexp.tasks.records import encode_instance_features
from runexp.tasks.text_files import iter_documents
from runexp.tasks.tokenizer import Tokenizer, load_tokenizer


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
    random_seed: int = 12345

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "PretrainingConfig":
        """Picks this config's fields out of a stage's params (others are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in params.items() if k in names})
        if params.get("pair_objective", "nsp") != "nsp":
            raise ValueError(f"pair_objective {params['pair_objective']!r} is not supported; "
                             "use 'nsp'")
        if config.max_seq_length < 5:
            raise ValueError(f"max_seq_length must be at least 5, got {config.max_seq_length}")
        return config

    def instance_config(self, tokenizer: Tokenizer) -> InstanceConfig:
        masking = MaskingConfig(
            masked_lm_prob=self.masked_lm_prob,
            max_predictions_per_seq=self.max_predictions_per_seq,
            vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id,
            cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
            mask_token_prob=self.mask_token_prob, random_token_prob=self.random_token_prob,
            whole_word_masking=self.whole_word_masking,
            word_start=tokenizer.word_start_table() if self.whole_word_masking else None)
        return InstanceConfig(self.max_seq_length, self.short_seq_prob, self.random_next_prob,
                              self.dupe_factor, masking)


_TOKENIZERS: dict[str, Tokenizer] = {}


def cached_tokenizer(vocab_dir: str) -> Tokenizer:
    """One tokenizer per vocab dir and process (its word cache is worth keeping)."""
    if vocab_dir not in _TOKENIZERS:
        _TOKENIZERS[vocab_dir] = load_tokenizer(vocab_dir)
    return _TOKENIZERS[vocab_dir]


def shard_rng(seed: int, split: str, shard: int) -> random.Random:
    # A str seed is hashed with SHA-512 by random.Random: stable across runs and platforms.
    return random.Random(f"{seed}:{split}:{shard}")


@dataclasses.dataclass
class ShardStats:
    documents: int = 0
    sentences: int = 0
    document_tokens: int = 0
    unk_tokens: int = 0
    instances: int = 0
    tokens: int = 0   # non-padding input tokens
    masked: int = 0   # predicted positions (weight 1)
    random_next: int = 0

    def add(self, other: "ShardStats") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def read_shard_documents(files: Sequence[str], tokenizer: Tokenizer, shard: int,
                         num_shards: int, stats: ShardStats) -> list[list[list[int]]]:
    """The shard's documents as lists of non-empty sentence id lists."""
    documents = []
    for i, doc in enumerate(iter_documents(files)):
        if i % num_shards != shard:
            continue
        sentences = [ids for ids in map(tokenizer.encode, doc) if ids]
        if not sentences:
            continue
        documents.append(sentences)
        stats.documents += 1
        stats.sentences += len(sentences)
        for ids in sentences:
            stats.document_tokens += len(ids)
            stats.unk_tokens += ids.count(tokenizer.unk_id)
    return documents


def build_shard(files: Sequence[str], vocab_dir: str, config: PretrainingConfig, split: str,
                shard: int, num_shards: int,
                transform: Callable[[dict], Any] = encode_instance_features
                ) -> tuple[list, ShardStats]:
    """Builds one shard.

    Args:
      files: the split's text files (expanded, sorted).
      vocab_dir: a vocab stage directory.
      config: data parameters.
      split: split name (part of the seed).
      shard, num_shards: which shard.
      transform: applied to each instance's padded feature dict; the default gives
        serialised tf.train.Example bytes.

    Returns:
      (transformed instances in final order, counts).
    """
    tokenizer = cached_tokenizer(vocab_dir)
    stats = ShardStats()
    documents = read_shard_documents(files, tokenizer, shard, num_shards, stats)
    if not documents:
        return [], stats
    instance_config = config.instance_config(tokenizer)

    def make(instance: Instance):
        stats.instances += 1
        stats.tokens += len(instance.tokens)
        stats.masked += len(instance.masked_lm_positions)
        stats.random_next += instance.is_random_next
        return transform(to_features(instance, config.max_seq_length,
                                     config.max_predictions_per_seq))

    out = create_instances(documents, instance_config, shard_rng(config.random_seed, split, shard),
                           make)
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
    from runexp.tasks.records import TFRecordWriter
    records, stats = build_shard(job.files, job.vocab_dir, job.config, job.split, job.shard,
                                 job.num_shards)
    with TFRecordWriter(job.out_path) as writer:
        for record in records:
            writer.write(record)
    return job.split, job.shard, stats
