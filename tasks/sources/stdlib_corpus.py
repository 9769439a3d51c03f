"""The quickstart corpus: the prose of the running Python's standard library.

Every Python install has this text, so the quickstart needs no download. The corpus is
deterministic for a Python version and seed: modules are walked in sorted order, parsed with
``ast`` (never imported), and their module, class and function docstrings split into
sentences, followed by the sentences of their comment blocks. One module is one document.
Docstrings alone give about 1.2 MB on Python 3.11, short of the 2 MB the quickstart wants, so
comments (about 0.8 MB) and pydoc's help topics (the language reference ``help()`` shows, one
document per topic) are included; fine-tuning examples use docstring sentences only. Sentences seen earlier in the walk are dropped, so
boilerplate repeated across modules (codec stubs, "Return self==value.") appears once and the
same sentence can never be in two splits.

Splits:
  - held-out documents: modules whose seeded hash falls under ``heldout_fraction``, plus, for
    each fine-tuning class whose held-out part is too small for a dev set, more whole modules
    of that class (in hash order). Held-out modules are never in ``train.txt``.
  - fine-tuning: "which top-level stdlib package does this sentence come from", over the
    ``finetune_classes`` packages with the most sentences (packages only: a class needs
    several modules so that train and dev can be document-disjoint). Train sentences come from
    train documents, dev sentences from held-out documents, with per-class caps so the
    majority class stays near ``1 / finetune_classes``.

Usage:
    corpus = build_corpus(min_bytes=2_000_000, heldout_fraction=0.05, finetune_classes=6, seed=0)
    summary = write_corpus(corpus, out_dir)

Stdlib only (no TensorFlow, no numpy).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
import random
import sysconfig
from typing import Iterator, Sequence

from runexp.tasks.sources.sentences import split_sentences

# Directories never read: tests and their data, the IDE, third-party code, binary builds.
_SKIP_DIRS = frozenset({
    "test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "__pycache__",
    "lib-dynload", "turtledemo", "ensurepip", "__phello__", "pydoc_data",
})
_MIN_DEV_PER_CLASS = 60      # a class with fewer held-out sentences gets more held-out modules
_MAX_DEV_PER_CLASS = 150
_MAX_TRAIN_PER_CLASS = 800  # caps keep the classes near balance
_MIN_CLASS_MODULES = 4
_NOT_LABELS = frozenset({"pydoc_data"})  # reference topics, not a package's docstrings


@dataclasses.dataclass(frozen=True)
class Document:
    """One module's docstring sentences."""
    module: str
    sentences: tuple[str, ...]
    docstring_sentences: int  # the first ones are docstring sentences, the rest comments

    @property
    def docstrings(self) -> tuple[str, ...]:
        return self.sentences[:self.docstring_sentences]

    @property
    def package(self) -> str:
        return self.module.split(".")[0]

    def text(self) -> str:
        return "".join(f"{s}\n" for s in self.sentences)


@dataclasses.dataclass(frozen=True)
class StdlibCorpus:
    """The corpus split into pretraining documents and fine-tuning examples."""
    train: tuple[Document, ...]
    heldout: tuple[Document, ...]
    labels: tuple[str, ...]
    finetune_train: tuple[tuple[str, str], ...]  # (label, sentence)
    finetune_dev: tuple[tuple[str, str], ...]


def stdlib_dir() -> str:
    """The source directory of the running Python's standard library."""
    return sysconfig.get_paths()["stdlib"]


def iter_stdlib_modules(root: str | None = None) -> Iterator[tuple[str, str]]:
    """Yields (module name, file path) for the stdlib's .py files, in sorted order."""
    root = root or stdlib_dir()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _SKIP_DIRS and not d.startswith(("config-", ".")))
        rel = os.path.relpath(dirpath, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and not os.path.exists(os.path.join(dirpath, "__init__.py")):
            continue  # not a package (data directories)
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("test_") or name.endswith("_test.py"):
                continue
            stem = name[:-3]
            if not parts and stem.startswith("_sysconfigdata"):
                continue
            module = ".".join(parts + ([] if stem == "__init__" else [stem]))
            yield module, os.path.join(dirpath, name)


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Module, class and function docstrings in source order."""
    doc = ast.get_docstring(tree, clean=True) if isinstance(
        tree, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if doc:
        yield doc
    for child in ast.iter_child_nodes(tree):
        yield from _docstrings(child)


def _comment_blocks(source: str) -> Iterator[str]:
    """Runs of consecutive ``#`` comment lines, each joined into one text."""
    block: list[str] = []
    for line in source.splitlines() + [""]:
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith(("#!", "# -*-")):
            block.append(stripped.lstrip("#").strip())
        elif block:
            yield "\n".join(block)
            block = []


def module_sentences(path: str) -> tuple[list[str], list[str]]:
    """The docstring sentences and the comment sentences of one source file."""
    with open(path, "rb") as f:
        source = f.read()
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError):
        return [], []
    docs = [s for doc in _docstrings(tree) for s in split_sentences(doc)]
    text = source.decode("utf-8", errors="replace")
    comments = [s for block in _comment_blocks(text) for s in split_sentences(block)]
    return docs, comments


def _topic_documents() -> Iterator[tuple[str, list[str], list[str]]]:
    """pydoc's help topics (the language reference that ``help()`` shows), one per topic."""
    from pydoc_data import topics  # stdlib data module; imported lazily, it is 0.5 MB
    for key in sorted(topics.topics):
        yield f"pydoc_data.topics.{key}", [], split_sentences(topics.topics[key])


def extract_documents(root: str | None = None) -> list[Document]:
    """All stdlib documents, each sentence kept at its first occurrence only.

    A module's document is its docstring sentences (source order) followed by its comment
    sentences; pydoc's help topics follow the modules, one document per topic.
    """
    seen: set[str] = set()

    def novel(sentences):
        out = []
        for s in sentences:
            if s not in seen:
                seen.add(s)
                out.append(s)
        return out

    def sources():
        for module, path in iter_stdlib_modules(root):
            yield (module, *module_sentences(path))
        yield from _topic_documents()

    docs = []
    for module, doc_sentences, comment_sentences in sources():
        doc_sentences = novel(doc_sentences)
        sentences = doc_sentences + novel(comment_sentences)
        if sentences:
            docs.append(Document(module, tuple(sentences), len(doc_sentences)))
    return docs


def _unit_hash(key: str, seed: int) -> float:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def choose_labels(docs: Sequence[Document], num_classes: int) -> list[str]:
    """The ``num_classes`` packages with the most sentences (ties by name)."""
    sentences: dict[str, int] = {}
    modules: dict[str, int] = {}
    for d in docs:
        if d.docstring_sentences:
            sentences[d.package] = sentences.get(d.package, 0) + d.docstring_sentences
            modules[d.package] = modules.get(d.package, 0) + 1
    candidates = [p for p in sentences
                  if modules[p] >= _MIN_CLASS_MODULES and p not in _NOT_LABELS]
    candidates.sort(key=lambda p: (-sentences[p], p))
    if len(candidates) < num_classes:
        raise ValueError(
            f"finetune_classes={num_classes}, but only {len(candidates)} stdlib packages have "
            f"at least {_MIN_CLASS_MODULES} modules with docstrings")
    return sorted(candidates[:num_classes])


def _split_heldout(docs: Sequence[Document], labels: Sequence[str], heldout_fraction: float,
                   seed: int) -> set[str]:
    """Held-out module names: by hash, topped up per class to ``_MIN_DEV_PER_CLASS``."""
    order = sorted(docs, key=lambda d: (_unit_hash(d.module, seed), d.module))
    heldout = {d.module for d in order if _unit_hash(d.module, seed) < heldout_fraction}
    for label in labels:
        members = [d for d in order if d.package == label]
        total = sum(d.docstring_sentences for d in members)
        have = sum(d.docstring_sentences for d in members if d.module in heldout)
        for d in members:
            if have >= _MIN_DEV_PER_CLASS:
                break
            # Never hold out more than a third of a class: its train part must stay large.
            if d.module not in heldout and have + d.docstring_sentences <= total / 3:
                heldout.add(d.module)
                have += d.docstring_sentences
    return heldout


def _labelled(docs: Sequence[Document], labels: Sequence[str], cap: int,
              rng: random.Random) -> list[tuple[str, str]]:
    examples = []
    for label in labels:
        sentences = [s for d in docs if d.package == label for s in d.docstrings]
        rng.shuffle(sentences)
        examples.extend((label, s) for s in sentences[:cap])
    rng.shuffle(examples)
    return examples


def build_corpus(min_bytes: int = 2_000_000, heldout_fraction: float = 0.05,
                 finetune_classes: int = 6, seed: int = 0,
                 root: str | None = None) -> StdlibCorpus:
    """Builds the corpus and its fine-tuning data.

    Args:
      min_bytes: least UTF-8 size of the train text; fewer raises ``ValueError``.
      heldout_fraction: share of modules held out (before per-class top-ups).
      finetune_classes: number of packages to classify.
      seed: seeds the held-out hash and the fine-tuning sampling.
      root: stdlib directory (default: the running interpreter's).

    Returns:
      The StdlibCorpus.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    docs = extract_documents(root)
    labels = choose_labels(docs, finetune_classes)
    heldout_names = _split_heldout(docs, labels, heldout_fraction, seed)
    train = tuple(d for d in docs if d.module not in heldout_names)
    heldout = tuple(d for d in docs if d.module in heldout_names)
    size = sum(len(d.text().encode()) for d in train)
    if size < min_bytes:
        raise ValueError(
            f"the stdlib docstrings of {root or stdlib_dir()} give {size:,} bytes of train "
            f"text, fewer than min_bytes={min_bytes:,}: lower min_bytes or heldout_fraction, "
            "or use a corpus of your own")
    rng = random.Random(seed)
    dev = _labelled(heldout, labels, _MAX_DEV_PER_CLASS, rng)
    ft_train = _labelled(train, labels, _MAX_TRAIN_PER_CLASS, rng)
    return StdlibCorpus(train, heldout, tuple(labels), tuple(ft_train), tuple(dev))


def _write_documents(path: str, docs: Sequence[Document]) -> int:
    text = "\n".join(d.text() for d in docs)
    data = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def _write_tsv(path: str, examples: Sequence[tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("label\tsentence\n")
        for label, sentence in examples:
            f.write(f"{label}\t{sentence.replace(chr(9), ' ')}\n")


def write_corpus(corpus: StdlibCorpus, out_dir: str) -> dict:
    """Writes train.txt, heldout.txt, finetune_train.tsv, finetune_dev.tsv; returns counts."""
    summary = {}
    for split, docs in (("train", corpus.train), ("heldout", corpus.heldout)):
        size = _write_documents(os.path.join(out_dir, f"{split}.txt"), docs)
        summary[split] = {"documents": len(docs),
                          "sentences": sum(len(d.sentences) for d in docs), "bytes": size}
    _write_tsv(os.path.join(out_dir, "finetune_train.tsv"), corpus.finetune_train)
    _write_tsv(os.path.join(out_dir, "finetune_dev.tsv"), corpus.finetune_dev)
    summary["finetune_examples"] = {"train": len(corpus.finetune_train),
                                    "dev": len(corpus.finetune_dev)}
    summary["labels"] = list(corpus.labels)
    return summary
