"""A split's tokenised documents, read once: phase 1 of building pretraining shards.

The split's files (sorted, concatenated) are cut into byte ranges of equal size, anywhere;
``tokenize_range`` reads the lines that start in a range and tokenises them once, into a
spill (token ids, 2 bytes each for vocabs up to 65,536 ids, and sentence lengths), counting
every byte it reads. The range's lines are read by their text format's reader
(tasks/sources/text_formats.py: a line is a sentence in ``sentence_lines``; ``paragraphs`` reads on
past the range's end to the next sentence end; ``jsonl`` makes every line a document), whose
events (document text, sentences, document breaks) make the range's fragments: runs of
document text with no break inside the range. With a word segmenter (``word_segmenter``: Chinese words, tasks/vocabulary/chinese_words.py)
a token that continues a segmented word is stored with ``continuation_bit`` set (the spill's
dtype leaves room for it). ``build_split_index`` joins the ranges into the split's index:
documents stitched across range ends, and blocks of documents of ~1/4096 of the split (at
most 2^18 tokens), each with its own seed. ``assign_blocks`` gives shards their blocks
(largest first, to the shard with the fewest tokens). tasks/instances/split_reader.py reads the index
back (``SplitIndex``).

Light: no TensorFlow. Used by tasks/instances/pretraining_shards.py (phase 2: instances).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import heapq
import json
import os
from typing import Sequence

import numpy as np

from runexp.compiler.specs.preprocess import MaskingSpec
from runexp.compiler.specs.source import SourceSpec
from runexp.tasks.sources import input_files
from runexp.tasks.sources.text_files import InputIssues, ReadCounter
from runexp.tasks.sources.text_formats import input_issues, reader_class
from runexp.tasks.vocabulary.tokenizer import cached_tokenizer
from runexp.tasks.vocabulary.chinese_words import UNSEGMENTED, word_segmenter

_LINES_PER_CALL = 4096


def block_seed(seed: int, split: str, block: int) -> int:
    """The seed of a block's instance plan: from (random_seed, split, block) alone."""
    digest = hashlib.sha256(f"{seed}:{split}:block:{block}".encode()).digest()
    return int.from_bytes(digest[:16], "little")



SPILL_DIR = ".preprocess-spill"


def token_dtype(vocab_size: int, flagged: bool = False) -> np.dtype:
    """The spill's token dtype: 2 bytes while the ids (and, ``flagged``, the continuation
    bit) fit."""
    return np.dtype(np.uint16) if vocab_size <= (1 << 15 if flagged else 1 << 16) \
        else np.dtype(np.int32)


def continuation_bit(dtype: np.dtype) -> int:
    """The bit marking a token that continues a segmented word, in a flagged spill of
    ``dtype`` (above every id: token_dtype)."""
    return 1 << 15 if np.dtype(dtype) == np.uint16 else 1 << 30


def plan_ranges(sizes: Sequence[int], num_ranges: int) -> list[tuple[tuple[int, int, int], ...]]:
    """Cuts the concatenation of files of ``sizes`` bytes into ``num_ranges`` ranges of
    equal size, anywhere (lines are given to the range holding their first byte): each range
    as its segments ``(file index, start, end)``. Empty files go to the range at their
    position, so that their emptiness is seen."""
    total = sum(sizes)
    cuts = [total * k // num_ranges for k in range(num_ranges + 1)]
    ranges: list[list[tuple[int, int, int]]] = [[] for _ in range(num_ranges)]
    pos = 0
    for f, size in enumerate(sizes):
        r = min(bisect.bisect_right(cuts, pos) - 1, num_ranges - 1)  # the range holding pos
        if size == 0:
            ranges[r].append((f, 0, 0))
            continue
        while r < num_ranges and cuts[r] < pos + size:
            start, end = max(cuts[r], pos), min(cuts[r + 1], pos + size)
            if start < end:
                ranges[r].append((f, start - pos, end - pos))
            r += 1
        pos += size
    return [tuple(r) for r in ranges]


@dataclasses.dataclass(frozen=True)
class RangeJob:
    """Phase 1: tokenise the lines starting in one byte range of a split's files, read in
    ``text_format`` (a text format of compiler/specs/source.py; ``text_field``: jsonl's);
    ``word_segmenter`` (MaskingSpec's): mark the tokens that continue a segmented word."""
    files: tuple[str, ...]
    vocab_dir: str
    index_dir: str
    index: int
    segments: tuple[tuple[int, int, int], ...]
    text_format: str = SourceSpec.format
    text_field: str = SourceSpec.text_field
    word_segmenter: str = MaskingSpec.word_segmenter


@dataclasses.dataclass
class RangeResult:
    """What a range job reports (its tokens, sentence lengths and fragments are in files).

    A fragment is a run of non-blank lines with no document break inside the range (a
    break: a blank line, a file's start or end); a document is one fragment or, across
    range ends, several. Issue samples and fragment lines count lines from each segment's
    start (0-based): the parent makes them file line numbers once every range is done.
    """
    index: int
    bytes_read: int
    issues: InputIssues
    segment_lines: list   # lines starting in each segment
    segment_text: list    # whether each segment has a non-blank line
    head_break: bool      # a break before the first fragment (no fragment: anywhere)
    tail_open: bool       # the last fragment reaches the range's end
    sentences: int
    tokens: int


def _range_path(index_dir: str, index: int, what: str) -> str:
    return os.path.join(index_dir, f"range-{index:05d}.{what}")


class _Fragments:
    """A range's fragments (RangeResult) as they are read: per fragment its sentences and
    tokens (counted as the spill tokenises them), its segment and its first line."""

    def __init__(self) -> None:
        self.columns: tuple[list[int], ...] = ([], [], [], [])  # sentences, tokens, segment, line
        self.head_break = False  # a break before the first fragment
        self.broken = False      # a break since the last line of document text
        self.open = False        # the last fragment goes on

    @property
    def current(self) -> int:
        return len(self.columns[0]) - 1

    def text(self, segment: int, k: int) -> None:
        """Line ``k`` of ``segment`` is document text: in the open fragment, or a new one."""
        if not self.open:
            if not self.columns[0]:
                self.head_break = self.broken
            for column, value in zip(self.columns, (0, 0, segment, k)):
                column.append(value)
            self.open = True
        self.broken = False

    def end_document(self) -> None:
        self.broken, self.open = True, False

    def count(self, first: int, sentences: np.ndarray, tokens: np.ndarray) -> None:
        """Adds sentences and tokens to the fragments ``first``, ``first + 1``, ..."""
        for i in np.flatnonzero(sentences).tolist():
            self.columns[0][first + i] += int(sentences[i])
            self.columns[1][first + i] += int(tokens[i])

    def save(self, path: str) -> None:
        if not self.columns[0]:
            self.head_break = self.broken  # no fragment: a break anywhere
        np.save(path, np.array(self.columns, np.int64).reshape(4, -1))


class _Spill:
    """A range's sentences, tokenised ``_LINES_PER_CALL`` at a time into ``range-k.tokens``
    and ``range-k.lengths``, each counted in its fragment. With a word segmenter, the
    tokens continuing a word get ``continuation_bit``; lines it cannot line up are noted."""

    def __init__(self, job: RangeJob, fragments: _Fragments, issues: InputIssues):
        self.tokenizer = cached_tokenizer(job.vocab_dir)
        self.dtype = token_dtype(self.tokenizer.vocab_size, bool(job.word_segmenter))
        self.fragments, self.issues = fragments, issues
        self.words = None
        if job.word_segmenter:
            self.words = word_segmenter(job.word_segmenter, self.tokenizer)
            issues.counts.setdefault(UNSEGMENTED, 0)
            issues.samples.setdefault(UNSEGMENTED, [])
        self.paths = [_range_path(job.index_dir, job.index, what)
                      for what in ("tokens", "lengths")]
        self.lines: list[str] = []
        self.line_frag: list[int] = []
        self.line_at: list[tuple[str, int]] = []  # with a segmenter: each line's (file, line)
        self.sentences = self.tokens = 0

    def __enter__(self) -> "_Spill":
        self.tokens_out, self.lengths_out = (open(p, "wb") for p in self.paths)
        return self

    def __exit__(self, *exc) -> None:
        self.tokens_out.close()
        self.lengths_out.close()

    def add(self, sentences: list[str], path: str, line: int) -> None:
        """Sentences of the current fragment, from ``line`` of ``path``."""
        self.lines.extend(sentences)
        self.line_frag.extend([self.fragments.current] * len(sentences))
        if self.words is not None:
            self.line_at.extend([(path, line)] * len(sentences))
        if len(self.lines) >= _LINES_PER_CALL:
            self.flush()

    def flush(self) -> None:
        if not self.lines:
            return
        ids, counts = self.tokenizer.encode_lines(self.lines)
        if self.words is not None:
            ids = self._mark_continuations(ids, counts)
        self.tokens_out.write(ids.astype(self.dtype, copy=False).tobytes())
        kept = counts > 0
        self.lengths_out.write(counts[kept].astype(np.int32).tobytes())
        frags = np.asarray(self.line_frag, np.int64)
        first = int(frags[0])
        num = int(frags[-1]) - first + 1
        self.fragments.count(first, np.bincount(frags[kept] - first, minlength=num),
                             np.bincount(frags - first, weights=counts, minlength=num))
        self.sentences += int(kept.sum())
        self.tokens += len(ids)
        self.lines.clear()
        self.line_frag.clear()

    def _mark_continuations(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        continues, unsegmented = self.words.continuations(self.lines, ids, counts)
        for i in unsegmented:
            self.issues.note(UNSEGMENTED, *self.line_at[i])
        self.line_at.clear()
        return ids | (continues.astype(np.int32) * continuation_bit(self.dtype))


def tokenize_range(job: RangeJob) -> RangeResult:
    """Phase 1 (a top-level function, for worker pools): reads the range's bytes once in its
    text format, tokenises its sentences and writes ``range-k.tokens`` (ids),
    ``range-k.lengths`` (int32 ids per sentence) and ``range-k.fragments.npy``."""
    read = reader_class(job.text_format)
    counter = ReadCounter()
    issues = input_issues(job.text_format)
    fragments = _Fragments()
    segment_lines: list[int] = []
    segment_text: list[bool] = []
    with _Spill(job, fragments, issues) as spill:
        for s, (f, start, end) in enumerate(job.segments):
            path = job.files[f]
            size = input_files.size(path)
            if start == 0:
                fragments.end_document()  # a file's start
            reader = read(path, start, end, job.text_field, counter, issues)
            for k, sentences, doc_break in reader:
                if k is not None:  # line k is document text
                    fragments.text(s, k)
                if sentences:
                    spill.add(sentences, path, k if k is not None else max(reader.lines - 1, 0))
                if doc_break:
                    fragments.end_document()
            segment_lines.append(reader.lines)
            segment_text.append(reader.has_text)
            if end >= size:
                fragments.end_document()  # a file's end
        spill.flush()
    fragments.save(_range_path(job.index_dir, job.index, "fragments.npy"))
    return RangeResult(job.index, counter.bytes, issues, segment_lines, segment_text,
                       fragments.head_break, fragments.open, spill.sentences, spill.tokens)


# --- between the phases: the split's index ---------------------------------------------------

BLOCKS_PER_SPLIT = 4096
MAX_BLOCK_TOKENS = 1 << 18


def _copy_into(out, path: str) -> None:
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                return
            out.write(chunk)


def build_split_index(jobs: Sequence[RangeJob], results: Sequence[RangeResult],
                      vocab_size: int) -> dict:
    """Joins a split's ranges (in the parent, once every range is done) into its index:

    - ``tokens.bin``: every token of the split; ``offsets.bin``: int64 token offset of every
      sentence, with the end;
    - ``documents.npy``: int64 first sentence of every document (those with a token), with
      the end; documents are runs of non-blank lines, stitched across ranges;
    - ``blocks.npy``: first document of every block, with the end; ``block_tokens.npy``:
      tokens per block. A block is a run of documents of about ``total / BLOCKS_PER_SPLIT``
      tokens (at most MAX_BLOCK_TOKENS): the unit of shard assignment and of instance seeds,
      set by the text alone;
    - ``meta.json``: counts, bad input (file line numbers), input bytes and bytes read;
      with a word segmenter, the ``continuation_bit`` of the tokens.

    The range files are deleted. Returns the meta.
    """
    jobs = sorted(jobs, key=lambda j: j.index)
    results = sorted(results, key=lambda r: r.index)
    index_dir, files = jobs[0].index_dir, jobs[0].files
    line_base, file_text = _line_bases(jobs, results, len(files))
    issues = _file_issues(jobs, results, line_base, file_text)
    documents = _join_ranges(jobs, results, line_base)
    for path, line in sorted(documents.empty):
        issues.note("empty_documents", path, line)
    counts = _write_documents(index_dir, *documents.arrays())
    flagged = bool(jobs[0].word_segmenter)
    meta = {"build": os.urandom(8).hex(), "dtype": token_dtype(vocab_size, flagged).str,
            **counts, "input_bytes": sum(input_files.size(p) for p in files),
            "input_bytes_read": sum(r.bytes_read for r in results),
            "issues": {"counts": issues.counts,
                       "samples": {k: [list(s) for s in v] for k, v in issues.samples.items()}}}
    if flagged:  # tokens continuing a segmented word have this bit set
        meta["continuation_bit"] = continuation_bit(token_dtype(vocab_size, flagged))
    with open(os.path.join(index_dir, "meta.json"), "w") as f:
        json.dump(meta, f)
    return meta


def _line_bases(jobs: Sequence[RangeJob], results: Sequence[RangeResult], num_files: int
                ) -> tuple[dict[tuple[int, int], int], list[bool]]:
    """Lines are numbered per file: each segment's lines follow the ones of the segments
    before it in the same file. The line each (range, segment) starts after; and whether
    each file has text."""
    line_base: dict[tuple[int, int], int] = {}
    file_lines = [0] * num_files
    file_text = [False] * num_files
    for job, res in zip(jobs, results):
        for s, (f, _, _) in enumerate(job.segments):
            line_base[job.index, s] = file_lines[f]
            file_lines[f] += res.segment_lines[s]
            file_text[f] = file_text[f] or res.segment_text[s]
    return line_base, file_text


def _file_issues(jobs: Sequence[RangeJob], results: Sequence[RangeResult],
                 line_base: dict, file_text: list[bool]) -> InputIssues:
    """The ranges' bad input at file line numbers, and the files with no text."""
    files = jobs[0].files
    issues = InputIssues()
    for job, res in zip(jobs, results):
        segment_of = {files[f]: s for s, (f, _, _) in enumerate(job.segments)}
        fixed = InputIssues()
        fixed.counts = dict(res.issues.counts)
        fixed.samples = {kind: [(p, line_base[job.index, segment_of[p]] + k + 1)
                                for p, k in samples]
                         for kind, samples in res.issues.samples.items()}
        issues.add(fixed)
    for f, path in enumerate(files):
        if not file_text[f]:
            issues.note("empty_files", path, 0)
    return issues


class _Documents:
    """The split's documents, stitched from the ranges' fragments in order: a range's last
    fragment is held back (``pending``) while the next range may go on with it."""

    def __init__(self) -> None:
        self.sentences: list[np.ndarray] = []
        self.tokens: list[np.ndarray] = []
        self.empty: list[tuple[str, int]] = []  # (file, first line) of documents with no token
        self.pending = None  # (sentences, tokens, first line) of a document still open
        self.open = False    # the pending document reaches its range's end

    def add_range(self, sentences: np.ndarray, tokens: np.ndarray, firsts: list,
                  head_break: bool, tail_open: bool) -> None:
        if not len(sentences):
            if head_break:
                self.close()
            return
        if self.pending is not None and self.open and not head_break:
            sentences[0] += self.pending[0]  # the open document goes on here
            tokens[0] += self.pending[1]
            firsts[0] = self.pending[2]
            self.pending = None
        self.close()
        self.pending = (int(sentences[-1]), int(tokens[-1]), firsts[-1])
        self.open = tail_open
        self.sentences.append(sentences[:-1])
        self.tokens.append(tokens[:-1])
        self.empty.extend(firsts[i] for i in np.flatnonzero(sentences[:-1] == 0).tolist())

    def close(self) -> None:
        """Ends the pending document."""
        if self.pending is not None:
            sentences, tokens, first = self.pending
            self.sentences.append(np.array([sentences]))
            self.tokens.append(np.array([tokens]))
            if not sentences:
                self.empty.append(first)
            self.pending = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Sentences and tokens of every document (the pending one ended)."""
        self.close()
        return tuple(np.concatenate(parts or [np.zeros(0, np.int64)]).astype(np.int64)
                     for parts in (self.sentences, self.tokens))


def _join_ranges(jobs: Sequence[RangeJob], results: Sequence[RangeResult], line_base: dict
                 ) -> _Documents:
    """Appends the ranges' tokens to ``tokens.bin`` and their sentence ends to
    ``offsets.bin``, stitches their fragments into documents and deletes the range files."""
    index_dir, files = jobs[0].index_dir, jobs[0].files
    documents = _Documents()
    with open(os.path.join(index_dir, "tokens.bin"), "wb") as tokens_out, \
            open(os.path.join(index_dir, "offsets.bin"), "wb") as offsets_out:
        offsets_out.write(np.zeros(1, np.int64).tobytes())
        token_base = 0
        for job, res in zip(jobs, results):
            _copy_into(tokens_out, _range_path(index_dir, job.index, "tokens"))
            lengths = np.fromfile(_range_path(index_dir, job.index, "lengths"), np.int32)
            offsets_out.write((token_base + np.cumsum(lengths, dtype=np.int64)).tobytes())
            token_base += int(lengths.sum(dtype=np.int64))
            sentences, tokens, segment, line = np.load(
                _range_path(index_dir, job.index, "fragments.npy"))
            for what in ("tokens", "lengths", "fragments.npy"):
                os.remove(_range_path(index_dir, job.index, what))
            firsts = [(files[job.segments[s][0]], line_base[job.index, s] + k + 1)
                      for s, k in zip(segment.tolist(), line.tolist())]
            documents.add_range(sentences, tokens, firsts, res.head_break, res.tail_open)
    return documents


def _write_documents(index_dir: str, sentences: np.ndarray, tokens: np.ndarray) -> dict:
    """Writes ``documents.npy``, ``blocks.npy`` and ``block_tokens.npy`` of the documents
    with a token (their sentences and tokens given); their counts."""
    kept = sentences > 0
    doc_starts = np.concatenate([[0], np.cumsum(sentences[kept])]).astype(np.int64)
    doc_token_starts = np.concatenate([[0], np.cumsum(tokens[kept])]).astype(np.int64)
    total_tokens = int(doc_token_starts[-1])
    block_tokens = min(MAX_BLOCK_TOKENS, max(1, -(-total_tokens // BLOCKS_PER_SPLIT)))
    key = doc_token_starts[:-1] // block_tokens
    blocks = np.concatenate([[0], np.flatnonzero(np.diff(key)) + 1, [len(key)]]) \
        if len(key) else np.zeros(1, np.int64)
    np.save(os.path.join(index_dir, "documents.npy"), doc_starts)
    np.save(os.path.join(index_dir, "blocks.npy"), blocks.astype(np.int64))
    np.save(os.path.join(index_dir, "block_tokens.npy"),
            np.diff(doc_token_starts[blocks]).astype(np.int64))
    return {"documents": int(kept.sum()), "sentences": int(doc_starts[-1]),
            "tokens": total_tokens}


def assign_blocks(block_tokens: np.ndarray, num_shards: int) -> np.ndarray:
    """The shard of every block: largest blocks first, each to the shard with the fewest
    tokens so far (ties: the lower shard). Balances shards by tokens, and gives every shard
    blocks from all over the split."""
    shard_of = np.zeros(len(block_tokens), np.int64)
    heap = [(0, s) for s in range(num_shards)]
    for b in np.argsort(-np.asarray(block_tokens), kind="stable").tolist():
        load, s = heapq.heappop(heap)
        shard_of[b] = s
        heapq.heappush(heap, (load + int(block_tokens[b]), s))
    return shard_of
