"""Random access to the records of a task cache's split: where each record starts.

A split's TFRecord files (tasks/cache/records.py layout) are read in file order as one sequence of
records, numbered from 0; ``RecordIndex.read(indices)`` returns the serialized records at
those numbers without reading any other. The index is the byte offset of every record
(8 bytes a record, plus one end offset a file), built once by reading the 12-byte length
headers only, and saved beside the cache as ``<split>.record_index.npy`` with
``<split>.record_index.json`` (the files' names, sizes and record counts: an index that no
longer matches its files is rebuilt). Where the cache is not writable the index is kept in
memory. seqio's cached-file pattern (``<split>.tfrecord-*-of-*``) never matches these names.

Reads use ``os.pread`` (no shared file position: safe from parallel tf.data calls); CRCs are
not checked (the preprocess stage wrote the files). Light module: numpy only.

Usage:
    index = RecordIndex.open(cache_dir, "train", files)   # files: seqio's shard list, in order
    serialized = index.read(np.array([5, 0, 17]))          # object array of bytes
"""

from __future__ import annotations

import json
import os
import struct
from typing import Sequence

import numpy as np

_HEADER = 12  # uint64 length + masked CRC-32C of the length
_FOOTER = 4  # masked CRC-32C of the data


def index_paths(cache_dir: str, split: str) -> tuple[str, str]:
    """(offsets .npy, description .json) of a split's index."""
    base = os.path.join(cache_dir, f"{split}.record_index")
    return base + ".npy", base + ".json"


def _record_starts(path: str) -> list[int]:
    """Byte offsets of the records of one TFRecord file, then the file's size."""
    starts = []
    with open(path, "rb") as f:
        offset = 0
        while True:
            header = f.read(_HEADER)
            if not header:
                break
            if len(header) < _HEADER:
                raise ValueError(f"{path}: truncated record header at byte {offset}")
            (length,) = struct.unpack("<Q", header[:8])
            starts.append(offset)
            offset += _HEADER + length + _FOOTER
            f.seek(offset)
        if offset != os.fstat(f.fileno()).st_size:
            raise ValueError(f"{path}: truncated record at byte {starts[-1]}")
    return starts + [offset]


def _describe(files: Sequence[str]) -> list[list]:
    return [[os.path.basename(p), os.path.getsize(p)] for p in files]


class RecordIndex:
    """The records of a split's files, by number (module docstring)."""

    def __init__(self, files: Sequence[str], counts: Sequence[int], offsets: np.ndarray):
        self.files = list(files)
        self.counts = np.asarray(counts, np.int64)
        # File f's entries: offsets[first[f] + f : first[f] + f + counts[f] + 1] (its end last).
        self._first = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self._offsets = offsets
        self._fds: list[int] | None = None

    @property
    def size(self) -> int:
        """Records in the split."""
        return int(self.counts.sum())

    @classmethod
    def open(cls, cache_dir: str, split: str, files: Sequence[str]) -> "RecordIndex":
        """The index of ``files`` (a split's, in order): loaded (memory-mapped) when saved
        and current, else built and saved (kept in memory where it cannot be)."""
        npy, desc = index_paths(cache_dir, split)
        described = _describe(files)
        if os.path.exists(desc) and os.path.exists(npy):
            with open(desc, encoding="utf-8") as f:
                saved = json.load(f)
            if [[n, s] for n, s, _ in saved["files"]] == described:
                return cls(files, [c for _, _, c in saved["files"]],
                           np.load(npy, mmap_mode="r"))
        per_file = [_record_starts(p) for p in files]
        offsets = np.array([o for starts in per_file for o in starts], np.int64)
        counts = [len(starts) - 1 for starts in per_file]
        try:
            tmp = npy + f".tmp{os.getpid()}.npy"
            np.save(tmp, offsets)
            os.replace(tmp, npy)
            tmp = desc + f".tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"files": [d + [c] for d, c in zip(described, counts)]}, f)
            os.replace(tmp, desc)
        except OSError:
            pass  # a read-only cache: the index lives in memory for this process
        return cls(files, counts, offsets)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file number, data offset, data length) of records by number."""
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.size):
            raise IndexError(f"record numbers outside [0, {self.size})")
        file = np.searchsorted(self._first, indices, side="right") - 1
        entry = indices + file  # each earlier file adds its end offset
        start = np.asarray(self._offsets[entry])
        end = np.asarray(self._offsets[entry + 1])
        return file, start + _HEADER, end - start - _HEADER - _FOOTER

    def read(self, indices: np.ndarray) -> np.ndarray:
        """The serialized records at ``indices`` (an object array of bytes, same shape)."""
        if self._fds is None:
            self._fds = [os.open(p, os.O_RDONLY) for p in self.files]
        file, offset, length = self.locate(np.ravel(indices))
        out = np.empty(len(file), dtype=object)
        for i, (f, o, n) in enumerate(zip(file.tolist(), offset.tolist(), length.tolist())):
            out[i] = os.pread(self._fds[f], n, o)
        return out.reshape(np.shape(indices))

    def __del__(self):
        for fd in self._fds or ():
            try:
                os.close(fd)
            except OSError:
                pass
