"""The direction of imports between runexp's layers (docs/LAYERS.md), checked on every import
statement of compiler/, tasks/ and runtime/, function-local ones included.

A module may import its own layer and the layers below it, never one above. The light
layers (base, storage, plan: everything a dry run runs) never import TensorFlow, seqio or
another heavy library, not even inside a function; the subprocess tests of the CLI prove the
same of a real dry run (tests/compiler/test_cli.py).
"""

from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"compiler": "runexp.compiler", "tasks": "runexp.tasks", "runtime": "runexp.runtime"}

# Lowest first: (layer, module prefixes). A module belongs to the first layer one of whose
# prefixes it starts with, in the order of LAYERS, COMMANDS taking precedence.
COMMANDS = ("runexp.compiler.cli", "runexp.compiler.diff", "runexp.compiler.diff_metrics",
            "runexp.runtime.report.command")
LAYERS = (
    ("base", ("runexp.compiler.errors", "runexp.compiler.exit_codes", "runexp.compiler.uris",
              "runexp.compiler.globs", "runexp.compiler.terminal", "runexp.compiler.formats")),
    ("storage", ("runexp.runtime.storage",)),
    ("plan", ("runexp.compiler",)),
    ("tasks", ("runexp.tasks",)),
    ("runtime", ("runexp.runtime",)),
    ("commands", COMMANDS),
)
LIGHT_LAYERS = ("base", "storage", "plan")
HEAVY = ("tensorflow", "seqio", "apache_beam", "tf_keras", "keras", "keras_hub",
         "tensorflow_text", "tensorflow_hub", "torch", "transformers", "matplotlib")


def _starts(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    if any(_starts(module, c) for c in COMMANDS):
        return len(LAYERS) - 1
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(_starts(module, p) for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/LAYERS.md")


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package,) + parts)] = path
    return found


def imports(module: str, path: pathlib.Path, known) -> list[tuple[str, int]]:
    """(imported name, line) of every import in the file, function-local ones included."""
    return [found for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for found in imports_of_node(node, module, path, known)]


def imports_of_node(node, module: str, path: pathlib.Path, known) -> list[tuple[str, int]]:
    """``from a import b`` is ``a.b`` when that is a module of ours, else ``a``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if isinstance(node, ast.Import):
        return [(a.name, node.lineno) for a in node.names]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, node.lineno)
            for a in node.names]


def _own(name: str, known) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_every_import_goes_down_the_layers():
    known = modules()
    wrong = []
    for module, path in known.items():
        mine = layer_of(module)
        for name, line in imports(module, path, known):
            target = _own(name, known)
            if target is None:
                continue
            theirs = layer_of(target)
            if theirs > mine:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {module} ({LAYERS[mine][0]}) "
                             f"imports {target} ({LAYERS[theirs][0]})")
    assert not wrong, "imports against docs/LAYERS.md:\n" + "\n".join(wrong)


def test_light_layers_never_import_heavy_libraries():
    known = modules()
    wrong = []
    for module, path in known.items():
        if LAYERS[layer_of(module)][0] not in LIGHT_LAYERS:
            continue
        for name, line in imports(module, path, known):
            if name.split(".")[0] in HEAVY:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {module} imports {name}")
    assert not wrong, "a dry run must not import these:\n" + "\n".join(wrong)


def test_the_layers_name_every_module_and_the_doc_names_the_layers():
    doc = (REPO / "docs" / "LAYERS.md").read_text(encoding="utf-8")
    for module in modules():
        layer_of(module)  # raises for a module in no layer
    for name, prefixes in LAYERS:
        assert f"| {name} |" in doc, f"docs/LAYERS.md has no row for the {name} layer"
        for prefix in prefixes:
            assert f"`{prefix.removeprefix('runexp.')}`" in doc, (
                f"docs/LAYERS.md does not list {prefix} in the {name} layer")


def test_the_checker_sees_a_forbidden_edge(tmp_path):
    """The walk finds function-local imports and resolves `from a import b` to module a.b."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from runexp.runtime import storage\n"
                    "    import tensorflow as tf\n", encoding="utf-8")
    known = {"runexp.runtime.storage": path}
    assert imports("runexp.compiler.m", path, known) == [("runexp.runtime.storage", 2),
                                                          ("tensorflow", 3)]
    assert layer_of("runexp.runtime.storage") < layer_of("runexp.compiler.m") < layer_of(
        "runexp.tasks.x") < layer_of("runexp.runtime.trainer") < layer_of("runexp.compiler.cli")


def _top_level_imports(path: pathlib.Path, module: str, known) -> list[str]:
    """The imports a module runs when it is imported: not those inside functions (nor
    ``if TYPE_CHECKING:`` blocks, which never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    local = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef,
                                                              ast.AsyncFunctionDef))
             for n in ast.walk(fn)}
    local |= {id(n) for block in ast.walk(tree)
              if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
              for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in local:
            found += [name for name, _ in imports_of_node(node, module, path, known)]
    return found


def heavy_modules(known) -> set[str]:
    """Our modules whose import loads a heavy library, directly or through ours (parent
    packages included, as Python imports them first)."""
    edges = {m: _top_level_imports(p, m, known) for m, p in known.items()}
    heavy = {m for m, names in edges.items() if any(n.split(".")[0] in HEAVY for n in names)}
    changed = True
    while changed:
        changed = False
        for m, names in edges.items():
            parents = [".".join(m.split(".")[:i]) for i in range(2, m.count(".") + 1)]
            if m not in heavy and any(_own(n, known) in heavy for n in names + parents):
                heavy.add(m)
                changed = True
    return heavy


def test_function_local_imports_of_our_modules_are_for_heavy_ones():
    """Importing one of our modules inside a function hides a dependency; it is kept only
    where the module loads a heavy library (TensorFlow, seqio, Beam...) that the caller's
    other paths must not pay for, or where the CLI loads a sub-command on demand."""
    known = modules()
    heavy = heavy_modules(known)
    wrong = []
    for module, path in known.items():
        if layer_of(module) == len(LAYERS) - 1:
            continue  # the commands load their sub-commands on demand
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                for name, line in imports_of_node(node, module, path, known):
                    target = _own(name, known)
                    if target is not None and target not in heavy:
                        wrong.append(f"{path.relative_to(REPO)}:{line}: {target} is light: "
                                     "import it at the top")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_each_tasks_subpackage_names_its_heavy_modules():
    """tasks/ is grouped by purpose (sources, vocabulary, instances, cache); which of a group's
    modules load TensorFlow, seqio or Beam is said in its docstring, and this keeps it true."""
    known = modules()
    heavy = heavy_modules(known)
    for init in sorted((REPO / "tasks").glob("*/__init__.py")):
        group = f"runexp.tasks.{init.parent.name}"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        said = next((line for line in doc.splitlines() if line.startswith("Heavy")), "")
        named = {n.strip(" .") for n in said.partition(":")[2].split(",") if n.strip(" .")}
        actual = {m.rsplit(".", 1)[1] for m in heavy if m.rpartition(".")[0] == group}
        assert named == actual, (f"{init.relative_to(REPO)} says heavy: {sorted(named)}; "
                                 f"heavy in fact: {sorted(actual)}")
