"""The one reader of a training stage's logs (``train_log.jsonl``, ``eval_log.jsonl``), local
or gs://, in bounded memory however long the run. Standard library and the storage layer only
(never TensorFlow): the training loop, ``runexp status``, the curves and
``runexp report`` all read through it.

A log is one JSON object per line, in step order (runtime/train_log.py appends them; a resume
cuts off what the run logged past its checkpoint, ``trim``). A line cut short by a kill, or
anything else that is not a JSON object, is skipped.

What reading costs, at 10^6 records (a run logging every step for a million steps):
- ``backward(src)``: reads blocks from the end, only as far as the caller iterates: the last
  metrics record, the last stop (``runexp status``, a resume's summary) cost one block;
- ``trim(path, step)``: reads back only over the records past ``step`` and truncates the file
  there (nothing is rewritten);
- ``forward(src)``: every record, one block at a time;
- ``sample(src)``: for the curves, every event and at most ``CURVE_POINTS`` metrics records
  evenly strided through the log; only those lines are parsed, so a log of 10^6 records
  draws in about the time its bytes take to read.

Usage:
    src = log_reader.source(os.path.join(work_dir, log_reader.TRAIN_LOG))   # None: no file
    last = next((r for r in log_reader.backward(src) if "event" not in r), None)
    metrics, events = log_reader.sample(src, limit=2000)
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterator, Optional

from runexp.runtime import storage  # import-light: the GCS client comes with a gs:// log

TRAIN_LOG = "train_log.jsonl"
EVAL_LOG = "eval_log.jsonl"

# Bytes read at a time (a local read or one ranged gs:// request): going forward through a
# whole log, and going back from its end (a few hundred records).
BLOCK = 1 << 20
TAIL_BLOCK = 1 << 16
# The curves keep at most this many metrics records of a log (sample).
CURVE_POINTS = 2000


class LocalSource:
    """A local log file, read by byte range."""

    def __init__(self, path: str):
        self.path = path
        self.bytes_read = 0

    def size(self) -> int:
        return os.path.getsize(self.path)

    def read(self, start: int, end: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(start)
            data = f.read(max(0, end - start))
        self.bytes_read += len(data)
        return data


class GcsSource:
    """A gs:// log object, read by ranged requests (the storage layer's retries)."""

    def __init__(self, uri: str, size: int):
        self.path, self._size = uri, size
        self.bytes_read = 0

    def size(self) -> int:
        return self._size

    def read(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        t = storage.retry_policy().timeout
        data = storage.gcs_call("read", self.path, lambda: storage.blob_of(
            self.path).download_as_bytes(start=start, end=end - 1, timeout=t, retry=None))
        self.bytes_read += len(data)
        return data


class TextSource:
    """A log already in memory (tests, a log handed over as text)."""

    def __init__(self, text: str | bytes, path: str = "<text>"):
        self.data = text.encode("utf-8") if isinstance(text, str) else text
        self.path = path
        self.bytes_read = 0

    def size(self) -> int:
        return len(self.data)

    def read(self, start: int, end: int) -> bytes:
        data = self.data[start:end]
        self.bytes_read += len(data)
        return data


def source(path: str):
    """The log at ``path`` (a local path or gs:// URI) to read, or None when there is none."""
    if path.startswith("gs://"):
        try:
            return GcsSource(path, storage.size(path))
        except (OSError, storage.StorageError):
            return None
    return LocalSource(path) if os.path.isfile(path) else None


def log_path(directory: str, name: str) -> str:
    """``directory``/``name`` for a local directory or a gs:// prefix."""
    if "://" in directory:
        return f"{directory.rstrip('/')}/{name}"
    return os.path.join(directory, name)


def parse(line: bytes | str) -> Optional[dict]:
    """The record of one line, or None (empty, cut short, not an object)."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _line_blocks(src, block: int = BLOCK) -> Iterator[tuple[bytes, list]]:
    """The lines of ``src``, a block at a time: (the block's bytes, its complete lines)."""
    size, offset, rest = src.size(), 0, b""
    while offset < size:
        data = src.read(offset, min(size, offset + block))
        if not data:
            break
        offset += len(data)
        data = rest + data
        lines = data.split(b"\n")
        rest = lines.pop()
        yield data, lines
    if rest:
        yield rest, [rest]


def _lines_forward(src, block: int = BLOCK) -> Iterator[bytes]:
    for _, lines in _line_blocks(src, block):
        yield from lines


def forward(src, block: int = BLOCK) -> Iterator[dict]:
    """Every record of ``src`` (None: none), first to last, one block in memory at a time."""
    if src is None:
        return
    for line in _lines_forward(src, block):
        record = parse(line)
        if record is not None:
            yield record


def _lines_backward(src, block: int = TAIL_BLOCK) -> Iterator[tuple[int, bytes]]:
    """(offset of the line's first byte, line), last line first."""
    end = src.size()
    rest = b""  # the start of the line being assembled (its end is known)
    while end > 0:
        start = max(0, end - block)
        data = src.read(start, end) + rest
        end = start
        lines = data.split(b"\n")
        rest = lines.pop(0) if start > 0 else b""
        position = start + len(rest) + (1 if start > 0 else 0)
        offsets = []
        for line in lines:
            offsets.append(position)
            position += len(line) + 1
        for off, line in reversed(list(zip(offsets, lines))):
            yield off, line
        if start == 0 and rest:
            yield 0, rest


def backward(src, block: int = TAIL_BLOCK) -> Iterator[dict]:
    """The records of ``src`` (None: none), last first; reads only as far as iterated."""
    if src is None:
        return
    for _, line in _lines_backward(src, block):
        record = parse(line)
        if record is not None:
            yield record


def last(src, predicate: Callable[[dict], bool] = lambda r: True) -> Optional[dict]:
    """The last record that satisfies ``predicate`` (None: none)."""
    return next((r for r in backward(src) if predicate(r)), None)


def is_metrics(record: dict) -> bool:
    """A metrics record, not an event (``"event"`` key: e.g. a wall-time stop)."""
    return "event" not in record


def trim(path: str, step: int, block: int = TAIL_BLOCK) -> int:
    """Cuts off a local log's records past ``step`` (a run killed between a log line and its
    checkpoint logged steps it will redo) and any cut line at its end, by truncating the file
    after its last record at or before ``step``; reads back only over what it cuts. Returns
    the number of bytes cut."""
    if not os.path.isfile(path):
        return 0
    src = LocalSource(path)
    size = src.size()
    keep = 0  # every record is past step, or there is none: nothing is kept
    for offset, line in _lines_backward(src, block):
        record = parse(line)
        if record is not None and record.get("step", 0) <= step:
            keep = offset + len(line) + 1  # with its newline
            break
    with open(path, "r+b") as f:
        if keep < size:
            f.truncate(keep)
        elif keep > size:  # the last record kept has no newline yet: appends go on its own line
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
    return max(0, size - keep)


def sample(src, limit: int = CURVE_POINTS, block: int = BLOCK) -> tuple[list, list]:
    """(metrics records, event records) of ``src`` for drawing: every event, and at most
    ``limit`` + 1 metrics records evenly strided through the log (every k-th line, k doubling
    whenever more would be kept, as TensorBoard keeps a sample of a long run's scalars) and
    always the last one. One pass over the bytes; only the kept lines and the events are
    parsed, so a log of 10^6 records costs about what reading its bytes does. Memory:
    ``limit`` lines."""
    limit = max(int(limit), 2)
    kept: list = []  # lines at indices 0, k, 2k, ... of the metrics lines
    events: list = []
    stride, index, last = 1, 0, None
    if src is None:
        return [], []
    for data, lines in _line_blocks(src, block):
        if b'"event"' in data:  # rare: a block with a stop in it
            metrics = []
            for line in lines:
                record = parse(line) if b'"event"' in line else None
                if record is not None and "event" in record:
                    events.append(record)
                else:
                    metrics.append(line)
            lines = metrics
        lines = [line for line in lines if line.strip()] if b"" in lines else lines
        if not lines:
            continue
        kept.extend(lines[(-index) % stride::stride])  # whole blocks at C speed
        index += len(lines)
        last = lines[-1]
        while len(kept) > limit:
            kept = kept[::2]
            stride *= 2
    if last is not None and (not kept or kept[-1] is not last):
        kept.append(last)
    return [r for r in map(parse, kept) if r is not None], events
