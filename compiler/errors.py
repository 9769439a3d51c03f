"""User-facing errors: each says which file, which line, what is wrong and what to do.

The compiler collects every problem of a compile before it stops (`ErrorCollector`), so a
user fixes a file in one pass instead of one error per run. The CLI prints them and exits
with EXIT_USER_ERROR, never with a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a value or statement came from. `line` and `column` are 1-based; 0 = unknown."""

    file: str
    line: int = 0
    column: int = 0
    source: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


@dataclasses.dataclass(frozen=True)
class Problem:
    """One error or warning, rendered like a compiler diagnostic."""

    message: str
    location: Optional[Location] = None
    hint: str = ""
    severity: str = "error"

    def render(self) -> str:
        head = f"{self.severity}: {self.message}"
        lines = []
        if self.location is not None:
            lines.append(f"{self.location}: {head}")
            source = self.location.source.rstrip("\n")
            if source:
                lines.append(f"    {source}")
                # Point at the column when known, else under the first non-blank character.
                col = self.location.column or (len(source) - len(source.lstrip()) + 1)
                lines.append("    " + " " * (col - 1) + "^")
        else:
            lines.append(head)
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


class UserError(Exception):
    """One or more problems in what the user gave us. Carries all of them."""

    def __init__(self, problems: Iterable[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        body = "\n\n".join(p.render() for p in self.problems)
        if n > 1:
            body += f"\n\n{n} errors."
        return body


class ErrorCollector:
    """Collects problems during a compile; `raise_if_any()` raises them all at once."""

    def __init__(self) -> None:
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []

    def error(self, message: str, location: Optional[Location] = None, hint: str = "") -> None:
        problem = Problem(message, location, hint)
        if problem not in self.errors:
            self.errors.append(problem)

    def problems(self, problems: Iterable[Problem]) -> None:
        """Adds the problems of a UserError raised by a reader (a file's own errors)."""
        for problem in problems:
            if problem not in self.errors:
                self.errors.append(problem)

    def warn(self, message: str, location: Optional[Location] = None, hint: str = "") -> None:
        problem = Problem(message, location, hint, severity="warning")
        if problem not in self.warnings:
            self.warnings.append(problem)

    def raise_if_any(self) -> None:
        if self.errors:
            raise UserError(self.errors)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A hint naming the closest candidates, or listing the valid ones when none is close."""
    candidates = sorted(set(candidates))
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    if len(candidates) <= 12:
        return "valid names: " + ", ".join(candidates)
    return ""
