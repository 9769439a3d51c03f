"""Reads gin files and --gin_param bindings with gin-config's own parser, keeping locations.

We use gin's parser (so the syntax is exactly gin's) but not gin's global registry: the
statements become a `GinConfig`, a plain record of every binding and macro with the history
of values each received, in order, with file and line. Nothing is imported or executed.

Usage:
    config = load(["quickstart.gin"], ["TRAIN_STEPS=20"], search_paths=[])
    config.bindings[("", "train", "steps")]   # [Assignment(value, location), ...] (last wins)
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from typing import Any, Optional, Sequence

from gin import config_parser

from runexp.compiler.errors import ErrorCollector, Location


@dataclasses.dataclass(frozen=True)
class MacroRef:
    """`%NAME` in a value."""

    name: str


@dataclasses.dataclass(frozen=True)
class ConfigurableRef:
    """`@name` or `@name()` in a value. Only a few built-in references are meaningful."""

    name: str
    evaluate: bool


REQUIRED_MACRO = "gin.REQUIRED"


class _Delegate(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
        return ConfigurableRef(scoped_configurable_name, evaluate)

    def macro(self, macro_name):
        return MacroRef(macro_name)


@dataclasses.dataclass(frozen=True)
class Assignment:
    value: Any
    location: Location


@dataclasses.dataclass
class GinConfig:
    """Every statement of an experiment, in order of application (later wins).

    Attributes:
      macros: macro name -> its assignments in order.
      bindings: (scope, configurable, param) -> assignments in order.
      imports: the `import` statements, as written, with their locations.
      files: the gin files read, in the order they were first read (resolved paths).
    """

    macros: dict[str, list[Assignment]] = dataclasses.field(default_factory=dict)
    bindings: dict[tuple[str, str, str], list[Assignment]] = dataclasses.field(
        default_factory=dict)
    imports: list[tuple[str, Location]] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)
    # The --gin_file arguments, resolved to absolute paths.
    top_level: list[str] = dataclasses.field(default_factory=list)
    # Text of each file read, for the saved operative config.
    texts: dict[str, str] = dataclasses.field(default_factory=dict)


def installed_gin_dir() -> Optional[str]:
    """The gin/ folder shipped with runexp (source tree or site-packages)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(os.path.dirname(here), "gin"),
                      os.path.join(os.path.dirname(here), "configs")):
        if os.path.isdir(candidate) and os.path.isfile(os.path.join(candidate, "quickstart.gin")):
            return candidate
    return None


def _location(loc: config_parser.Location, display_name: str) -> Location:
    return Location(display_name, loc.line_num, (loc.char_num or 0) + 1 if loc.char_num is not None
                    else 0, loc.line_content or "")


class _Loader:
    def __init__(self, search_paths: Sequence[str], collector: ErrorCollector):
        self.search_paths = [p for p in search_paths if p]
        gin_dir = installed_gin_dir()
        if gin_dir:
            self.search_paths.append(gin_dir)
        self.collector = collector
        self.config = GinConfig()
        self._stack: list[str] = []

    def find(self, name: str, relative_to: Optional[str]) -> Optional[str]:
        """Resolves a gin file name: as given, next to the including file, then search paths."""
        candidates = [name] if os.path.isabs(name) else []
        if not os.path.isabs(name):
            if relative_to:
                candidates.append(os.path.join(os.path.dirname(relative_to), name))
            else:
                candidates.append(name)
            candidates += [os.path.join(p, name) for p in self.search_paths]
        for c in candidates:
            if os.path.isfile(c):
                return os.path.normpath(c)
        return None

    def display(self, path: str) -> str:
        """Paths inside the shipped gin/ folder are shown relative to it; others as relative."""
        gin_dir = installed_gin_dir()
        if gin_dir and os.path.abspath(path).startswith(gin_dir + os.sep):
            return "gin/" + os.path.relpath(os.path.abspath(path), gin_dir)
        rel = os.path.relpath(path)
        return path if rel.startswith("..") else rel

    def load_file(self, name: str, included_from: Optional[Location] = None,
                  relative_to: Optional[str] = None) -> None:
        path = self.find(name, relative_to)
        if path is None:
            where = ", ".join(self.search_paths) or "(none)"
            self.collector.error(
                f"gin file {name!r} not found",
                included_from,
                hint=f"looked next to the including file, in the current directory and in "
                     f"the search paths: {where}; add --gin_search_path=DIR")
            return
        real = os.path.realpath(path)
        if real in self._stack:
            chain = " -> ".join(self.display(p) for p in self._stack + [real])
            self.collector.error(f"circular include: {chain}", included_from,
                                 hint="remove one of the include statements")
            return
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            self.collector.error(f"cannot read gin file {name!r}: {e.strerror}", included_from,
                                 hint="check the path and its permissions")
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[:e.start].count(b"\n") + 1
            self.collector.error(f"gin file is not valid UTF-8 (byte {e.start})",
                                 Location(self.display(path), line),
                                 hint="save the file as UTF-8")
            return
        display = self.display(path)
        if included_from is None:
            self.config.top_level.append(os.path.abspath(path))
        if real not in [os.path.realpath(f) for f in self.config.files]:
            self.config.files.append(path)
        self.config.texts[display] = text
        self._stack.append(real)
        try:
            self.load_text(text, display, path)
        finally:
            self._stack.pop()

    def load_text(self, text: str, display: str, path: Optional[str]) -> None:
        """Parses ``text`` statement by statement (gin-config's own parser)."""
        stream = io.StringIO(text)
        stream.name = display
        parser = config_parser.ConfigParser(stream, _Delegate())
        while True:
            try:
                statement = parser.parse_statement()
            except SyntaxError as e:
                loc = e.args[1] if len(e.args) > 1 else None
                if isinstance(loc, config_parser.Location):
                    location = _location(loc, display)
                else:
                    location = Location(display, e.lineno or 0, e.offset or 0, e.text or "")
                unquoted = _unquoted_string(location.source or "")
                if unquoted is not None:
                    name, value = unquoted
                    quoted = f"{name} = {value!r}"
                    self.collector.error(
                        f"gin syntax error: {value!r} is not a gin value: strings need quotes",
                        location, hint=f"write {quoted}" + (
                            f' (on the command line: --gin_param="{name}={value!r}")'
                            if display.startswith("--gin_param") else ""))
                else:
                    self.collector.error(f"gin syntax error: {e.args[0] if e.args else e}",
                                         location,
                                         hint="see the gin syntax in runexp's gin/README.md")
                return  # the parser cannot continue past a syntax error
            except Exception as e:  # tokenize errors (unclosed brackets and the like)
                self.collector.error(f"gin syntax error: {e}", Location(display),
                                     hint="check for unclosed brackets or quotes")
                return
            if statement is None:
                return
            self.apply(statement, display, path)

    def apply(self, statement: Any, display: str, path: Optional[str]) -> None:
        location = _location(statement.location, display)
        if isinstance(statement, config_parser.BindingStatement):
            if not statement.arg_name and not statement.scope and statement.selector.isupper():
                self.config.macros.setdefault(statement.selector, []).append(
                    Assignment(statement.value, location))
            elif not statement.arg_name:
                self.collector.error(
                    f"{statement.selector!r} is neither a macro (UPPER_CASE) nor a "
                    "configurable.parameter binding",
                    location,
                    hint="write MACRO_NAME = value, or configurable.param = value")
            else:
                key = (statement.scope, statement.selector, statement.arg_name)
                self.config.bindings.setdefault(key, []).append(
                    Assignment(statement.value, location))
        elif isinstance(statement, config_parser.IncludeStatement):
            self.load_file(statement.filename, location, relative_to=path)
        elif isinstance(statement, config_parser.ImportStatement):
            # Imports run code: we never execute them in the compiler, only list them.
            if statement.module != "__gin__.dynamic_registration":
                self.config.imports.append((statement.format(), location))
        # BlockDeclaration: its bindings arrive as BindingStatements of their own.


def load(gin_files: Sequence[str], gin_params: Sequence[str],
         search_paths: Sequence[str] = ()) -> GinConfig:
    """Parses gin files (in order, later wins) then --gin_param bindings.

    Raises:
      UserError: with every problem found (syntax, missing or circular includes, encoding).
    """
    collector = ErrorCollector()
    loader = _Loader(search_paths, collector)
    if not gin_files:
        collector.error("no --gin_file given",
                        hint="try: runexp --gin_file=quickstart.gin --dry_run")
    for name in gin_files:
        loader.load_file(name)
    for i, binding in enumerate(gin_params):
        loader.load_text(binding, f"--gin_param[{i + 1}]", None)
    collector.raise_if_any()
    return loader.config


_BINDING = re.compile(r"^\s*([A-Za-z_][\w./]*)\s*=\s*(.+?)\s*$")
_GIN_VALUE_START = re.compile(r"""^(['"\[\({@%\-+.\d]|True\b|False\b|None\b)""")


def _unquoted_string(line: str) -> Optional[tuple[str, str]]:
    """``(name, value)`` when ``line`` binds a bare word or path, the commonest gin mistake
    (``OUTPUT_ROOT = out``); None otherwise."""
    match = _BINDING.match(line)
    if match is None or _GIN_VALUE_START.match(match.group(2)):
        return None
    return match.group(1), match.group(2)
