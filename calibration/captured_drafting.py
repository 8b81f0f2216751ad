"""The whole speculative step in one static-shape function: verification, acceptance, the cache
keep and the next step's draft (docs/decoder.md#captured-drafting).

A `calibration.static_steps.StepRunner` runs the verification forward in static shapes (and
captures it as a CUDA graph on CUDA). With `DraftEpilogue` as its epilogue the same step, in the
same graph, goes on after the forward:

1. greedy acceptance of the tree tokens it verified (`TreeVerifier.accept`: the argmax at each
   parent, the cumulative product along the retrieve paths, the longest path, the bonus);
2. the cache keeps the accepted path over a fixed D + 1 slots (`KVCache.keep_static`);
3. the hidden state of the last accepted token, the drafter on it, the top-k and the next
   tree's tokens, written into the step's token buffer: the next call verifies them without
   copying anything in.

Every shape there is fixed by (batch, tree, window). Outside remains the accepted-length
bookkeeping (`TreeDecoder`): one host read of the longest accepted length to set the cache's
length, the validity mask and next positions, the emitted tokens, finished sequences leaving.
On a CPU the step runs as the same function, eagerly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from treeopt.errors import UserError

__all__ = ["DRAFTING_MODES", "CapturedStep", "DraftEpilogue", "captured_refusal", "drafting_mode"]

#: where a decoder drafts (`drafting_mode`): inside the static step, or as separate phases
DRAFTING_MODES = ("captured", "separate")


def captured_refusal(heads, verification: str) -> str | None:
    """Why drafting with `heads` cannot run inside the static step, or None. The step's shapes
    must not depend on how many tokens were accepted (docs/decoder.md#captured-drafting)."""
    if hasattr(heads, "read_context"):
        return (
            "an EAGLE draft appends the kept tokens' pairs to a cache of its own (as many as were accepted) "
            "and reads the base model's auxiliary layers, which the static step does not return"
        )
    if getattr(heads, "prefix_layer", False):
        return "Hydra++'s prefix layer appends the kept tokens to a cache of its own, as many as were accepted"
    if getattr(heads, "kind", "") == "draft-model":
        return "a draft model's first pass re-reads the tokens kept in the step before, as many as were accepted"
    if verification != "tree":
        return (
            "candidate verification copies the context into candidate rows and writes the chosen row back "
            "(not built inside the static step)"
        )
    return None


def drafting_mode(requested: str | None, *, refusal: str | None, static: bool, captured: bool) -> str:
    """The drafting mode a decoder runs: `requested` "captured" or "separate", or None: captured
    where steps are captured as CUDA graphs (`captured`) and the drafter allows it (`refusal`
    None), separate elsewhere. "captured" needs static-shape steps (`static`)."""
    if requested is not None and requested not in DRAFTING_MODES:
        raise UserError(f"--drafting: must be one of {', '.join(DRAFTING_MODES)}, got {requested!r}")
    if requested == "captured":
        if refusal is not None:
            raise UserError(f"--drafting captured: {refusal}")
        if not static:
            raise UserError("--drafting captured: needs static-shape steps (leave out --no-graphs)")
        return "captured"
    if requested is None and captured and refusal is None:
        return "captured"
    return "separate"


class CapturedStep(NamedTuple):
    """What a captured step returns besides the logits and hidden states: n_keep (b,) = 1 +
    accepted nodes; new (b, D + 1) the step's tokens (accepted nodes, then the bonus, valid up
    to n_keep); bonus (b,) the next root; hidden (b, h) the last accepted token's hidden state;
    draft (b, q) the next step's tree tokens (the step's own token buffer)."""

    n_keep: torch.Tensor
    new: torch.Tensor
    bonus: torch.Tensor
    hidden: torch.Tensor
    draft: torch.Tensor


class DraftEpilogue:
    """The work after the verification forward inside a static step (the module docstring), for
    a `TreeVerifier` and a drafting (`calibration.tree_drafting`); greedy acceptance only (a
    draw inside a graph would need its generator's state registered with the graph)."""

    def __init__(self, verifier, drafting):
        self.verifier, self.drafting = verifier, drafting

    def __call__(self, inputs, cache, logits: torch.Tensor, hidden: torch.Tensor) -> CapturedStep:
        tokens = inputs.tokens
        accepted = self.verifier.accept(tokens, logits)
        cache.keep_static(inputs.write, accepted.path)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        last_hidden = hidden[rows, accepted.last]  # why: the last accepted token drafts next (docs/decoder.md#the-step)
        new = torch.cat([tokens.gather(1, accepted.path[:, 1:]), accepted.bonus[:, None]], dim=1)
        new.scatter_(1, (accepted.n_keep - 1)[:, None], accepted.bonus[:, None])
        proposal = self.drafting.propose(last_hidden, accepted.bonus)
        # why: the next call verifies what this one drafted, never an earlier draft (a stale
        # captured draft, docs/decoder.md#captured-drafting): written into the buffer it reads
        tokens.copy_(self.drafting.tree_tokens(accepted.bonus, proposal))
        return CapturedStep(accepted.n_keep, new, accepted.bonus, last_hidden, tokens)
