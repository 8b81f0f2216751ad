"""Chain or tree, per (batch, context): for an engine release that drafts both, the best chain
the sweep (or grid) holds, the tree the selection ships, and whether the tree pays
(docs/engines.md#chain-or-tree).

A chain is a tree with one node per depth, all rank 0. The proposal's sizes are nested, so its
first N sizes are chains up to the first node that branches: those are the chains measured.
In a measured cell the selection already compared every size by the paired rule
(docs/statistics.md#choosing-a-tree-with-intervals) and ships the smallest size within the
tolerance of the best; the chains are the smallest sizes, so a shipped tree that is not a
chain means no measured chain was shown within the tolerance at the lower bound of its paired
ratio: the tree pays by the selection's rule. A shipped chain means it does not (by more than
the tolerance); an undecided cell says so. A predicted cell compares
the point speedups.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["chain_prefix_length", "chain_or_tree", "format_chain_or_tree"]

#: releases that draft a tree but verify it as a chain: a tree there pays at most its first chain
_CHAIN_VERIFIED = "vllm@0.20"


def chain_prefix_length(proposal) -> int:
    """The largest n such that the proposal's first n nodes are a chain ([0], [0, 0], ...)."""
    n = 0
    for path in proposal.paths:
        if len(path) != n + 1 or any(path):
            break
        n += 1
    return n


def _number(value) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else round(float(value), 4)


def chain_or_tree(selection, grid, proposal, engine=None) -> dict | None:
    """Per cell of `selection` (a typed Selection): `chain` (its nodes, speedup and interval
    where the `grid` has speedup_lo/hi), `tree` (the shipped tree) and `tree_pays` ("yes", "no",
    "undecided" or why not). `grid`: rows batch, context, nodes, speedup and, where measured by
    step latency, speedup_lo/hi (`treeopt.mix.mix_grid_from_sweep`), or a predicted grid. None
    where there is nothing to compare: the engine drafts chains only, or the proposal has no
    chain or no tree beyond its chains."""
    if engine is not None and engine.max_children == 1:
        return None
    longest = chain_prefix_length(proposal)
    if longest == 0 or longest == proposal.size:
        return None
    cells = []
    for c in selection.cells:
        rows = grid[(grid["batch"] == c.batch) & (grid["context"] == c.context)]
        chains = rows[(rows["nodes"] > 0) & (rows["nodes"] <= longest)]
        speed = chains["speedup"].to_numpy(dtype=float)
        if not np.isfinite(speed).any():
            continue
        best = chains.iloc[int(np.nanargmax(speed))]
        chain = {"nodes": int(best["nodes"]), "speedup": _number(best["speedup"])}
        if "speedup_lo" in rows.columns:
            chain |= {"speedup_lo": _number(best["speedup_lo"]), "speedup_hi": _number(best["speedup_hi"])}
        tree = {"nodes": int(c.nodes), "speedup": _number(c.speedup)}
        if c.speedup_lo is not None and c.nodes:
            tree |= {"speedup_lo": _number(c.speedup_lo), "speedup_hi": _number(c.speedup_hi)}
        cells.append(
            {
                "batch": c.batch,
                "context": c.context,
                "chain": chain,
                "tree": tree,
                "tree_pays": _pays(c, chain, longest, engine),
            }
        )
    if not cells:
        return None
    return {
        "engine": engine.name if engine is not None else None,
        "chain_nodes_measured": longest,
        "cells": cells,
    }


def _pays(cell, chain: dict, longest: int, engine) -> str:
    if engine is not None and engine.name == _CHAIN_VERIFIED:
        return "no: vLLM <= 0.20 verifies the flattened tree as a chain"
    if not cell.nodes:
        return "no: plain decoding is the pick"
    if cell.nodes <= longest:
        return "no: the chain is the pick"
    if cell.reason == "undecided":
        return "undecided"
    if cell.reason is None:  # predicted: the point speedups
        return "yes" if (cell.speedup or 0) > (chain["speedup"] or 0) else "no"
    # why (docs/engines.md#chain-or-tree): the selection ships the smallest size shown within its
    # tolerance of the best; a chain is smaller, so none was shown within it
    return "yes: no measured chain is within the selection's tolerance of it at the paired lower bound"


def _span(part: dict) -> str:
    text = (
        f"{part['nodes']} nodes {part['speedup']:.2f}x" if part["speedup"] is not None else f"{part['nodes']} nodes --"
    )
    if part.get("speedup_lo") is not None and part.get("speedup_hi") is not None:
        text += f" [{part['speedup_lo']:.2f}, {part['speedup_hi']:.2f}]"
    return text


def format_chain_or_tree(section: dict) -> str:
    """The section for people: one line per cell."""
    where = f" ({section['engine']})" if section.get("engine") else ""
    lines = [
        f"chain or tree per cell{where}: the best chain measured (chains of 1..{section['chain_nodes_measured']} "
        "nodes: the proposal's next node branches) against the tree shipped (docs/engines.md#chain-or-tree)"
    ]
    for c in section["cells"]:
        lines.append(
            f"  batch {c['batch']:4d}  context {c['context']:6d}: chain {_span(c['chain'])}, tree {_span(c['tree'])}: "
            f"tree pays: {c['tree_pays']}"
        )
    return "\n".join(lines)
