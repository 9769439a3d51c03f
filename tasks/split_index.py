"""A split's tokenised documents, read once: phase 1 of building pretraining shards.

The split's files (sorted, concatenated) are cut into byte ranges of equal size, anywhere;
``tokenize_range`` reads the lines that start in a range and tokenises them once, into a
spill (token ids, 2 bytes each for vocabs up to 65,536 ids, and sentence lengths), counting
every byte it reads. A line is a sentence (``sentence_lines``, the hot path), or the
range's lines are made sentences by their format (tasks/text_formats.py: ``paragraphs``
reads on past the range's end to the next sentence end, ``jsonl`` makes every line a
document). With a word segmenter (``word_segmenter``: Chinese words, tasks/chinese_words.py)
a token that continues a segmented word is stored with ``continuation_bit`` set (the spill's
dtype leaves room for it). ``build_split_index`` joins the ranges into the split's index:
documents stitched across range ends, and blocks of documents of ~1/4096 of the split (at
most 2^18 tokens), each with its own seed. ``assign_blocks`` gives shards their blocks
(largest first, to the shard with the fewest tokens). tasks/split_reader.py reads the index
back (``SplitIndex``).

Light: no TensorFlow. Used by tasks/pretraining_shards.py (phase 2: instances).
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
from runexp.tasks import input_files
from runexp.tasks.text_files import InputIssues, ReadCounter, _fix_line, iter_segment_lines
from runexp.tasks.text_formats import SegmentText, check_format
from runexp.tasks.tokenizer import cached_tokenizer

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


def tokenize_range(job: RangeJob) -> RangeResult:
    """Phase 1 (a top-level function, for worker pools): reads the range's bytes once,
    tokenises its sentences and writes ``range-k.tokens`` (ids), ``range-k.lengths`` (int32
    ids per sentence) and ``range-k.fragments.npy``."""
    check_format(job.text_format)
    tokenizer = cached_tokenizer(job.vocab_dir)
    dtype = token_dtype(tokenizer.vocab_size, bool(job.word_segmenter))
    counter = ReadCounter()
    issues = InputIssues.for_format(job.text_format)
    by_line = job.text_format == "sentence_lines"
    words = None
    line_at: list[tuple[str, int]] = []  # with a segmenter: each line's (file, line)
    if job.word_segmenter:
        from runexp.tasks.chinese_words import UNSEGMENTED, word_segmenter
        words = word_segmenter(job.word_segmenter, tokenizer)
        bit = continuation_bit(dtype)
        issues.counts.setdefault(UNSEGMENTED, 0)
        issues.samples.setdefault(UNSEGMENTED, [])
    frag_sentences: list[int] = []
    frag_tokens: list[int] = []
    frag_segment: list[int] = []
    frag_line: list[int] = []
    segment_lines: list[int] = []
    segment_text: list[bool] = []
    lines: list[str] = []
    line_frag: list[int] = []
    totals = [0, 0]  # sentences, tokens
    head_break = False
    broken = False   # a break since the last non-blank line
    in_frag = False
    with open(_range_path(job.index_dir, job.index, "tokens"), "wb") as tokens_out, \
            open(_range_path(job.index_dir, job.index, "lengths"), "wb") as lengths_out:

        def flush():
            if not lines:
                return
            ids, counts = tokenizer.encode_lines(lines)
            if words is not None:
                continues, unsegmented = words.continuations(lines, ids, counts)
                ids = ids | (continues.astype(np.int32) * bit)
                for i in unsegmented:
                    issues.note(UNSEGMENTED, *line_at[i])
                line_at.clear()
            tokens_out.write(ids.astype(dtype, copy=False).tobytes())
            kept = counts > 0
            lengths_out.write(counts[kept].astype(np.int32).tobytes())
            frags = np.asarray(line_frag, np.int64)
            first = int(frags[0])
            num = int(frags[-1]) - first + 1
            sentences = np.bincount(frags[kept] - first, minlength=num)
            tokens = np.bincount(frags - first, weights=counts, minlength=num)
            for i in np.flatnonzero(sentences).tolist():
                frag_sentences[first + i] += int(sentences[i])
                frag_tokens[first + i] += int(tokens[i])
            totals[0] += int(kept.sum())
            totals[1] += len(ids)
            lines.clear()
            line_frag.clear()

        for s, (f, start, end) in enumerate(job.segments):
            path = job.files[f]
            size = input_files.size(path)
            if start == 0:
                broken, in_frag = True, False  # a file's start
            if not by_line:
                reader = SegmentText(path, start, end, job.text_format, job.text_field,
                                     counter, issues)
                for k, sentences, doc_break in reader:
                    if k is not None:  # line k is document text
                        if not in_frag:
                            if not frag_sentences:
                                head_break = broken
                            frag_sentences.append(0)
                            frag_tokens.append(0)
                            frag_segment.append(s)
                            frag_line.append(k)
                            in_frag = True
                        broken = False
                    if sentences:
                        lines.extend(sentences)
                        line_frag.extend([len(frag_sentences) - 1] * len(sentences))
                        if words is not None:
                            at = k if k is not None else max(reader.lines - 1, 0)
                            line_at.extend([(path, at)] * len(sentences))
                        if len(lines) >= _LINES_PER_CALL:
                            flush()
                    if doc_break:
                        broken, in_frag = True, False
                segment_lines.append(reader.lines)
                segment_text.append(reader.has_text)
                if end >= size:
                    broken, in_frag = True, False  # a file's end
                continue
            owned = 0
            has_text = False
            for k, line in iter_segment_lines(path, start, end, counter):
                owned = k + 1
                if line is None:
                    has_text = True
                    issues.note("giant_lines", path, k)
                    continue
                line = line.strip()
                if not line:
                    broken, in_frag = True, False
                    continue
                has_text = True
                if not line.isascii():
                    fixed = _fix_line(line)
                    if fixed is not None:
                        line = fixed
                        issues.note("non_utf8_lines", path, k)
                if not in_frag:
                    if not frag_sentences:
                        head_break = broken
                    frag_sentences.append(0)
                    frag_tokens.append(0)
                    frag_segment.append(s)
                    frag_line.append(k)
                    in_frag = True
                broken = False
                lines.append(line)
                line_frag.append(len(frag_sentences) - 1)
                if words is not None:
                    line_at.append((path, k))
                if len(lines) >= _LINES_PER_CALL:
                    flush()
            segment_lines.append(owned)
            segment_text.append(has_text)
            if end >= size:
                broken, in_frag = True, False  # a file's end
        flush()
    if not frag_sentences:
        head_break = broken
    np.save(_range_path(job.index_dir, job.index, "fragments.npy"),
            np.array([frag_sentences, frag_tokens, frag_segment, frag_line],
                     np.int64).reshape(4, -1))
    return RangeResult(job.index, counter.bytes, issues, segment_lines, segment_text,
                       head_break, in_frag, totals[0], totals[1])


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
    index_dir = jobs[0].index_dir
    files = jobs[0].files
    # Lines are numbered per file: each segment's lines follow the ones of the segments
    # before it in the same file.
    line_base: dict[tuple[int, int], int] = {}
    file_lines = [0] * len(files)
    file_text = [False] * len(files)
    for job, res in zip(jobs, results):
        for s, (f, _, _) in enumerate(job.segments):
            line_base[job.index, s] = file_lines[f]
            file_lines[f] += res.segment_lines[s]
            file_text[f] = file_text[f] or res.segment_text[s]
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

    doc_sentences: list[np.ndarray] = []
    doc_tokens: list[np.ndarray] = []
    empty_docs: list[tuple[str, int]] = []
    open_doc = False
    with open(os.path.join(index_dir, "tokens.bin"), "wb") as tokens_out, \
            open(os.path.join(index_dir, "offsets.bin"), "wb") as offsets_out:
        offsets_out.write(np.zeros(1, np.int64).tobytes())
        token_base = 0
        pending = None  # (sentences, tokens, first line) of a document still open
        for job, res in zip(jobs, results):
            _copy_into(tokens_out, _range_path(index_dir, job.index, "tokens"))
            lengths = np.fromfile(_range_path(index_dir, job.index, "lengths"), np.int32)
            for what in ("tokens", "lengths"):
                os.remove(_range_path(index_dir, job.index, what))
            offsets_out.write((token_base + np.cumsum(lengths, dtype=np.int64)).tobytes())
            token_base += int(lengths.sum(dtype=np.int64))
            frags = np.load(_range_path(index_dir, job.index, "fragments.npy"))
            sentences, tokens, segment, line = frags
            firsts = [(files[job.segments[s][0]], line_base[job.index, s] + k + 1)
                      for s, k in zip(segment.tolist(), line.tolist())]
            if not len(sentences):
                if res.head_break and pending is not None:
                    doc_sentences.append(np.array([pending[0]]))
                    doc_tokens.append(np.array([pending[1]]))
                    if not pending[0]:
                        empty_docs.append(pending[2])
                    pending = None
                continue
            if pending is not None:
                if open_doc and not res.head_break:  # the open document goes on here
                    sentences[0] += pending[0]
                    tokens[0] += pending[1]
                    firsts[0] = pending[2]
                else:
                    doc_sentences.append(np.array([pending[0]]))
                    doc_tokens.append(np.array([pending[1]]))
                    if not pending[0]:
                        empty_docs.append(pending[2])
            # The last fragment may go on in the next range: hold it back.
            pending = (int(sentences[-1]), int(tokens[-1]), firsts[-1])
            open_doc = res.tail_open
            doc_sentences.append(sentences[:-1])
            doc_tokens.append(tokens[:-1])
            empty_docs.extend(firsts[i] for i in np.flatnonzero(sentences[:-1] == 0).tolist())
            os.remove(_range_path(index_dir, job.index, "fragments.npy"))
        if pending is not None:
            doc_sentences.append(np.array([pending[0]]))
            doc_tokens.append(np.array([pending[1]]))
            if not pending[0]:
                empty_docs.append(pending[2])
    for path, line in sorted(empty_docs):
        issues.note("empty_documents", path, line)
    sentences = np.concatenate(doc_sentences or [np.zeros(0, np.int64)]).astype(np.int64)
    tokens = np.concatenate(doc_tokens or [np.zeros(0, np.int64)]).astype(np.int64)
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
    flagged = bool(jobs[0].word_segmenter)
    meta = {"build": os.urandom(8).hex(), "dtype": token_dtype(vocab_size, flagged).str,
            "documents": int(kept.sum()), "sentences": int(doc_starts[-1]),
            "tokens": total_tokens, "input_bytes": sum(input_files.size(p) for p in files),
            "input_bytes_read": sum(r.bytes_read for r in results),
            "issues": {"counts": issues.counts,
                       "samples": {k: [list(s) for s in v] for k, v in issues.samples.items()}}}
    if flagged:  # tokens continuing a segmented word have this bit set
        meta["continuation_bit"] = continuation_bit(token_dtype(vocab_size, flagged))
    with open(os.path.join(index_dir, "meta.json"), "w") as f:
        json.dump(meta, f)
    return meta


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
