"""The first section of a run's `index.md`: per (batch, context) what to ship (the line to
paste into an engine), why, and how sure the measurement is, before any of the evidence
(docs/architecture.md#the-run-report)."""

from __future__ import annotations

from treeopt.engines import Engine, export_for, get_engine
from treeopt.selection import best_bound_text, format_speedup, rounds_needed_text
from treeopt.tree import make_tree

#: without --engine, a tree is pasted as the `medusa_choices` list: the form the Medusa
#: reference code, Hydra's code and treeopt's decoder read, and the list TensorRT-LLM's
#: --medusa_choices takes (docs/engines.md#exports)
DEFAULT_TREE_FORM = "`medusa_choices`, the list the Medusa reference code, Hydra's code and treeopt's decoder read"
#: a draft model's chain of gamma drafts, without --engine: vLLM's draft-model proposer, the
#: engine that serves a separate draft model as a chain (docs/engines.md#drafters-and-engines)
DEFAULT_CHAIN_ENGINE = "vllm-draft-model"


def answer_section(selection, engine: Engine | None, *, heads: int, accuracy=None) -> list[str]:
    """`## The answer`: one table row per cell. `engine` the run's --engine (None: the default
    forms above), `heads` the drafter's heads (TensorRT-LLM's num_medusa_heads), `accuracy` the
    table's accuracy matrix (SGLang's flags are matched against it). `selection`: the
    `treeopt.selection/v1` document, or a typed Selection (read through its document)."""
    selection = selection.to_dict() if hasattr(selection, "to_dict") else selection
    forms = selection.get("forms")
    cells = forms["cells"] if forms else selection["cells"]
    main = {(c["batch"], c["context"]): c for c in selection["cells"]}
    if engine is not None:
        how = f"Lines for {engine.title} (`--engine {engine.name}`)."
    else:
        how = (
            f"No `--engine` was given: trees are shown as {DEFAULT_TREE_FORM}"
            + (f"; a draft model's chain as the `--engine {DEFAULT_CHAIN_ENGINE}` line" if forms else "")
            + ". Rerun with `--engine vllm`, `trtllm` or `sglang` for that engine's line (docs/engines.md)."
        )
    L = [
        "## The answer: what to ship per batch size",
        "",
        how,
        "",
        "| batch | context | ship | why | how sure |",
        "|---|---|---|---|---|",
    ]
    for c in cells:
        base = main.get((c["batch"], c["context"]), c)
        ship = _ship_text(c, engine, heads=heads, accuracy=accuracy)
        why, sure = _why_text(base, c, selection), _sure_text(c, base, selection)
        L.append(f"| {c['batch']} | {c['context']} | {ship} | {why} | {sure} |")
    return L + [""] + schedule_lines(selection.get("schedule"))


def schedule_lines(section: dict | None) -> list[str]:
    """The engine's per-batch schedule under the answer table (docs/engines.md#schedules): the
    one line to paste for every batch size, or why the engine takes none."""
    if section is None:
        return []
    if "note" in section:
        return [f"Per-batch schedule: none for `{section['engine']}`: {section['note']}.", ""]
    where = "the traffic mix's contexts" if section.get("contexts_from") == "mix" else "its contexts"
    contexts = ", ".join(map(str, section["contexts"]))
    if "triple" in section:
        who = "TensorRT-LLM (dynamic tree)" if "source" in section else "SGLang"
        L = [
            f"One {who} server runs one (steps, topk, draft tokens): for the whole traffic ({where} {contexts}, "
            f"mean speedup {section['mean_speedup']:.2f}x) `{section['line']}`; a separate deployment per batch "
            "range would run:",
            "",
        ]
        L += [f"- batch {s}-{e}: `{line}`" for s, e, _, line in section["per_range"]]
        return L + ([f"Note: {section['source']}.", ""] if "source" in section else [""])
    ranges = ", ".join(f"{s}-{e}: {k}" for s, e, k in section["ranges"])
    return [
        f"Per-batch schedule for `{section['engine']}` (batch sizes: draft length {ranges}; each batch size "
        f"drafts the shortest chain {where} ({contexts}) chose; docs/engines.md#schedules):",
        "",
        f"`{section['line']}`",
        "",
    ]


def _ship_text(cell: dict, engine: Engine | None, *, heads: int, accuracy) -> str:
    if not cell["nodes"]:
        return "no speculation"
    tree = make_tree(cell["medusa_choices"])
    form = cell.get("form", "tree")
    if engine is None:
        if form == "chain":
            return f"`{export_for(get_engine(DEFAULT_CHAIN_ENGINE), tree).line}`"
        return f"`medusa_choices = {cell['medusa_choices']}`"
    return f"`{export_for(engine, tree, heads=heads, accuracy=accuracy).line}`"


def _why_text(base: dict, cell: dict, selection: dict) -> str:
    """The reason in words, with the two readings that look like contradictions explained
    where they occur: a pooled-fit decision beside a different largest point, and a smaller
    tree shipped within the tolerance of a larger, faster one."""
    if "form" in cell:
        return f"{cell['form'] or 'no speculation'}: {cell['reason']}"
    reason = base.get("reason", "")
    n, best = base["nodes"], base.get("best_nodes")
    tolerance = selection.get("tolerance", 0.0)
    if base.get("decided_by") == "pooled fit":
        own = f"; this cell's own largest point speedup is at {_nodes(best)}" if best not in (None, n) else ""
        return f"the measurement alone could not decide; the profile fitted to every cell picks {n} nodes{own}"
    if reason == "best":
        return f"largest measured speedup ({_nodes(n)})" if n else "no tree beats plain decoding"
    if reason == "within-tolerance":
        return (
            f"the smallest tree within {tolerance:.0%} of the largest point speedup ({best} nodes): a larger tree "
            "may measure a little faster, but not by more than that at the lower bound of their paired ratio"
        )
    if reason == "best bound":
        return (
            "the sweep's rounds could not settle the answer; shipped: the tree whose worst paired lower bound "
            f"against every rival is the highest ({best_bound_text(base.get('bound'), base.get('open_nodes', ()))}; "
            f"{rounds_needed_text(base.get('rounds_needed'))})"
        )
    if reason == "no speculation":
        return "no tree beats plain decoding at its lower bound"
    if reason == "undecided":
        settle = rounds_needed_text(base.get("rounds_needed"))
        return f"undecided: another size may still be better by more than {tolerance:.0%} ({settle})"
    if reason == "unreliable":
        return "every tree failed the sanity checks (see the notes under the selection table)"
    return reason or "--"


def _nodes(n: int) -> str:
    return f"{n} node" + ("s" if n != 1 else "")


def _sure_text(cell: dict, base: dict, selection: dict) -> str:
    """The shipped speedup, its interval at the level the selection states, the rounds, and
    a word where the cell is noisy or its speedup is tau rather than a measurement."""
    if not cell["nodes"]:
        return "--"
    speed = format_speedup(cell.get("speedup"))
    if base.get("measured_speedup_missing") and cell.get("form", "tree") == "tree":
        speed = f"= τ {speed} (not measured: the plain step was the slower one)"
    span = ""
    if cell.get("speedup_lo") is not None:
        level = selection.get("interval_confidence", selection.get("confidence"))
        at = f" {level * 100:.4g}%" if level else ""
        span = f",{at} interval {cell['speedup_lo']:.2f}–{cell['speedup_hi']:.2f}"
    rounds = f", {base['rounds']} rounds" if base.get("rounds") else ""
    where = {"batch": cell["batch"], "context": cell["context"]}
    noisy = "; noisy (interval wider than ±10%)" if where in selection.get("noisy", []) else ""
    return f"{speed}{span}{rounds}{noisy}"


def chain_or_tree_markdown(section: dict) -> list[str]:
    """Per cell the best measured chain, the tree shipped and whether the tree pays
    (`treeopt.chain_or_tree`, docs/engines.md#chain-or-tree)."""

    def span(part: dict) -> str:
        text = f"{part['nodes']} nodes, {format_speedup(part['speedup'])}"
        if part.get("speedup_lo") is not None and part.get("speedup_hi") is not None:
            text += f" ({part['speedup_lo']:.2f}–{part['speedup_hi']:.2f})"
        return text

    L = [
        "",
        f"Chain or tree: the best chain measured (chains of 1 to {section['chain_nodes_measured']} nodes, where the "
        "proposal's next node branches) against the tree shipped; a tree pays where no chain came within the "
        "selection's tolerance (docs/engines.md#chain-or-tree):",
        "",
        "| batch | context | best chain | tree shipped | tree pays |",
        "|---|---|---|---|---|",
    ]
    for c in section["cells"]:
        L.append(f"| {c['batch']} | {c['context']} | {span(c['chain'])} | {span(c['tree'])} | {c['tree_pays']} |")
    return L
