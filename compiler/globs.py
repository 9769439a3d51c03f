"""The one glob of runexp: the compiler, the text reader and gs:// listings match alike.

Semantics (a pattern is ``/``-separated; a gs:// pattern's key is matched, its bucket is
literal):

- ``*`` matches any run of characters within one name, ``?`` one character, ``[abc]``,
  ``[a-z]`` and ``[!abc]`` one character of (or not of) a set. None of them crosses ``/``.
- ``**`` as a whole path segment matches any number of directories, none included:
  ``corpus/**/*.txt`` matches ``corpus/a.txt`` and ``corpus/x/y/a.txt``. A trailing ``**``
  matches every file below: ``corpus/**`` is ``corpus/**/*``. Inside a longer segment
  (``a**b``) it is a plain ``*``.
- A wildcard never matches a leading ``.``: ``*`` skips ``.hidden`` and ``**`` does not
  descend into ``.cache/`` (as in the shell). Name the dot to match it (``.*``, ``.cache/*``).
- Only files (objects) match, never directories; a file (object) named exactly as the
  pattern always matches too, so a path that happens to contain ``[`` still names itself.
- Results are sorted and deduplicated.

Usage:
    expand_local("data/**/*.txt")          # local files
    match("corpus/**/*.txt", "corpus/a/b.txt")
    filter_names("corpus/*.txt", keys)     # e.g. the keys of a gs:// listing
    literal_prefix("corpus/part-*.txt")    # "corpus/part-": what to list on gs://
    escape("ckpt/model[1]") + ".*"         # a literal path as a pattern

Stdlib only: the compiler, the tasks and the storage layer all import it.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Iterable

MAGIC = "*?["
RECURSIVE = "**"


def has_magic(pattern: str) -> bool:
    return any(c in pattern for c in MAGIC)


def escape(path: str) -> str:
    """``path`` as a pattern that matches exactly it."""
    return re.sub(r"([*?[])", r"[\1]", path)


def literal_prefix(pattern: str) -> str:
    """The text before the first wildcard: every match starts with it."""
    cut = min((i for i, ch in enumerate(pattern) if ch in MAGIC), default=len(pattern))
    return pattern[:cut]


def _parts(pattern: str) -> list[str]:
    parts = pattern.split("/")
    if parts and parts[-1] == RECURSIVE:
        parts.append("*")  # a trailing ** is **/*: every file below
    return parts


def _segment_regex(segment: str) -> str:
    """One path segment (no ``/``) as a regular expression."""
    out = [] if segment.startswith(".") else [r"(?!\.)"]
    i, n = 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            while i < n and segment[i] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1 if i < n and segment[i] == "!" else i
            if j < n and segment[j] == "]":  # a ] right after [ or [! is a member
                j += 1
            j = segment.find("]", j)
            if j < 0:  # no closing bracket: a literal [
                out.append(re.escape(c))
                continue
            out.append(_set_regex(segment[i:j]))
            i = j + 1
        else:
            out.append(re.escape(c))
    return "".join(out)


def _set_regex(body: str) -> str:
    """``[...]``'s inside (``!`` first negates) as a regex set that never matches ``/``."""
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    items, k = [], 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            lo, hi = body[k], body[k + 2]
            if lo <= hi:  # a reversed range matches nothing
                items.append(f"{re.escape(lo)}-{re.escape(hi)}")
            k += 3
        else:
            items.append(re.escape(body[k]))
            k += 1
    if negate:
        return "[^/" + "".join(items) + "]"
    return "[" + "".join(items) + "]" if items else "(?!)"


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern:
    out = []
    parts = _parts(pattern)
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        if part == RECURSIVE:  # never last (see _parts): any number of visible directories
            out.append(r"(?:(?!\.)[^/]+/)*")
        else:
            out.append(_segment_regex(part) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def match(pattern: str, name: str) -> bool:
    """Whether the ``/``-separated ``name`` matches ``pattern`` (or is it, literally)."""
    return name == pattern or _regex(pattern).match(name) is not None


def filter_names(pattern: str, names: Iterable[str]) -> list[str]:
    """The ``names`` that ``pattern`` matches, sorted and deduplicated."""
    return sorted({n for n in names if match(pattern, n)})


def expand_local(pattern: str) -> list[str]:
    """Local files ``pattern`` matches, sorted, as paths in the pattern's form (relative
    stays relative). Directories are walked name by name, so only what the pattern can reach
    is read; ``**`` follows directory symlinks but never into a loop."""
    found = {pattern} if os.path.isfile(pattern) else set()
    if has_magic(pattern):
        parts = _parts(pattern)
        start = 0
        while start < len(parts) and not has_magic(parts[start]):
            start += 1
        base = "/".join(parts[:start])
        if not base and pattern.startswith("/"):
            base = "/"
        found.update(p for p in _walk(base, parts[start:]) if os.path.isfile(p))
    return sorted(found)


def _join(base: str, name: str) -> str:
    return name if not base else (base + name if base.endswith("/") else f"{base}/{name}")


def _names(directory: str) -> list[tuple[str, bool]]:
    """(name, is a directory) of each entry; nothing for what cannot be read."""
    try:
        with os.scandir(directory or ".") as it:
            return [(e.name, e.is_dir()) for e in it]
    except OSError:
        return []


def _walk(base: str, parts: list[str]):
    """Paths under ``base`` that the remaining pattern ``parts`` match."""
    if not parts:
        yield base
        return
    part, rest = parts[0], parts[1:]
    if part == "":  # a doubled or trailing slash
        yield from _walk(base, rest)
    elif part == RECURSIVE:
        for directory in _visible_dirs(base):
            yield from _walk(directory, rest)
    elif not has_magic(part):
        path = _join(base, part)
        if os.path.lexists(path):
            yield from _walk(path, rest)
    else:
        rx = re.compile(_segment_regex(part) + r"\Z", re.DOTALL)
        for name, is_dir in sorted(_names(base)):
            if (is_dir or not rest) and rx.match(name):
                yield from _walk(_join(base, name), rest)


def _visible_dirs(base: str) -> list[str]:
    """``base`` and every directory below it whose name does not start with ``.``."""
    out, seen, todo = [], set(), [base]
    while todo:
        directory = todo.pop()
        try:
            st = os.stat(directory or ".")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop, or a second way in
            continue
        seen.add((st.st_dev, st.st_ino))
        out.append(directory)
        todo.extend(_join(directory, name) for name, is_dir in sorted(_names(directory),
                                                                      reverse=True)
                    if is_dir and not name.startswith("."))
    return out
