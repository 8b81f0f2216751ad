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
    ["treeopt.cli.tree_cmds", "treeopt.cli.roofline_cmds", "treeopt.tau", "treeopt.selection", "roofline.report"],
)
def test_tree_and_roofline_commands_do_not_load_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_calibration_module_imports_first():
    """Whichever calibration module a user imports first must load (an import cycle only shows
    when one of its modules is imported before the others). One interpreter loads the heavy
    libraries, then a forked child per module imports that module first."""
    modules = [m for m, _ in _modules() if m.startswith("calibration.")]
    code = (
        "import importlib, os, sys, traceback\n"
        "import numpy, pandas, scipy, torch, transformers\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "        except BaseException:\n"
        "            traceback.print_exc(limit=1)\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    if os.waitpid(pid, 0)[1]:\n"
        "        failed.append(name)\n"
        "print(' '.join(failed))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr
