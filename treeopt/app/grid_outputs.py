"""What `treeopt roofline speedup` makes of a predicted grid: the traffic mix's cells joined to
the grid's axes, the one tree chosen for the mix (docs/builders.md#one-tree-for-a-traffic-mix),
and the selection document (docs/formats.md#selections-treeoptselectionv1)."""

from __future__ import annotations

from dataclasses import replace

from roofline.published_checks import close_call_section as _close_call_section
from treeopt.app.prediction import Prediction
from treeopt.mix import ANY_CONTEXT, TrafficMix, choose_mix_tree, mix_section
from treeopt.selection import selection_from_grid
from treeopt.selection_types import MixSection, Selection

__all__ = ["close_call_section", "grid_selection", "mix_choice", "with_mix_cells"]


def with_mix_cells(batches, contexts, mix: TrafficMix | None):
    """The grid's batch sizes and contexts with every cell of `mix` among them (unchanged
    without a mix); an entry without a context takes the grid's."""
    if mix is None:
        return batches, contexts
    return sorted(set(batches) | set(mix.batch)), sorted(set(contexts) | {c for c in mix.context if c != ANY_CONTEXT})


def mix_choice(prediction: Prediction, mix: TrafficMix | None) -> MixSection | None:
    """The selection's "mix" section: the one tree of the proposal chosen for `mix` on the
    predicted grid (None without a mix)."""
    if mix is None:
        return None
    return mix_section(choose_mix_tree(prediction.grid, mix, source="the grid"), prediction.proposal, mix)


def grid_selection(prediction: Prediction, mix: MixSection | None) -> Selection:
    """The selection of a predicted grid, with the heads, attention and verification it was
    priced with and the mix section when there is one."""
    provenance = {
        "heads": prediction.draft_heads,
        "attention": prediction.attention,
        "verification": prediction.verification,
    }
    chosen = selection_from_grid(
        prediction.grid,
        prediction.proposal,
        prediction.hardware.name,
        prediction.model.name,
        provenance=provenance,
    )
    return replace(chosen, mix=mix)


def close_call_section(prediction: Prediction) -> dict:
    """The selection's "close_calls" section for a predicted grid
    (`roofline.published_checks.close_call_section`, docs/performance-model.md#close-calls)."""
    return _close_call_section(prediction.grid, prediction.proposal)
