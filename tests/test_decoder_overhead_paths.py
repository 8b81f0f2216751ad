"""The shortcuts that keep the reference decoder's own work per step small
(benchmarks/bench_decoder.py): the one-sequence branch of `KVCache.keep_slots`, the static
mask's refill only after a narrower step, and the decoder's kept index range, grown past its
tree's size for a wider batch."""

from __future__ import annotations

import torch

from calibration.decoder import TreeDecoder
from calibration.greedy import greedy_decode
from calibration.heads import MedusaHeads
from calibration.kv_cache import KVCache
from calibration.models import load_model, tiny_model_for_tests
from calibration.static_steps import StaticInputs
from treeopt.tree import make_tree


def _filled_cache(b: int, slots: int) -> KVCache:
    cache = KVCache(num_layers=2)
    for layer in range(2):
        keys = torch.randn(b, 2, slots, 3)
        cache.update(keys, keys + 100, layer)
    return cache


def test_keep_slots_of_one_sequence_equals_the_batched_gather():
    """b == 1 takes index_select; it moves exactly what the gather of b > 1 moves, repeated and
    overlapping slots included."""
    torch.manual_seed(0)
    single, pair = _filled_cache(1, 9), _filled_cache(2, 9)
    pair.buffer[:, :, 1] = single.buffer[:, :, 0]  # row 1 of the pair is the single sequence
    before = single.buffer.clone()
    slots = torch.tensor([[4, 6, 6, 8]])
    single.keep_slots(5, slots)
    pair.keep_slots(5, torch.cat([torch.tensor([[0, 1, 2, 3]]), slots]))
    assert single.length == pair.length == 9
    assert torch.equal(single.buffer[:, :, 0, :, :9], pair.buffer[:, :, 1, :, :9])
    assert torch.equal(single.buffer[..., 5:9, :], before[..., [4, 6, 6, 8], :])
    assert torch.equal(single.buffer[..., :5, :], before[..., :5, :])


def test_static_mask_hides_what_any_earlier_wider_step_left():
    """The static mask is refilled only past a narrower width than the last one: widths up and
    down leave no stale slot visible and hide none of the step's own."""
    neg = torch.finfo(torch.float32).min
    inputs = StaticInputs(1, 2, 10, torch.float32, torch.device("cpu"))
    tokens, positions = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long)
    for width in (4, 9, 6, 6, 3, 10, 2):
        inputs.load(tokens, positions, torch.zeros(1, 1, 2, width), 0)
        assert (inputs.mask[..., :width] == 0).all() and (inputs.mask[..., width:] == neg).all(), width


def test_batches_wider_than_the_tree_decode_losslessly(tmp_path):
    """The decoder's kept index range starts at its tree's size (q = 1 for the empty tree) and
    grows for a larger batch: greedy tree decoding still equals plain greedy decoding."""
    path = tiny_model_for_tests(tmp_path, vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, num_medusa_heads=2)
    lm = load_model(str(path), device="cpu", dtype="float32")
    assert isinstance(lm.heads, MedusaHeads)
    ids = torch.randint(3, 64, (4, 7), generator=torch.Generator().manual_seed(1))
    plain = greedy_decode(lm.model, ids, max_new_tokens=6)
    for tree in (make_tree([], allow_empty=True), make_tree([[0], [1], [0, 0]])):
        res = TreeDecoder(lm.model, lm.heads, tree, graphs=False).generate(ids, max_new_tokens=6)
        assert res.tokens == plain, tree.paths
