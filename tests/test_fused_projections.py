"""Fused projections (calibration.fused_projections, docs/decoder.md#fused-projections), on CPU
in float32: every part of a fused group returns what its own linear returned (biases present
or not, any call order, a new input recomputed, not a stale product); a fused model's logits
equal the separate model's, its parameters count the same; greedy tree decoding with it is
plain greedy decoding of the separate model (eager and static steps); the sweep records the
mode; a fused model cannot be asked to run separate."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from calibration.decoder import TreeDecoder
from calibration.fused_projections import fuse_projections, projection_mode, use_projections
from calibration.greedy import greedy_decode
from calibration.sweep import SweepSettings, run_sweep
from tests import test_decoder as decoder_tests
from treeopt.errors import UserError
from treeopt.tau import TauCurve
from treeopt.tree import make_tree

tiny = decoder_tests.tiny  # the tiny GQA Llama fixture (4 query heads, 2 KV heads)


class _Projections(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(6, 8), nn.Linear(6, 4, bias=False), nn.Linear(6, 4)
        self.gate_proj, self.up_proj = nn.Linear(6, 5, bias=False), nn.Linear(6, 5, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))


def test_every_part_returns_its_own_linears_output():
    module = _Projections()
    before = copy.deepcopy(module)
    assert fuse_projections(module) == 2 and projection_mode(module) == "fused"
    assert projection_mode(before) == "separate"
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    names = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    for order in (names, names[::-1]):
        for name in order:
            torch.testing.assert_close(getattr(module, name)(x), getattr(before, name)(x), atol=1e-6, rtol=0)
    # a part called on another input than the product's: computed anew, not a stale slice
    module.q_proj(x)
    torch.testing.assert_close(module.k_proj(y), before.k_proj(y), atol=1e-6, rtol=0)
    module.gate_proj(x)
    torch.testing.assert_close(module.up_proj(y), before.up_proj(y), atol=1e-6, rtol=0)
    # the first part computes anew even on the same tensor, changed in place since
    module.q_proj(x)
    x.add_(1.0)
    torch.testing.assert_close(module.q_proj(x), before.q_proj(x), atol=1e-6, rtol=0)

    def weights(m):
        return sum(p.numel() for name, p in m.named_parameters() if name.endswith("weight"))

    assert weights(module) == weights(before)  # no weight held twice


def test_a_fused_models_logits_and_decoding_equal_the_separate_models(tiny):
    _, lm = tiny
    separate = lm.model
    fused = copy.deepcopy(separate)
    assert use_projections(fused, "fused", "cpu") == "fused"
    assert fuse_projections(fused) == 0  # already fused: nothing more
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in separate.parameters())
    ids, mask = decoder_tests.ragged_batch([5, 9, 2], seed=6)
    with torch.inference_mode():
        want = separate(input_ids=ids, attention_mask=mask).logits
        got = fused(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    ref = greedy_decode(separate, ids, mask, max_new_tokens=12)
    tree = make_tree(decoder_tests.DESIGN_EXAMPLE)
    for graphs in (False, True):
        assert TreeDecoder(fused, lm.heads, tree, graphs=graphs).generate(ids, mask, max_new_tokens=12).tokens == ref
    with pytest.raises(UserError, match="already fused"):
        use_projections(fused, "separate", "cpu")
    with pytest.raises(UserError, match="projections: must be one of fused, separate"):
        use_projections(separate, "merged", "cpu")


def test_the_sweep_records_the_projections(tiny, tmp_path):
    _, lm = tiny
    lm = copy.copy(lm)
    lm.model = copy.deepcopy(lm.model)
    proposal = make_tree(decoder_tests.DESIGN_EXAMPLE)
    tau = TauCurve(proposal, 1.0 + 0.1 * np.arange(proposal.size + 1))
    out = tmp_path / "s.csv"
    run_sweep(lm, tau, SweepSettings((0, 2), (1,), (5,), repeats=5, warmup=0, projections="fused"), out, progress=False)
    assert json.loads((tmp_path / "s.meta.json").read_text())["projections"] == "fused"
    assert projection_mode(lm.model) == "fused"
