"""Fused projections built from a loaded model's weights: one GEMM for an attention layer's
q, k and v projections and one for an MLP's gate and up projections, as engines run them
(vLLM's QKVParallelLinear and MergedColumnParallelLinear; docs/decoder.md#fused-projections).

`fuse_projections(model)` replaces, in every module that has them, the q/k/v (and gate/up)
`nn.Linear`s by parts of one fused linear: the first part called computes the fused GEMM
(weights concatenated along the output features, biases alike) and every part returns its
slice of that output. The model's own forward code is untouched: it still calls q_proj, k_proj
and v_proj in turn, and each gets its columns of the one product. A part called with another
input than the one the product was computed from computes it again, so any call order is
exact. The parts' weights are views of the fused weight: no memory is added.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from treeopt.errors import UserError

__all__ = [
    "DEFAULT_PROJECTIONS",
    "FUSED_GROUPS",
    "PROJECTION_MODES",
    "default_projections",
    "fuse_projections",
    "projection_mode",
    "use_projections",
]

#: the projections fused together, in the order the model's forward calls them
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
#: how a model's projections run (`--projections`)
PROJECTION_MODES = ("fused", "separate")
#: the default by device type (docs/decoder.md#fused-projections): fused on CUDA, as engines
#: run them; separate elsewhere (on a CPU the demo model's steps timed the same either way)
DEFAULT_PROJECTIONS = {"cuda": "fused"}


class _FusedLinear(nn.Module):
    """The fused weight (sum of the parts' out features, in features) and bias, and the last
    product with the input it was computed from (dropped by the last part)."""

    def __init__(self, linears: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.cat([lin.weight.detach() for lin in linears]), requires_grad=False)
        biases = [lin.bias for lin in linears]
        self.bias = None
        if any(b is not None for b in biases):
            parts = [
                b.detach() if b is not None else lin.weight.new_zeros(lin.out_features)
                for b, lin in zip(biases, linears)
            ]
            self.bias = nn.Parameter(torch.cat(parts), requires_grad=False)
        self._input = self._output = None

    def product(self, x: torch.Tensor, fresh: bool) -> torch.Tensor:
        if fresh or x is not self._input:
            self._input, self._output = x, F.linear(x, self.weight, self.bias)
        return self._output

    def release(self) -> None:
        self._input = self._output = None


class _Part(nn.Module):
    """One projection of a fused group: columns start..end of the fused product. `first`: the
    part the forward calls first computes the product anew; `last`: drops it after use."""

    def __init__(self, fused: _FusedLinear, start: int, end: int, first: bool, last: bool):
        super().__init__()
        self.fused = [fused]  # a list: not a submodule of its own (its parameters counted once)
        self.start, self.end, self.first, self.last = start, end, first, last
        self.in_features, self.out_features = fused.weight.shape[1], end - start

    @property
    def weight(self) -> torch.Tensor:
        return self.fused[0].weight[self.start : self.end]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.fused[0]
        out = fused.product(x, self.first)[..., self.start : self.end]
        if self.last:
            fused.release()
        return out


def _fuse_group(module: nn.Module, names: tuple[str, ...]) -> bool:
    linears = [getattr(module, name, None) for name in names]
    if not all(isinstance(lin, nn.Linear) for lin in linears):
        return False
    fused = _FusedLinear(linears)
    module.add_module("_fused_" + "_".join(n.split("_")[0] for n in names), fused)
    start = 0
    for i, (name, lin) in enumerate(zip(names, linears)):
        end = start + lin.out_features
        setattr(module, name, _Part(fused, start, end, first=i == 0, last=i == len(names) - 1))
        start = end
    return True


@torch.no_grad()
def fuse_projections(model: nn.Module) -> int:
    """Fuse every module's q/k/v and gate/up linears in place (module docstring); returns how
    many groups were fused (0: the model has none in that layout, it runs as it was)."""
    count = 0
    for module in list(model.modules()):
        for names in FUSED_GROUPS:
            count += _fuse_group(module, names)
    return count


def projection_mode(model: nn.Module) -> str:
    """ "fused" where `fuse_projections` fused a group of `model`, else "separate"."""
    return "fused" if any(isinstance(m, _FusedLinear) for m in model.modules()) else "separate"


def default_projections(device) -> str:
    return DEFAULT_PROJECTIONS.get(torch.device(device).type, "separate")


def use_projections(model: nn.Module, mode: str | None, device) -> str:
    """Run `model`'s projections as `mode` says ("fused", "separate"; None: the device's
    default), fusing them in place if need be; returns the mode the model now runs in. A model
    already fused cannot run separate again (load it anew)."""
    mode = mode or default_projections(device)
    if mode not in PROJECTION_MODES:
        raise UserError(f"projections: must be one of {', '.join(PROJECTION_MODES)}, got {mode!r}")
    if mode == "fused":
        fuse_projections(model)
    elif projection_mode(model) == "fused":
        raise UserError("projections: the model's projections are already fused; load it again to run them separate")
    return projection_mode(model)
