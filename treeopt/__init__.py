"""treeopt: choose the static speculative-decoding tree that is fastest for your model, drafter,
serving engine, accelerator, batch size and context.

From Python (docs/python.md):

    import treeopt
    table = treeopt.load_accuracy("accuracy.json")
    tree = treeopt.build_tree(table, 16, method="optimal", engine="vllm")
    prediction = treeopt.predict("vicuna-7b", "h100-sxm", table, engine="vllm")
    selection = treeopt.select(prediction)

The names below come from `treeopt.api`, imported on first use, so that `import treeopt` (and
every `treeopt.<module>` import under it) stays cheap and loads no torch.
"""

from importlib import import_module

from treeopt.public_names import PUBLIC_NAMES
from treeopt.version import __version__

__all__ = ["__version__", *PUBLIC_NAMES]


def __getattr__(name):
    if name in PUBLIC_NAMES:
        return getattr(import_module("treeopt.api"), name)
    raise AttributeError(f"module 'treeopt' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(PUBLIC_NAMES))
