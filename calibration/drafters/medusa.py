"""Medusa heads as a drafter: every head reads the same hidden state, so the path is ignored
(Medusa paper section 2.1.1)."""

from __future__ import annotations

import torch

from calibration.drafters.base import Drafter, DraftState
from calibration.heads import MedusaHeads


class MedusaDrafter(MedusaHeads, Drafter):
    """`MedusaHeads` (same layout, same loading) with the drafter interface."""

    kind = "medusa"
    sequential = False

    def begin(self, hidden: torch.Tensor, root: torch.Tensor) -> DraftState:
        return (hidden,)

    def depth_logits(self, state: DraftState, depth: int) -> tuple[torch.Tensor, DraftState]:
        return self[depth](state[0]), state

    def child_state(self, carry: DraftState, depth: int, tokens: torch.Tensor) -> DraftState:
        return carry
