"""Gin ``import`` statements resolved to their source files, without importing anything.

A gin file may ``import my_project.tasks``: a module of the user's that registers seqio
tasks (formats ``seqio_documents`` and ``seqio_bert_features``). The compiler never runs it
(a dry run imports neither TensorFlow nor the user's code). It finds the module the way
Python's path finder would, looking next to the gin file that imports it, then in the
current directory, then on ``sys.path``, and fingerprints its source, so that a change to
the module rebuilds the stages that read through it. The preprocess and vocab stages import
the modules (``tasks/seqio_sources.import_user_modules``), with the directory found here put
first on ``sys.path``.

What is fingerprinted: for the user's own module (found outside the interpreter's
installation), every ``.py`` file of its top-level package, because a task module usually
imports its siblings; for an installed module (``import seqio``, a pip-installed package),
only the files on the way (the module, its packages' ``__init__.py``).

If no place has the module, that is an error at the import's line. gin would fail on it,
and runexp never silently ignores what a gin file asks for.

Standard library only.

Usage:
    modules = resolve_imports(config.imports, collector)   # PlanContext does it, once
    entries, fps = planned_modules(ctx)   # [{"module", "path", "sys_path", "gin_import"}]
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import os
import re
import site
import sys
import sysconfig
from typing import Optional, Sequence

from runexp.compiler.errors import ErrorCollector, Location
from runexp.compiler.fingerprint import digest, file_digest
from runexp.compiler.loader import installed_gin_dir

_IMPORT = re.compile(r"^\s*import\s+([\w.]+)(?:\s+as\s+\w+)?\s*$")
_FROM_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(\w+)(?:\s+as\s+\w+)?\s*$")


@dataclasses.dataclass(frozen=True)
class ResolvedModule:
    """A gin import, found.

    Attributes:
      module: the dotted name.
      location: the import statement's file and line.
      path: the module's file (a package's ``__init__.py``); "" for a built-in module.
      sys_path: the directory its top-level package is found in, put on ``sys.path`` at run
        time; "" for an installed module (already importable).
      files: (name relative to ``sys_path`` or the module's root, absolute path) of what is
        fingerprinted.
    """

    module: str
    location: Location
    path: str
    sys_path: str
    files: tuple[tuple[str, str], ...]

    def entry(self) -> dict:
        """The module as a stage input (JSON)."""
        return {"module": self.module, "path": self.path, "sys_path": self.sys_path,
                "gin_import": str(self.location)}


def module_name(statement: str) -> Optional[str]:
    """The module a gin import statement loads: ``import a.b`` -> a.b; ``from a import b``
    -> a.b (gin imports modules only, never names from a module)."""
    match = _IMPORT.match(statement)
    if match:
        return match.group(1)
    match = _FROM_IMPORT.match(statement)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def gin_dir(location: Location) -> Optional[str]:
    """The directory of the gin file a statement is in (None: a --gin_param)."""
    name = location.file
    if name.startswith("--gin_param"):
        return None
    if os.path.isfile(name):
        return os.path.dirname(os.path.abspath(name))
    shipped = installed_gin_dir()
    if shipped and name.startswith("gin/"):
        return os.path.dirname(os.path.join(shipped, name[len("gin/"):]))
    return None


@functools.lru_cache(maxsize=1)
def _installed_roots() -> frozenset[str]:
    """Directories of the interpreter's own installation: stdlib and site-packages."""
    roots = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(os.path.realpath(paths[key]))
    try:
        roots.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # some virtualenvs' site module has no getsitepackages
        pass
    user = getattr(site, "USER_SITE", None)
    if user:
        roots.add(os.path.realpath(user))
    return frozenset(roots)


def search_roots(directory: Optional[str]) -> list[str]:
    """Where a module is looked for, in order: the gin file's directory, the current
    directory, then sys.path (existing directories, each once)."""
    out = []
    for d in [directory, os.getcwd(), *sys.path]:
        if d is None:
            continue
        d = os.path.abspath(d or ".")
        if os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def _find_spec(name: str, roots: Sequence[str]):
    """The spec of ``name`` found under ``roots`` without importing it or its packages;
    (spec, [package specs on the way]) or (None, [])."""
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], list(roots))
    chain = []
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None, []
        chain.append(spec)
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[:i + 1]), list(spec.submodule_search_locations))
    return spec, chain


def _top_dir(origin: str, name: str, is_package: bool) -> str:
    """The directory holding the top-level package (or module) of ``name``."""
    up = len(name.split(".")) + (1 if is_package else 0)
    path = origin
    for _ in range(up):
        path = os.path.dirname(path)
    return path


def _python_files(top: str) -> list[str]:
    """Every .py file under a user's top-level package directory (hidden directories and
    __pycache__ left out), sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and
                             d != "__pycache__")
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return out


def resolve(name: str, location: Location) -> Optional[ResolvedModule]:
    """Finds the module a gin import names (module docstring). None: not found."""
    if name in sys.builtin_module_names:
        return ResolvedModule(name, location, "", "", ())
    spec, chain = _find_spec(name, search_roots(gin_dir(location)))
    if spec is None:
        return None
    if spec.origin in (None, "namespace"):  # a namespace package: nothing to read
        origin = ""
        locations = list(spec.submodule_search_locations or [])
        root = _top_dir(os.path.join(locations[0], "__init__.py"), name, True) \
            if locations else ""
    else:
        origin = os.path.abspath(spec.origin)
        root = _top_dir(origin, name, spec.submodule_search_locations is not None)
    installed = os.path.realpath(root) in _installed_roots()
    if installed:
        on_the_way = [s.origin for s in chain if s.origin not in (None, "namespace")]
        files = [f for f in on_the_way + [origin] if f and os.path.isfile(f)]
    else:
        top = os.path.join(root, name.split(".")[0])
        files = _python_files(top) if os.path.isdir(top) else [origin]
    return ResolvedModule(name, location, origin, "" if installed else root,
                          tuple((os.path.relpath(f, root), f) for f in files))


def resolve_imports(imports: Sequence[tuple[str, Location]],
                    collector: ErrorCollector) -> list[ResolvedModule]:
    """Every gin import, found (in the order of the statements, each module once); an
    import that names no module anywhere is an error at its line."""
    out: dict[str, ResolvedModule] = {}
    for statement, location in imports:
        name = module_name(statement)
        if name is None or name in out:
            continue
        found = resolve(name, location)
        if found is None:
            here = gin_dir(location)
            first = name.split(".")[0]
            collector.error(
                f"gin import: no module named {name!r}", location,
                hint=f"runexp reads the module's source when planning and imports it when a "
                     f"stage runs; it looked for {name.replace('.', '/')}.py (or a package "
                     f"{first}/) " + (f"next to the gin file ({here}), " if here else "")
                     + f"in the current directory ({os.getcwd()}) and on sys.path: put it "
                     f"there, or install it (pip install -e YOUR_PROJECT)")
            continue
        out[name] = found
    return list(out.values())


def modules_digest(modules: Sequence[ResolvedModule]) -> str:
    """The fingerprint of the modules' source (module docstring: which files)."""
    return digest([{"module": m.module,
                    "files": [{**file_digest(path), "name": rel} for rel, path in m.files]}
                   for m in modules])


def planned_modules(ctx) -> tuple[list[dict], dict]:
    """The gin imports of the experiment as a stage's input, and their fingerprint:
    ``([{"module", "path", "sys_path", "gin_import"}, ...], {"modules": digest})``.
    ``ctx``: the PlanContext (its ``modules``, resolved once per compile)."""
    modules = ctx.modules
    return [m.entry() for m in modules], {"modules": modules_digest(modules)}
