"""Corpus files as the text readers open them: a local path, or one version of a Cloud Storage
object, read in place by byte ranges.

A version is named in gsutil's notation, ``gs://bucket/key#generation``: the generation the
plan listed (compiler/gcs_inputs.py fingerprints gs:// inputs by it), so a worker reads the
bytes the plan saw or fails with ``InputChangedError``, never a newer object under the same
name.

Why in place: a preprocess stage on Apache Beam (tasks/instances/beam_preprocess.py) has its workers
read the corpus ranges they tokenise straight from Cloud Storage, on Dataflow or on this
machine, instead of the launcher downloading a multi-GB corpus first. The readers
(tasks/sources/text_files.py ``iter_segment_lines``, tasks/sources/text_formats.py) read a range in 1 MiB
blocks and then, past the range's end, in small reads to finish its last line; a remote
reader turns each into one ranged GET, reading ahead in larger requests inside the range
(``end_hint``) so that latency is paid once per ``READ_AHEAD`` bytes, and never reads more
than asked past it.

Ranged reads carry no checksum (Cloud Storage has whole-object checksums only); the pinned
generation is what makes them the listed bytes. No TensorFlow; google-cloud-storage only
for gs://, through runexp's storage layer (retries, emulator, errors).
"""

from __future__ import annotations

import io
import os
from typing import Optional
from runexp.runtime import storage
from runexp.runtime.storage.transfer import listed_version, version_gone

GS = "gs://"
READ_AHEAD = 8 << 20  # bytes a remote reader asks for at once inside a range


class FetchStats:
    """Ranged GETs this process made, and the bytes they brought (what reading in place
    costs: about one byte fetched per byte of corpus, a request per READ_AHEAD bytes)."""
    requests = 0
    bytes = 0


def pinned(uri: str, generation: Optional[int]) -> str:
    """``gs://bucket/key#generation`` (the URI itself without a generation)."""
    return uri if generation is None else f"{uri}#{int(generation)}"


def split_pinned(path: str) -> tuple[str, Optional[int]]:
    """(uri, generation) of a pinned gs:// path; (path, None) otherwise."""
    if path.startswith(GS):
        uri, sep, gen = path.rpartition("#")
        if sep and gen.isdigit():
            return uri, int(gen)
    return path, None


def is_remote(path: str) -> bool:
    return str(path).startswith(GS)


def size(path: str) -> int:
    """The file's size in bytes (a remote version's: one metadata request per process)."""
    if not is_remote(path):
        return os.path.getsize(path)
    return int(_stat(path).size)  # not cached: each call also checks the version is there


def open_binary(path: str, end_hint: Optional[int] = None):
    """A seekable binary reader with a ``size`` attribute; ``read(n)`` returns at most n
    bytes (b"" at the end). ``end_hint``: the byte the caller's range ends at (a remote
    reader reads ahead up to it, and only what is asked past it)."""
    if not is_remote(path):
        return _LocalFile(path)
    return _ObjectReader(path, end_hint)


class _LocalFile(io.FileIO):
    def __init__(self, path: str):
        super().__init__(path, "rb")
        self.size = os.fstat(self.fileno()).st_size


def _stat(path: str):
    """The blob of a pinned version, its metadata loaded (InputChangedError when gone)."""

    return listed_version(*split_pinned(path))


class _ObjectReader(io.RawIOBase):
    """One version of a gs:// object, read by ranged GETs (module docstring)."""

    def __init__(self, path: str, end_hint: Optional[int] = None):
        super().__init__()
        self.path = path
        self.uri, self.generation = split_pinned(path)
        self._blob = _stat(path)
        self.size = int(self._blob.size)
        self.end_hint = self.size if end_hint is None else min(end_hint, self.size)
        self.pos = 0
        self._buf = b""
        self._buf_at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        at = self.pos - self._buf_at
        if not (0 <= at < len(self._buf)):
            # Inside the range: READ_AHEAD at once, no further than its end; past it, what
            # is asked (the readers ask little there: the rest of a line).
            want = max(n, min(READ_AHEAD, self.end_hint - self.pos))
            self._buf, self._buf_at, at = self._fetch(self.pos, want), self.pos, 0
        out = self._buf[at:at + n]
        self.pos += len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def _fetch(self, start: int, n: int) -> bytes:
        end = min(start + n, self.size) - 1  # inclusive, as the API takes it
        try:
            data = storage.gcs_call("read", self.uri, lambda: self._blob.download_as_bytes(
                start=start, end=end, checksum=None, timeout=storage.retry_policy().timeout,
                retry=None))
        except FileNotFoundError as exc:
            raise version_gone(self.uri, self.generation) from exc
        FetchStats.requests += 1
        FetchStats.bytes += len(data)
        return data
