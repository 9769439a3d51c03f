"""The vocab stage: train a vocabulary (WordPiece by default, SentencePiece on request) or
adopt a given one, and report on it.

See docs/STAGES.md ("vocab"). Writes vocab.txt (WordPiece) or spm.model (SentencePiece), and
report.json.

Text is read in each task's format (compiler/stages/vocab.py plans the inputs): the union
of ``train_files`` / ``heldout_files`` as sentence_lines, or per task in ``sources``: text
files in their format (tasks/sources/text_formats.py), seqio sources through seqio
(tasks/sources/seqio_sources.py, imported only then) split into sentences like jsonl text. So a
vocab never learns pieces of markup such as a JSON line's ``{"text":``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Iterator

from runexp.compiler.errors import UserError
from runexp.compiler.specs import VocabSpec
from runexp.compiler.specs.vocab import VocabSummary
from runexp.compiler.specs.source import SourceSpec
from runexp.runtime.context import StageContext
from runexp.tasks.vocabulary import vocab_dir
from runexp.tasks.sources.text_documents import iter_documents, sample_sentences
from runexp.tasks.sources.text_files import expand_globs
from runexp.tasks.sources.sentence_split import split_text

_DIAGNOSTIC_LINES = 20_000


@dataclasses.dataclass
class _Text:
    """Where a split's sentences come from: readers of documents, in order."""
    readers: list = dataclasses.field(default_factory=list)
    parts: list = dataclasses.field(default_factory=list)  # for messages

    def add(self, what: str, reader: Callable[[], Iterator[list]]) -> None:
        self.readers.append(reader)
        self.parts.append(what)

    def documents(self) -> Iterator[list]:
        for reader in self.readers:
            yield from reader()

    def __bool__(self) -> bool:
        return bool(self.readers)

    def describe(self) -> str:
        return ", ".join(self.parts)


def _files(what: str, files: list) -> str:
    return f"{what}{len(files)} file{'' if len(files) == 1 else 's'}"


def _seqio_documents(source: SourceSpec, split: str, modules) -> Iterator[list]:
    from runexp.tasks.sources.seqio_sources import iter_documents as seqio_documents

    for text in seqio_documents(source, split, modules):
        sentences = split_text(text)
        if sentences:
            yield sentences


def text_of(ctx: StageContext) -> tuple[_Text, _Text]:
    """The train and held-out text of the stage's inputs (module docstring)."""
    train, heldout = _Text(), _Text()
    if "sources" not in ctx.inputs:
        for text, key in ((train, "train_files"), (heldout, "heldout_files")):
            files = expand_globs(ctx.inputs.get(key) or [])
            if files:
                text.add(_files("", files), functools.partial(iter_documents, files))
        return train, heldout
    modules = ctx.inputs.get("modules") or []
    for task, entry in ctx.inputs["sources"].items():
        fmt = entry["format"]
        if "settings_from" in entry:  # a seqio source: its settings are its stage's
            source = SourceSpec.pick(ctx.plan.stage(entry["settings_from"]).params)
            train.add(f"{task} ({fmt})", functools.partial(_seqio_documents, source,
                                                           "train", modules))
            if source.validation_split:
                heldout.add(f"{task} ({fmt})", functools.partial(
                    _seqio_documents, source, "validation", modules))
            continue
        source = SourceSpec.pick(entry)
        for text, key in ((train, "train_files"), (heldout, "heldout_files")):
            files = expand_globs(entry.get(key) or [])
            if files:
                text.add(_files(f"{task} ({fmt}): ", files), functools.partial(
                    iter_documents, files, fmt, source.text_field))
    return train, heldout


def run(ctx: StageContext) -> VocabSummary:
    spec = VocabSpec.from_stage(ctx)
    train, heldout = text_of(ctx)
    if spec.vocab_path:
        # The input is the local copy of a gs:// vocab (a one-file list), or the path itself.
        local = ctx.inputs.get("vocab_file") or spec.vocab_path
        local = local[0] if isinstance(local, list) else local
        ctx.progress(f"adopting {spec.vocab_path}")
        vocab_type = vocab_dir.adopt_vocab(local, ctx.work_dir)
    else:
        what = ("WordPiece" if spec.vocab_type == "wordpiece"
                else f"{spec.model_type} SentencePiece")
        sentences = sample_sentences(train.documents(), spec.max_sentences, spec.seed)
        if not sentences:
            where = train.describe() or "the inputs"
            raise UserError(f"no text to train the vocabulary on in {where}\n  hint: check "
                            "the corpus files and their format")
        ctx.progress(f"training a {what} vocab of {spec.vocab_size} on {len(sentences):,} "
                     f"sentences of {train.describe()}")
        vocab_type = vocab_dir.train_vocab(
            spec.vocab_type, sentences, ctx.work_dir, vocab_size=spec.vocab_size,
            do_lower_case=spec.do_lower_case, model_type=spec.model_type,
            num_threads=min(os.cpu_count() or 1, 8))
    # Held-out text when there is some; else a train sample (then the UNK rate is optimistic).
    diag = heldout if heldout else train
    seed = 0 if spec.vocab_path else spec.seed  # an adopted vocab has no sampling seed
    lines = sample_sentences(diag.documents(), _DIAGNOSTIC_LINES, seed + 1) if diag else []
    report = vocab_dir.write_report(ctx.work_dir, vocab_type, spec.do_lower_case, lines,
                                    "held-out text" if heldout else "a train sample")
    if "warning" in report:
        ctx.progress("WARNING: " + report["warning"])
    renamed = {role: piece for role, piece in report["special_pieces"].items() if role != piece}
    if renamed:  # e.g. an ALBERT-style model: <pad> and <unk> play [PAD] and [UNK]
        ctx.progress("special roles played by pieces of other spelling: " + ", ".join(
            f"{role}={piece} ({report['special_ids'][role]})" for role, piece in renamed.items()))
    return VocabSummary(vocab_size=report["vocab_size"], unk_rate=report["unk_rate"],
                        pieces_per_word=report["pieces_per_word"], type=vocab_type,
                        diagnostics_on=("heldout" if heldout else "train sample" if train
                                        else "no text (none given)"),
                        warning=report.get("warning"))
