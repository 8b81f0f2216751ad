"""The version of treeopt, in a module of its own: the files treeopt writes record it, and
reading it must not load `treeopt/__init__.py`'s lazy API (docs/architecture.md#the-python-api).
tests/test_architecture.py checks it against pyproject.toml."""

__version__ = "0.1.0"
