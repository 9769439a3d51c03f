"""A split's index (tasks/instances/split_index.py), read back for phase 2: ``SplitIndex`` serves a
shard its documents and any document of the split (random next segments) by ``pread``;
``open_index`` caches it per process (workers build several shards); ``local_index`` builds
one in-process for a few files (uncached reads, tests).

Light: no TensorFlow.
"""

from __future__ import annotations

import array
import collections
import json
import os
import shutil
import tempfile
from typing import Sequence

import numpy as np

from runexp.compiler.specs.preprocess import MaskingSpec
from runexp.compiler.specs.source import SourceSpec
from runexp.tasks.instances.document_store import DocumentStore, TokenSource
from runexp.tasks.instances.split_index import (RangeJob, assign_blocks, block_seed, build_split_index,
                                      tokenize_range)
from runexp.tasks.sources.text_files import InputIssues
from runexp.tasks.vocabulary.tokenizer import cached_tokenizer


def _pread_array(fd: int, dtype: np.dtype, start: int, count: int) -> np.ndarray:
    data = os.pread(fd, count * dtype.itemsize, start * dtype.itemsize)
    return np.frombuffer(data, dtype)


class SpillSource(TokenSource):
    """A split's tokens and sentence offsets read from its spill files, one ``pread`` per
    window. (Not memory maps: page-cache folios of a megabyte or more would be mapped for
    each random window, and a worker's resident memory would grow towards the spill's size.)
    """

    def __init__(self, tokens_fd: int, offsets_fd: int, dtype: np.dtype,
                 continuation_bit: int = 0):
        self._fds = (tokens_fd, offsets_fd)
        self._dtype = dtype
        self.continuation_bit = continuation_bit

    @staticmethod
    def _windows(fd: int, dtype: np.dtype, start: np.ndarray, width: int) -> np.ndarray:
        size = width * dtype.itemsize
        pread = os.pread
        chunks = [pread(fd, size, s) for s in (start * dtype.itemsize).tolist()]
        short = [i for i, c in enumerate(chunks) if len(c) != size]  # at the end of the file
        for i in short:
            chunks[i] = chunks[i] + bytes(size - len(chunks[i]))
        return np.frombuffer(b"".join(chunks), dtype).reshape(len(chunks), width)

    def offset_windows(self, first: np.ndarray, width: int) -> np.ndarray:
        return self._windows(self._fds[1], np.dtype(np.int64), first, width)

    def token_windows(self, start: np.ndarray, width: int) -> np.ndarray:
        return self._windows(self._fds[0], self._dtype, start, width)


class SplitIndex:
    """A split's index (build_split_index), opened for building shards: the small arrays in
    memory; tokens and sentence offsets read from the spill files as needed."""

    def __init__(self, index_dir: str):
        with open(os.path.join(index_dir, "meta.json")) as f:
            self.meta = json.load(f)
        self.doc_starts = np.load(os.path.join(index_dir, "documents.npy"))
        self.blocks = np.load(os.path.join(index_dir, "blocks.npy"))
        self.block_tokens = np.load(os.path.join(index_dir, "block_tokens.npy"))
        self.dtype = np.dtype(self.meta["dtype"])
        # Set in tokens that continue a segmented word (a word segmenter's index), else 0.
        self.continuation_bit = int(self.meta.get("continuation_bit", 0))
        # Kept open: the local index deletes its directory at once.
        self._files = [open(os.path.join(index_dir, name), "rb")
                       for name in ("tokens.bin", "offsets.bin")]
        self._split_doc_starts = None
        self.read_here = False

    def source(self) -> SpillSource:
        return SpillSource(self._files[0].fileno(), self._files[1].fileno(), self.dtype,
                           self.continuation_bit)

    @property
    def split_doc_starts(self) -> array.array:
        if self._split_doc_starts is None:
            self._split_doc_starts = array.array("q", self.doc_starts.tobytes())
        return self._split_doc_starts

    def issues(self) -> InputIssues:
        issues = InputIssues()
        issues.counts = dict(self.meta["issues"]["counts"])
        issues.samples = {k: [tuple(s) for s in v]
                          for k, v in self.meta["issues"]["samples"].items()}
        return issues

    def shard_blocks(self, shard: int, num_shards: int) -> np.ndarray:
        """The shard's blocks, in split order."""
        return np.flatnonzero(assign_blocks(self.block_tokens, num_shards) == shard)

    def shard_store(self, blocks: np.ndarray, seed: int, split: str
                    ) -> tuple[DocumentStore, list[tuple]]:
        """The blocks' documents, read into memory; and their plan blocks (plan_instances)."""
        tokens_fd, offsets_fd = self._files[0].fileno(), self._files[1].fileno()
        parts, sentence_starts, doc_starts, plan_blocks = [], [0], [0], []
        tokens_so_far = 0
        for b in blocks.tolist():
            d0, d1 = int(self.blocks[b]), int(self.blocks[b + 1])
            s0, s1 = int(self.doc_starts[d0]), int(self.doc_starts[d1])
            offsets = _pread_array(offsets_fd, np.dtype(np.int64), s0, s1 - s0 + 1)
            t0, t1 = int(offsets[0]), int(offsets[-1])
            parts.append(_pread_array(tokens_fd, self.dtype, t0, t1 - t0))
            first_sentence, first_doc = len(sentence_starts) - 1, len(doc_starts) - 1
            sentence_starts.extend((offsets[1:] - t0 + tokens_so_far).tolist())
            doc_starts.extend((self.doc_starts[d0 + 1:d1 + 1] - s0 + first_sentence).tolist())
            plan_blocks.append((block_seed(seed, split, b), first_doc, first_doc + d1 - d0, d0))
            tokens_so_far += t1 - t0
        tokens = np.concatenate(parts) if parts else np.zeros(0, self.dtype)
        return DocumentStore.from_arrays(tokens, sentence_starts, doc_starts,
                                         self.continuation_bit), plan_blocks


_INDEXES: "collections.OrderedDict[tuple, SplitIndex]" = collections.OrderedDict()
_MAX_CACHED_INDEXES = 4


def open_index(index_dir: str) -> SplitIndex:
    """The split index in ``index_dir`` (cached per process: workers build several shards)."""
    with open(os.path.join(index_dir, "meta.json")) as f:
        build = json.load(f)["build"]
    return _cached((index_dir, build), lambda: SplitIndex(index_dir))


def _cached(key, make) -> SplitIndex:
    if key in _INDEXES:
        _INDEXES.move_to_end(key)
        return _INDEXES[key]
    index = _INDEXES[key] = make()
    index.read_here = True  # built by this call: its reads are this job's
    while len(_INDEXES) > _MAX_CACHED_INDEXES:
        _INDEXES.popitem(last=False)
    return index


def local_index(files: Sequence[str], vocab_dir: str, text_format: str = SourceSpec.format,
                text_field: str = SourceSpec.text_field,
                word_segmenter: str = MaskingSpec.word_segmenter) -> SplitIndex:
    """The index of ``files`` (read in ``text_format``; words marked by ``word_segmenter``),
    built in this process (one range) in a temporary directory that is deleted at once (its
    open files keep the data); cached per process."""
    stamps = []
    for path in files:
        st = os.stat(path)
        stamps.append((path, st.st_size, st.st_mtime_ns))
    tokenizer = cached_tokenizer(vocab_dir)
    key = ("local", tuple(stamps), vocab_dir, id(tokenizer), text_format, text_field,
           word_segmenter)

    def make() -> SplitIndex:
        tmp = tempfile.mkdtemp(prefix="runexp-index-")
        try:
            segments = tuple((f, 0, size) for f, (_, size, _) in enumerate(stamps))
            job = RangeJob(tuple(files), vocab_dir, tmp, 0, segments, text_format, text_field,
                           word_segmenter)
            build_split_index([job], [tokenize_range(job)], tokenizer.vocab_size)
            return SplitIndex(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return _cached(key, make)
