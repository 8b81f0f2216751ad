"""The `treeopt` console script and `python -m treeopt`: Ctrl-C while the command line starts
said in one line too.

The console script names `main` here, not `treeopt.cli.main`: a script that imports the
command line before calling it would meet a Ctrl-C during those imports (click, the option
modules: the first ~0.3 s) with Python's traceback, outside every handler. This module imports
nothing but `sys` (and `treeopt/__init__.py`, which loads its names lazily), so the handler
below covers all of it (docs/formats.md#output-safety)."""

import sys


def main() -> None:
    try:
        # here, not at the top, so that a Ctrl-C during these imports meets the handler below
        from treeopt.cli import main as command_line
    except KeyboardInterrupt:  # pressed while the command line imports
        print("treeopt: interrupted", file=sys.stderr)
        sys.exit(130)
    command_line()


if __name__ == "__main__":
    main()
