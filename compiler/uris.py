"""Paths and URIs as the compiler sees them: local paths, gs:// URIs and builtin:// corpora.

`builtin://python_stdlib_docstrings/<file>` names a file of the corpus stage's output, so
the quickstart's gin files can point at text the experiment builds itself.
"""

from __future__ import annotations

import os
import posixpath
from typing import Iterator

from runexp.compiler import globs

BUILTIN_SCHEME = "builtin://"
BUILTIN_CORPORA = {
    "python_stdlib_docstrings": ("train.txt", "heldout.txt", "finetune_train.tsv",
                                 "finetune_dev.tsv"),
}


def is_gcs(uri: str) -> bool:
    return uri.startswith("gs://")


def is_builtin(uri: str) -> bool:
    return uri.startswith(BUILTIN_SCHEME)


def join(root: str, *parts: str) -> str:
    if is_gcs(root):
        return posixpath.join(root, *parts)
    return os.path.join(root, *parts)


def absolute(path: str) -> str:
    """Local paths become absolute (plans must not depend on the current directory)."""
    if is_gcs(path) or is_builtin(path):
        return path
    return os.path.abspath(os.path.expanduser(path))


def split_builtin(uri: str) -> tuple[str, str]:
    """'builtin://corpus/file' -> ('corpus', 'file')."""
    rest = uri[len(BUILTIN_SCHEME):]
    corpus, _, name = rest.partition("/")
    return corpus, name


def expand_local(pattern: str) -> list[str]:
    """Files a local glob matches, sorted (compiler/globs.py: the one glob semantics of
    runexp, shared with the text reader and gs:// listings)."""
    return globs.expand_local(pattern)


def strings_in(value) -> Iterator[str]:
    """Every string inside nested dicts, lists and tuples (a stage's inputs), in order."""
    if isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings_in(v)
    elif isinstance(value, str):
        yield value
