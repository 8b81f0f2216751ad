"""The direction of dependencies (docs/architecture.md), checked on the source: the core at the
bottom imports none of the others; `roofline` and `calibration` import only the core, never each
other; the application layer (treeopt.cli, treeopt.app, and the public API treeopt.api) is the
only place that joins them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ("treeopt.cli", "treeopt.app", "treeopt.api")
HEAVY = ("torch", "transformers", "safetensors", "tokenizers", "accelerate")


def _package_of(module: str) -> str:
    if module.startswith(APP) or module == "treeopt.__main__":
        return "app"
    top = module.split(".")[0]
    return "core" if top == "treeopt" else top


def _modules():
    for package in ("treeopt", "roofline", "calibration"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def _imports(path: Path):
    """(imported module, line, inside a function) for every import of a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


ALLOWED = {
    "core": {"core"},
    "roofline": {"core", "roofline"},
    "calibration": {"core", "calibration"},
    "app": {"core", "roofline", "calibration", "app"},
}


def test_every_module_imports_only_downwards():
    wrong = []
    for module, path in _modules():
        here = _package_of(module)
        for imported, line, _ in _imports(path):
            if imported.split(".")[0] not in ("treeopt", "roofline", "calibration"):
                continue
            there = _package_of(imported)
            if there not in ALLOWED[here]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {imported} ({there})")
    assert not wrong, "\n".join(wrong)


def test_core_and_roofline_never_import_torch():
    wrong = []
    for module, path in _modules():
        if _package_of(module) not in ("core", "roofline"):
            continue
        for imported, line, _ in _imports(path):
            if imported.split(".")[0] in HEAVY:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_imports_inside_functions_say_why():
    """Imports live at the top of a module; the few inside functions (keeping torch out of a
    command that does not need it) carry a comment on the line or the line above."""
    unexplained = []
    for _, path in _modules():
        lines = path.read_text(encoding="utf-8").splitlines()
        for imported, line, in_function in _imports(path):
            if not in_function:
                continue
            here, above = lines[line - 1], lines[line - 2] if line >= 2 else ""
            if "#" not in here and not above.strip().startswith("#"):
                unexplained.append(f"{path.relative_to(ROOT)}:{line}: {imported}")
    assert not unexplained, "\n".join(unexplained)


@pytest.mark.parametrize(
    "module",
    [
        "treeopt.cli.tree_cmds",
        "treeopt.cli.roofline_cmds",
        "treeopt.cli.hw_cmds",
        "treeopt.tau",
        "treeopt.selection",
        "roofline.report",
    ],
)
def test_tree_and_roofline_commands_do_not_load_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_calibration_module_imports_first():
    """Whichever calibration module a user imports first must load (an import cycle only shows
    when one of its modules is imported before the others). One interpreter loads the heavy
    libraries, then a forked child per module imports that module first, as many children at a
    time as the machine has cores (the suite's time budget)."""
    modules = [m for m, _ in _modules() if m.startswith("calibration.")]
    code = (
        "import importlib, os, sys, traceback\n"
        "import numpy, pandas, scipy, torch, transformers\n"
        "failed, running = [], {}\n"
        "def reap():\n"
        "    pid, status = os.wait()\n"
        "    name = running.pop(pid)\n"
        "    if status:\n"
        "        failed.append(name)\n"
        "for name in sys.argv[1:]:\n"
        "    if len(running) >= max(2, os.cpu_count() or 1):\n"
        "        reap()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "        except BaseException:\n"
        "            traceback.print_exc(limit=1)\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    running[pid] = name\n"
        "while running:\n"
        "    reap()\n"
        "print(' '.join(sorted(failed)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr


def _imported_names(tree: ast.AST, modules) -> list[str]:
    """The module (or package) every import of a parsed file names, of those that run: those
    under `if TYPE_CHECKING:` never do."""
    skipped = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append(sub if sub in modules else node.module)
    return out


def _lazy_modules(pkg: str, path: Path, modules) -> set[str]:
    """The modules a package `__init__` with a module `__getattr__` may load on first access:
    every string in the file that names one of its modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        return set()
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return {s for s in strings if s in modules} | {f"{pkg}.{s}" for s in strings if f"{pkg}.{s}" in modules}


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the three packages it can load, counting imports inside
    functions and, for a package whose `__init__` loads modules on first attribute access (a
    module `__getattr__`), those modules as loaded by whoever imports the package by name
    (`import treeopt`, `from treeopt import X`). Importing `a.b.c` also runs the `__init__` of
    `a` and `a.b`, so those are edges too, except from modules inside them (whose import ran
    that `__init__` first). `if TYPE_CHECKING:` imports never run."""
    modules = dict(_modules())
    lazy = {m: _lazy_modules(m, p, modules) for m, p in modules.items() if p.name == "__init__.py"}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def with_parents(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(modules)

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        own_packages = with_parents(module) - {module}  # their `__init__` has run before this module
        for target in _imported_names(ast.parse(path.read_text(encoding="utf-8")), modules):
            found = known(target)
            if found is None:
                continue
            edges |= with_parents(found) - own_packages
            if found == target:  # a package by name: its lazy modules too
                edges |= lazy.get(found, set())
        graph[module] = edges - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle_counting_lazy_package_imports():
    """No module of the three packages can reach itself through imports: top-level, inside
    functions, through a parent package's `__init__`, or through the modules a package
    `__init__` loads on first attribute access (docs/architecture.md#layers)."""
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_sees_a_cycle_through_a_lazy_init():
    """The finder itself, on a hand-made graph: a -> pkg (by name) -> pkg's lazy b -> a."""
    assert _cycles({"a": {"pkg", "pkg.b"}, "pkg": set(), "pkg.b": {"a"}}) == [["a", "pkg.b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_version_is_the_packages():
    """`treeopt.version.__version__` (what written files record) is the version pyproject.toml
    installs."""
    from treeopt.version import __version__

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = next(
        line.split("=", 1)[1].strip().strip('"') for line in text.splitlines() if line.startswith("version")
    )
    assert __version__ == declared
