"""A deterministic corpus of real English text from the machine's own documentation, and a vocab.

Used by bench/preprocess.py. Sources, in this order, until the corpus reaches the wanted size:
man pages (``/usr/share/man/man[1-8]``: English only, sorted by path, symlinks and ``.so``
redirects skipped) rendered to plain text with ``groff -t -man -Tutf8`` at a line length of
2000 characters, so a paragraph is one line; the info pages (``/usr/share/info``, one node a
document); then the docstrings and comments of the Python files of the system's Python and of
the running venv's site-packages (tasks/sources/stdlib_corpus.py's extraction). Prose is kept with
runexp's sentence splitter (tasks/sources/sentences.py: code-like lines, option tables and short
fragments dropped). One page, node or module is one document: one sentence a line, a blank
line between documents. Sentences seen earlier are dropped (gcloud's thousands of pages share
boilerplate), so the text is not artificially repetitive. The same machine image gives the
same bytes; the size and sha256 are recorded next to the corpus (``corpus.txt.json``). On the
image this was written on, the man pages give 13 MB, and 20 MB ends in the venv's docstrings.

The vocab is a 30k BERT vocab.txt made with runexp's own vocab code: a SentencePiece BPE model
trained on BERT-basic-tokenised lines (lower-cased, punctuation split off, so its pieces line
up with what FullTokenizer looks up), exported as WordPiece (``▁foo`` -> ``foo``, ``bar`` ->
``##bar``).

Usage (python bench/doc_corpus.py OUT_DIR [--mb 20]) or from Python:
    meta = build_corpus(out_dir, min_bytes=20_000_000)   # corpus.txt, corpus.txt.json
    vocab_dir = build_vocab(out_dir, meta["path"], vocab_size=30000)  # vocab.txt, report.json
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import sysconfig
from typing import Sequence

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAN_ROOT = "/usr/share/man"
INFO_ROOT = "/usr/share/info"
# The system's Python, then the packages of the Python running this (the benchmark's venv).
PYTHON_ROOTS = ("/usr/lib/python3.11", "/usr/lib/python3/dist-packages",
                sysconfig.get_paths()["purelib"])


def man_pages(root: str = MAN_ROOT) -> list[str]:
    pages = []
    for path in sorted(glob.glob(os.path.join(root, "man[1-8]", "*"))):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        pages.append(path)
    return pages


def python_files(roots: Sequence[str]) -> list[str]:
    files = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            files.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return files


def sources() -> list[tuple[str, str]]:
    """(kind, path) of every text source, in the order they are used."""
    info = sorted(p for p in glob.glob(os.path.join(INFO_ROOT, "*.info*")) if not os.path.islink(p))
    py_roots = [r for r in PYTHON_ROOTS if os.path.isdir(r)]
    return ([("man", p) for p in man_pages()] + [("info", p) for p in info]
            + [("py", p) for p in python_files(py_roots)])


def _read(path: str) -> bytes:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read()


def extract(source: tuple[str, str]) -> list[list[str]]:
    """The documents (lists of prose sentences) of one source; empty when it has none."""
    from runexp.tasks.sources.sentences import split_sentences
    from runexp.tasks.sources.stdlib_corpus import module_sentences
    kind, path = source
    try:
        if kind == "py":
            docs, comments = module_sentences(path)
            return [docs + comments]
        raw = _read(path)
    except (OSError, EOFError, ValueError):
        return []
    if kind == "info":  # nodes are separated by the unit separator
        return [split_sentences(node) for node in raw.decode("utf-8", "replace").split("\x1f")]
    if raw.lstrip().startswith(b".so "):
        return []
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
    try:
        proc = subprocess.run(["groff", "-t", "-man", "-Tutf8", "-P-cbou", "-rLL=2000n"],
                              input=raw, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [split_sentences(proc.stdout.decode("utf-8", errors="replace"))]


def build_corpus(out_dir: str, min_bytes: int = 20_000_000, name: str = "corpus.txt") -> dict:
    """Writes ``<out_dir>/<name>`` and ``<name>.json`` (size, sha256, sources); cached."""
    path = os.path.join(out_dir, name)
    meta_path = path + ".json"
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("min_bytes") == min_bytes and os.path.exists(path):
            return meta
    os.makedirs(out_dir, exist_ok=True)
    todo = sources()
    seen: set[str] = set()
    size = documents = sentences = 0
    used: dict[str, int] = {}
    digest = hashlib.sha256()
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as out, \
            multiprocessing.get_context("spawn").Pool(os.cpu_count() or 1) as pool:
        for source, docs in zip(todo, pool.imap(extract, todo, chunksize=8)):
            used[source[0]] = used.get(source[0], 0) + 1
            for doc in docs:
                fresh = []
                for s in doc:
                    if s not in seen:
                        seen.add(s)
                        fresh.append(s)
                if len(fresh) < 2:
                    continue
                text = ("\n" if documents else "") + "".join(s + "\n" for s in fresh)
                data = text.encode("utf-8")
                out.write(text)
                digest.update(data)
                size += len(data)
                documents += 1
                sentences += len(fresh)
            if size >= min_bytes:
                pool.terminate()
                break
    if size < min_bytes:
        sys.exit(f"the machine's documentation gives only {size:,} bytes of prose, short of "
                 f"{min_bytes:,}")
    os.replace(tmp, path)
    meta = {"path": path, "bytes": size, "sha256": digest.hexdigest(), "documents": documents,
            "sentences": sentences, "sources_read": used, "min_bytes": min_bytes,
            "sources": f"man pages ({MAN_ROOT}/man[1-8], groff -t -man -Tutf8 -rLL=2000n), "
                       f"info pages ({INFO_ROOT}), then docstrings and comments of the Python "
                       f"files under {', '.join(PYTHON_ROOTS)}, in that order"}
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def repeat_corpus(meta: dict, out_dir: str, copies: int) -> dict:
    """``copies`` copies of the corpus, for the scaling line: copy i has the documents in the
    order of a ``random.Random(i)`` shuffle (copy 0 as they are), so no two copies are the
    same bytes. Deterministic; rebuilt only when missing or of the wrong size. (The words are
    the corpus's own, so the tokenizer's word cache hits as often as on one copy.)"""
    import random
    path = os.path.join(out_dir, f"corpus_x{copies}.txt")
    with open(meta["path"], "rb") as f:
        docs = f.read().rstrip(b"\n").split(b"\n\n")
    size = copies * (sum(len(d) + 2 for d in docs) - 1) + copies - 1
    if not os.path.exists(path) or os.path.getsize(path) != size:
        with open(path + ".tmp", "wb") as f:
            for i in range(copies):
                order = list(range(len(docs)))
                if i:
                    random.Random(i).shuffle(order)
                f.write((b"\n" if i else b"") + b"\n\n".join(docs[j] for j in order) + b"\n")
        os.replace(path + ".tmp", path)
    return {"path": path, "bytes": os.path.getsize(path), "copies": copies}


def build_vocab(out_dir: str, corpus_path: str, vocab_size: int = 30000,
                max_sentences: int = 400_000) -> str:
    """A WordPiece vocab dir (vocab.txt, report.json) trained on the corpus; cached."""
    sys.path.insert(0, _ROOT)
    from runexp.tasks.vocabulary import vocab_dir as vocab_files
    from runexp.tasks.sources.text_documents import sample_lines
    vocab_dir = os.path.join(out_dir, f"vocab{vocab_size}wp")
    if os.path.exists(os.path.join(vocab_dir, "report.json")):
        return vocab_dir
    lines = sample_lines([corpus_path], max_sentences, seed=0)
    os.makedirs(vocab_dir + ".tmp", exist_ok=True)
    # The vocab stage's own trainer: a true WordPiece vocab.txt.
    vocab_files.train_vocab("wordpiece", lines, vocab_dir + ".tmp", vocab_size=vocab_size,
                            do_lower_case=True)
    vocab_files.write_report(vocab_dir + ".tmp", "wordpiece", True, lines[-20_000:])
    os.replace(vocab_dir + ".tmp", vocab_dir)
    return vocab_dir


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--mb", type=float, default=20.0)
    p.add_argument("--vocab_size", type=int, default=30000)
    args = p.parse_args()
    meta = build_corpus(args.out_dir, int(args.mb * 1e6))
    print(json.dumps(meta, indent=2))
    vocab_dir = build_vocab(args.out_dir, meta["path"], args.vocab_size)
    with open(os.path.join(vocab_dir, "report.json")) as f:
        report = json.load(f)
    print(vocab_dir, {k: report[k] for k in ("vocab_size", "unk_rate", "pieces_per_word")})


if __name__ == "__main__":
    main()
