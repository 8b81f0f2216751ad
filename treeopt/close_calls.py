"""Close calls of a predicted grid (docs/performance-model.md#close-calls): per (batch, context),
the two calls a prediction makes from the model alone, speculation or plain decoding, and a
chain or a tree, each between the best configuration of either kind, and whether the model can
make it at all.

The step-cost model's resolution is data: the 90th percentile of its held-out errors on the
ratio of two configurations' steps at one batch (roofline/data/call_resolution.json, recomputed
by benchmarks/bench_published_steps.py). The caller passes it in. Where the two best
configurations are predicted closer per token than that, the call is a close call: the model
cannot separate them, and they have to be measured.

Cost per token is T(n) / tau(n), so the ratio of two configurations' costs per token is the
inverse ratio of their speedups (plain decoding: speedup 1). A chain is a prefix of the nested
proposal up to its first branching node (`treeopt.chain_or_tree.chain_prefix_length`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["MEASURE_BOTH", "close_calls", "format_close_calls"]

#: how to settle a close call: measure both configurations
MEASURE_BOTH = (
    "measure both: `treeopt sweep` with the model on this machine, or each configuration in the engine "
    "with its runs given to `treeopt hw fit --measurements`"
)


def _pair(one: tuple[str, int, float], other: tuple[str, int, float], resolution: float) -> dict:
    """The call between the best of two kinds, each (kind, nodes, speedup): the pick (the higher
    speedup, the lower cost per token), how far apart they are per token (the dearer's cost over
    the cheaper's, minus 1) and whether that is within the resolution."""
    pick, rest = (one, other) if one[2] >= other[2] else (other, one)
    gap = pick[2] / rest[2] - 1.0
    return {
        "pick": pick[0],
        "other": rest[0],
        "nodes": {pick[0]: pick[1], rest[0]: rest[1]},
        "speedup": {pick[0]: round(pick[2], 4), rest[0]: round(rest[2], 4)},
        "gap": round(gap, 4),
        "close": bool(gap < resolution),
    }


def close_calls(grid: pd.DataFrame, chain_nodes: int, resolution: float) -> list[dict]:
    """Per (batch, context) of a predicted `grid` (batch, context, nodes, speedup; NaN speedup
    where a size does not fit or is not drafted) where any speculative size is priced: `on_off`,
    the best speculative size against plain decoding, and where the grid holds both a chain (1
    to `chain_nodes` nodes) and a tree (more), `chain_or_tree`, the best chain against the best
    tree; each with its pick, the per-token gap and `close` (gap below `resolution`, a fraction)."""
    cells = []
    for (batch, context), rows in grid.groupby(["batch", "context"], sort=True):
        nodes = rows["nodes"].to_numpy(dtype=int)
        speed = rows["speedup"].to_numpy(dtype=float)
        priced = np.isfinite(speed)
        plain = priced & (nodes == 0)
        spec = priced & (nodes > 0)
        if not plain.any() or not spec.any():
            continue
        cell = {"batch": int(batch), "context": int(context)}
        cell["on_off"] = _pair(
            ("speculation", *_best(nodes, speed, spec)), ("plain", 0, float(speed[plain][0])), resolution
        )
        chain, tree = spec & (nodes <= chain_nodes), spec & (nodes > chain_nodes)
        if chain.any() and tree.any():
            cell["chain_or_tree"] = _pair(
                ("chain", *_best(nodes, speed, chain)), ("tree", *_best(nodes, speed, tree)), resolution
            )
        cells.append(cell)
    return cells


def _best(nodes: np.ndarray, speed: np.ndarray, where: np.ndarray) -> tuple[int, float]:
    i = int(np.flatnonzero(where)[np.argmax(speed[where])])
    return int(nodes[i]), float(speed[i])


def _side(call: dict, kind: str) -> str:
    count = call["nodes"][kind]
    nodes = f" {count} node{'s' if count != 1 else ''}" if kind != "plain" else ""
    return f"{kind}{nodes} {call['speedup'][kind]:.2f}x"


def format_close_calls(section: dict) -> str:
    """The close calls for people: a header with the resolution and how to settle them, then one
    line per batch and call (on/off; chain or tree) listing its close contexts; the chain-or-tree
    call only where the pick is to speculate or the on/off call is close too (where plain
    decoding wins clearly, the draft's shape does not matter). Empty when there is none."""
    lines: dict[tuple[int, str], list[str]] = {}
    for cell in section["cells"]:
        on_off, chain_tree = cell["on_off"], cell.get("chain_or_tree")
        shown = [("on or off", on_off)] if on_off["close"] else []
        if chain_tree is not None and chain_tree["close"] and (on_off["pick"] == "speculation" or on_off["close"]):
            shown.append(("chain or tree", chain_tree))
        for what, call in shown:
            text = f"context {cell['context']} {_side(call, call['pick'])} ~ {_side(call, call['other'])}"
            lines.setdefault((cell["batch"], what), []).append(text)
    if not lines:
        return ""
    head = (
        f"close calls, within ±{section['resolution'] * 100:.1f}% per token (the model cannot separate them; "
        f"docs/performance-model.md#close-calls); {MEASURE_BOTH}:"
    )
    return "\n".join([head] + [f"  batch {b:4d}, {what}: " + "; ".join(t) for (b, what), t in lines.items()])
