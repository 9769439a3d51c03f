"""Colour on a terminal, plain text everywhere else.

Colour only when the stream is a TTY, ``TERM`` is not ``dumb`` and ``NO_COLOR`` is unset
(https://no-color.org); ``FORCE_COLOR`` turns it on anyway (CI logs that render ANSI). Logs
and pipes stay plain and greppable. Standard library only: the dry run uses it.

Usage:
    print(paint("error:", "red", sys.stderr) + " ...", file=sys.stderr)
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

_CODES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
          "cyan": "36", "bold": "1", "dim": "2"}


def colour_on(stream: TextIO = sys.stdout) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def paint(text: str, style: str, stream: TextIO = sys.stdout) -> str:
    """``text`` in ``style`` (a name of _CODES, or several joined by '+') when the stream
    takes colour; else ``text`` unchanged."""
    if not colour_on(stream):
        return text
    codes = ";".join(_CODES[s] for s in style.split("+"))
    return f"\033[{codes}m{text}\033[0m"


def highlight(text: str, stream: TextIO = sys.stderr) -> str:
    """Diagnostics with their keywords coloured: ``error:`` red, ``warning:`` yellow,
    ``hint:`` cyan (when the stream takes colour)."""
    if not colour_on(stream):
        return text
    for word, style in (("error:", "red+bold"), ("warning:", "yellow+bold"),
                        ("hint:", "cyan")):
        text = text.replace(word, paint(word, style, stream))
    return text
