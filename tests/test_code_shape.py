"""The size of the code's functions, held where a reader needs it (docs/architecture.md#code-shape).

ruff holds complexity, statements and arguments (pyproject.toml, [tool.ruff.lint]); it has no
rule for a function's length in lines, so this test holds that one: a function in `treeopt/`,
`calibration/` or `roofline/` is at most MAX_LINES long and at most MAX_LONG of them exceed
LONG_LINES. The parameter cap is checked here too so a failure names every offender at once.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("treeopt", "calibration", "roofline")
LONG_LINES = 80
MAX_LINES = 120
MAX_LONG = 5
MAX_PARAMETERS = 12


def _functions():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield path.relative_to(ROOT).as_posix(), node


def _parameters(node) -> int:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len([n for n in names if n not in ("self", "cls")])


def _is_click_command(node) -> bool:
    """A click command takes one parameter per option by design (click passes them by name)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("command", "group"):
            return True
    return False


def _length(node) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_function_is_longer_than_a_screen_or_two():
    too_long = [
        f"{path}:{n.lineno} {n.name} ({_length(n)} lines)" for path, n in _functions() if _length(n) > MAX_LINES
    ]
    assert not too_long, f"functions over {MAX_LINES} lines:\n" + "\n".join(too_long)


def test_at_most_a_few_functions_exceed_eighty_lines():
    long = [f"{path}:{n.lineno} {n.name} ({_length(n)} lines)" for path, n in _functions() if _length(n) > LONG_LINES]
    assert len(long) <= MAX_LONG, f"{len(long)} functions over {LONG_LINES} lines (at most {MAX_LONG}):\n" + "\n".join(
        long
    )


def test_no_function_but_a_click_command_takes_more_than_twelve_parameters():
    wide = [
        f"{path}:{n.lineno} {n.name} ({_parameters(n)} parameters)"
        for path, n in _functions()
        if _parameters(n) > MAX_PARAMETERS and not _is_click_command(n)
    ]
    assert not wide, f"functions over {MAX_PARAMETERS} parameters:\n" + "\n".join(wide)


def test_the_measure_counts_what_it_claims():
    """Hand-counted: a 3-line function with 2 parameters, a method whose self is not counted,
    and a click command recognised by its decorator."""
    source = (
        "def f(a, *, b):\n"
        "    x = a\n"
        "    return x + b\n"
        "class C:\n"
        "    def m(self, a, *rest, **kw):\n"
        "        pass\n"
        "@click.command()\n"
        "def cmd(a):\n"
        "    pass\n"
    )
    nodes = {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
    assert (_length(nodes["f"]), _parameters(nodes["f"])) == (3, 2)
    assert _parameters(nodes["m"]) == 3
    assert _is_click_command(nodes["cmd"]) and not _is_click_command(nodes["f"])
