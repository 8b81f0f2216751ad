"""The drafter interface: what the calibration runner and the reference decoder ask of any
drafter (docs/decoder.md#drafters).

A drafter guesses the tokens after the base model's next token (the root), one depth at a
time. Its per-node state is a tuple of tensors whose first dimension indexes nodes (or
positions): the calibration and the decoder only ever select, repeat and concatenate rows, so a
drafter may keep there whatever it needs (a hidden state, the embeddings of the path, the
previous stage's state and token, or the slots of a cache of its own).

- ``begin(hidden, root)``: the state of the root node from the base model's last hidden state
  at the token that produced the root, and the root token;
- ``depth_logits(state, depth)``: logits (N, V) over the node's children at ``depth`` (0-based:
  depth 0 are the root's children), and the carry its children's states are made from;
- ``child_state(carry, depth, tokens)``: the states of children with these tokens (rows of
  ``carry`` already selected per child).

``sequential`` says whether a child's logits depend on the path (Hydra, MLP speculator) or
not (Medusa: every node of a depth gets the same guesses, so one call on the root serves the
whole depth).
"""

from __future__ import annotations

from typing import ClassVar

import torch

DraftState = tuple[torch.Tensor, ...]


def select_rows(state: DraftState, rows: torch.Tensor) -> DraftState:
    """The rows `rows` of every tensor of a state (repeats allowed)."""
    return tuple(t[rows] for t in state)


class Drafter:
    """Mixin for a draft module (a `torch.nn.Module` subclass) that drafts depth by depth.

    Attributes every drafter has: ``kind`` (one of `treeopt.layout.DRAFTER_KINDS`), ``sequential``,
    ``num_heads`` (the deepest depth it drafts), ``hidden_size`` (of the base model) and
    ``vocab_size``.
    """

    kind: ClassVar[str] = ""
    sequential: ClassVar[bool] = True

    def begin(self, hidden: torch.Tensor, root: torch.Tensor) -> DraftState:
        raise NotImplementedError

    def depth_logits(self, state: DraftState, depth: int) -> tuple[torch.Tensor, DraftState]:
        raise NotImplementedError

    def child_state(self, carry: DraftState, depth: int, tokens: torch.Tensor) -> DraftState:
        raise NotImplementedError

    def teacher_forced_logits(self, hidden: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """Logits (N, D, V) of depths 0..D-1 along given paths: `hidden` (N, h) the base
        hidden state, `path` (N, D) the root then the true tokens of depths 0..D-2. Depth d
        sees the true path up to d - 1 (docs/statistics.md#dependent-drafters)."""
        state = self.begin(hidden, path[:, 0])
        out = []
        for d in range(path.shape[1]):
            logits, carry = self.depth_logits(state, d)
            out.append(logits)
            if d + 1 < path.shape[1]:
                state = self.child_state(carry, d, path[:, d + 1])
        return torch.stack(out, 1)
