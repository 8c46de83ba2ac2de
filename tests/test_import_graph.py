"""The package's import graph: no cycle, no private name taken from another module, no upward import.

Run it as a script to print the graph's violations (``python tests/test_import_graph.py``); the test
fails while there is any. Every import counts, at module level or inside a function.

The layers, top to bottom. A module may import its own unit (a module, or a package with its
submodules) and anything in a lower layer. Inside a *closed* layer the units do not import each
other; inside an open one they may (a cycle among them is still a violation).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cf_tasks", "dataset_builders")

# (layer, closed, units)
LAYERS: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    ("cli: the command line's dispatcher", True, ("cf_tasks.cli",)),
    ("cli commands: one module per cf-tasks command, its flags and its checks", True, ("cf_tasks.commands",)),
    ("studies: commands that run other commands", True, ("cf_tasks.experiments", "cf_tasks.integrations")),
    ("commands: the sweep, the mitigations", True, ("cf_tasks.sweep", "cf_tasks.mitigations")),
    ("lm-eval runs: one model on some tasks (cf-tasks eval, each sweep checkpoint)", True, ("cf_tasks.evaluate",)),
    ("tasks: lm-eval hooks, scoring, results, checkpoints, the Hub copy of the datasets", False, (
        "cf_tasks.tasks", "cf_tasks.ic_recall", "cf_tasks.known", "cf_tasks.attention",
        "cf_tasks.results", "cf_tasks.scoring", "cf_tasks.checkpoints", "cf_tasks.default_model",
        "cf_tasks.dataset_cache",
        "cf_tasks.hub", "cf_tasks.trackers")),
    ("datasets: the builders and their fact tables", False, ("dataset_builders",)),
    ("base: files, errors, text, the task registry (the task families, the twin naming rule)", False,
     ("cf_tasks.files", "cf_tasks.errors", "cf_tasks.text", "cf_tasks.registry", "cf_tasks")),
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every module of the packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def unit_of(module: str) -> str | None:
    """The unit a module belongs to: the longest unit naming it or a package above it (the root
    ``cf_tasks`` names only its own ``__init__``)."""
    units = [u for _, _, us in LAYERS for u in us
             if module == u or (u != "cf_tasks" and module.startswith(u + "."))]
    return max(units, key=len) if units else None


def layer_of(unit: str) -> int:
    return next(i for i, (_, _, units) in enumerate(LAYERS) if unit in units)


def _resolve(importer: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports(known: dict[str, Path], taken: list | None = None) -> list[tuple[str, str, str | None, int]]:
    """(importer, imported module, private attribute taken or None, line) for every import of a
    module of the packages, and every ``module._name`` read through an imported module. ``taken``,
    when given, gets (importer, module, name, line) for every ``from module import name`` of a name
    that is not a submodule."""
    edges = []
    taken = [] if taken is None else taken
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        bound: dict[str, str] = {}  # local name -> module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        target = alias.name if alias.name in known else alias.name.rsplit(".", 1)[0]
                        edges.append((module, target, None, node.lineno))
                        if alias.asname:
                            bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(module, is_package, node.level, node.module)
                if source.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    if sub in known:
                        edges.append((module, sub, None, node.lineno))
                        bound[alias.asname or alias.name] = sub
                    else:
                        private = alias.name if _private(alias.name) else None
                        edges.append((module, source, private, node.lineno))
                        if alias.name != "*":
                            taken.append((module, source, alias.name, node.lineno))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and _private(node.attr)):
                edges.append((module, bound[node.value.id], node.attr, node.lineno))
    return edges


def defined_names(path: Path) -> set[str] | None:
    """The names a module binds at its top level (also inside top-level ``if``/``try``/``with``), or
    None when it cannot be known statically (a ``from x import *`` or a module ``__getattr__``)."""
    names: set[str] = set()

    def bind(target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                bind(element)

    def walk(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                bind(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                if not all(walk(block) for block in blocks):
                    return False
        return True

    if not walk(ast.parse(path.read_text(encoding="utf-8")).body) or "__getattr__" in names:
        return None
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def violations(root: Path = ROOT) -> list[str]:
    known = modules(root)
    taken: list[tuple[str, str, str, int]] = []
    edges = imports(known, taken)
    found = []
    for importer, source, name, line in taken:
        if source in known and (names := defined_names(known[source])) is not None and name not in names:
            found.append(f"undefined: {known[importer].relative_to(root)}:{line} {importer} imports {name} "
                         f"from {source}, which does not define it")
    for module in known:
        if unit_of(module) is None:
            found.append(f"unplaced: {module} is in no layer (add it to LAYERS)")
    graph: dict[str, set[str]] = {}
    for importer, target, private, line in edges:
        where = f"{known[importer].relative_to(root)}:{line}"
        if target not in known:
            found.append(f"missing: {where} {importer} imports {target}, which is no module of the packages")
            continue
        if target != importer:
            graph.setdefault(importer, set()).add(target)
        if private and target != importer:
            found.append(f"private: {where} {importer} takes {target}.{private}")
        a, b = unit_of(importer), unit_of(target)
        if a is None or b is None or a == b:
            continue
        if layer_of(b) < layer_of(a):
            found.append(f"upward: {where} {importer} ({LAYERS[layer_of(a)][0].split(':')[0]}) imports "
                         f"{target} ({LAYERS[layer_of(b)][0].split(':')[0]})")
        elif layer_of(b) == layer_of(a) and LAYERS[layer_of(a)][1]:
            found.append(f"peer: {where} {importer} imports {target}, another unit of the closed layer "
                         f"{LAYERS[layer_of(a)][0].split(':')[0]}")
    for component in cycles(graph):
        found.append(f"cycle: {' <-> '.join(component)}")
    return list(dict.fromkeys(found))  # one line per violation, in the order found


def test_import_graph():
    found = violations()
    assert not found, f"{len(found)} import-graph violation(s):\n" + "\n".join(found)


def test_each_kind_of_violation_is_found(tmp_path):
    """A planted tree: files (base) takes a private name of cli (top) inside a function, cli imports
    files, sweep and evaluate import each other, and a module sits in no layer."""
    files = {
        "cf_tasks/__init__.py": "",
        "cf_tasks/cli.py": "from .files import atomic_write\n\ndef _hidden():\n    pass\n",
        "cf_tasks/files.py": "def atomic_write():\n    from .cli import _hidden\n",
        "cf_tasks/evaluate.py": "from .sweep import plan\n",
        "cf_tasks/sweep/__init__.py": "",
        "cf_tasks/sweep/plan.py": "import cf_tasks.evaluate as ev\n\nev._quiet()\n",
        "cf_tasks/stray.py": "from .files import atomic_writer\n",
        "dataset_builders/__init__.py": "from cf_tasks.text import nothing\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = violations(tmp_path)
    assert "private: cf_tasks/files.py:2 cf_tasks.files takes cf_tasks.cli._hidden" in found
    assert "upward: cf_tasks/files.py:2 cf_tasks.files (base) imports cf_tasks.cli (cli)" in found
    assert "upward: cf_tasks/evaluate.py:1 cf_tasks.evaluate (lm-eval runs) imports cf_tasks.sweep.plan (commands)" in found
    assert "private: cf_tasks/sweep/plan.py:3 cf_tasks.sweep.plan takes cf_tasks.evaluate._quiet" in found
    assert "unplaced: cf_tasks.stray is in no layer (add it to LAYERS)" in found
    assert "missing: dataset_builders/__init__.py:1 dataset_builders imports cf_tasks.text, which is no module of the " \
           "packages" in found
    assert "cycle: cf_tasks.cli <-> cf_tasks.files" in found
    assert ("undefined: cf_tasks/stray.py:1 cf_tasks.stray imports atomic_writer from cf_tasks.files, which does "
            "not define it") in found
    assert "cycle: cf_tasks.evaluate <-> cf_tasks.sweep.plan" in found
    assert len(found) == 9, found


if __name__ == "__main__":
    found = violations()
    print("\n".join(found))
    kinds: dict[str, int] = {}
    for v in found:
        kinds[v.split(":")[0]] = kinds.get(v.split(":")[0], 0) + 1
    print(f"{len(found)} violation(s)" + (f": {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}" if found else ""))
    sys.exit(1 if found else 0)
