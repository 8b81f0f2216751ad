"""One (batch, context) group of the measured sweep made ready to time: a KV cache of `context`
random tokens per sequence and one closure per tree size that runs exactly one decoding step
on it and crops it back (`step_bench`; the timing itself is `calibration.sweep.measure_group`).
What each size's step is: the module doc of `calibration.sweep`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from calibration.decoder import TreeDecoder
from calibration.greedy import plain_step_forward
from calibration.kv_cache import new_cache
from calibration.model_calls import model_forward_hidden, synchronizer, uses_gqa
from calibration.speculative import SpeculativeDecoder
from calibration.static_steps import StepRunner, graphs_enabled, uses_static
from treeopt.errors import UserError
from treeopt.tree import Tree


def effective_sizes(sizes, proposal: Tree) -> list[int]:
    """The tree sizes measured: 0 always, sizes beyond the proposal tree replaced by its size."""
    return sorted({min(int(n), proposal.size) for n in sizes} | {0})


# ---- one group: a cache and one closure per tree size ---------------------------------------


@dataclass
class StepBench:
    """What `measure_group` times for one (batch, context): `fns[i]` runs one decoding step of
    tree size `sizes[i]` (sizes[0] = 0, the plain step) on `cache` and crops it back.

    cache:       `calibration.kv_cache.KVCache` holding `context` random tokens per sequence
                 (`context_ids`), with room for the largest step.
    valid:       (b, context) bool, all True (the cache slots each sequence sees).
    positions:   (b,) int64, the root's position id (= context).
    inputs:      size -> the token ids fed: (b, 1) for 0, (b, n + 1) tree tokens otherwise.
    decoders:    size -> the TreeDecoder whose `verify_forward` is timed (sizes > 0), in the
                 sweep's verification form.
    runners:     size -> the `StepRunner` of the size's forward where it runs in static shapes
                 (the plain step's and each decoder's).
    """

    sizes: list[int]
    fns: list[Callable[[], None]]
    cache: object
    context_ids: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    inputs: dict = field(default_factory=dict)
    decoders: dict = field(default_factory=dict)
    runners: dict = field(default_factory=dict)

    @property
    def context(self) -> int:
        return int(self.context_ids.shape[1])

    def cached_tokens(self) -> int:
        """Tokens in the cache, checked to be the same in every layer's keys and values."""
        lengths = {t.shape[-2] for layer in self.cache.layers for t in (layer.keys, layer.values)}
        if len(lengths) != 1:
            raise RuntimeError(f"sweep: cache layers disagree on their length: {sorted(lengths)}")
        return lengths.pop()


def check_form(drafter, verification: str) -> None:
    """UserError when `drafter` cannot be verified in the `verification` form: a draft model's
    decoder (`SpeculativeDecoder`) verifies its chain, one candidate, as a tree only."""
    if verification != "tree" and getattr(drafter, "kind", "") == "draft-model":
        raise UserError(
            f"--verification {verification}: a draft model drafts a chain, one candidate, verified "
            "in the tree form (use --verification tree)"
        )


def step_bench(
    lm,
    proposal: Tree,
    sizes,
    batch: int,
    context: int,
    *,
    topk: int = 10,
    seed: int = 0,
    verification: str = "tree",
    graphs: bool | None = None,
    attention: str | None = None,
    drafting: str | None = None,
) -> StepBench:
    """Build the cache of `context` random tokens for `batch` sequences and one closure per
    tree size (0 first) running exactly one decoding step's model work in the `verification`
    form, then undoing its cache append. The closures wait for the device (`synchronizer`) on an accelerator.

    `graphs` (docs/decoder.md#static-shape-steps): True (and None on CUDA), every step's
    forward in static shapes over exactly the context and its new tokens (window = context +
    q), captured once per (batch, context, size) and replayed on CUDA; else the eager forward
    (the plain step through the library's 2D-mask path). `attention`: the verification
    attention (`TreeDecoder`'s; docs/decoder.md#split-verification-attention). `drafting`:
    "captured" times the whole step, acceptance, cache keep and next draft included
    (docs/decoder.md#captured-drafting); a draft model's steps always draft separately."""
    sizes = sorted(set(int(n) for n in sizes) | {0})
    model, heads, device = lm.model, lm.heads, lm.device
    vocab = heads.vocab_size
    gen = torch.Generator().manual_seed(seed)
    context_ids = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
    check_form(heads, verification)
    if getattr(heads, "kind", "") == "draft-model":
        return _draft_model_bench(lm, proposal, sizes, context_ids, graphs, attention)
    cache = new_cache(model, capacity=context + max(sizes) + 1)
    with torch.inference_mode():
        model_forward_hidden(
            model,
            context_ids,
            attention_mask=torch.ones_like(context_ids),
            position_ids=torch.arange(context, device=device).expand(batch, -1),
            cache=cache,
        )
    valid = torch.ones(batch, context, dtype=torch.bool, device=device)
    positions = torch.full((batch,), context, dtype=torch.long, device=device)
    sync = synchronizer(device)
    bench = StepBench(sizes, [], cache, context_ids, valid, positions)
    options = {"topk": topk, "verification": verification, "graphs": graphs, "attention": attention}
    options["drafting"] = drafting
    for n in sizes:
        if n == 0:
            _add_plain_step(bench, model, heads, torch.randint(0, vocab, (batch, 1), generator=gen), graphs, sync)
            continue
        decoder = TreeDecoder(model, heads, proposal.prefix(n), timing=False, bucket=1, **options)
        tokens = torch.randint(0, vocab, (batch, n + 1), generator=gen).to(device)

        def tree_step(decoder=decoder, tokens=tokens):
            decoder.verify_forward(cache, tokens, valid, positions)
            cache.crop(-decoder.verify_appends)
            sync()

        bench.inputs[n] = tokens
        bench.decoders[n] = decoder
        if decoder.runner is not None:
            bench.runners[n] = decoder.runner
        bench.fns.append(tree_step)
    return bench


def _add_plain_step(bench: StepBench, model, heads, token: torch.Tensor, graphs: bool | None, sync) -> None:
    """The plain step (one token's forward and the lm_head on `bench`'s cache, cropped back)
    as `bench`'s first closure: in static shapes where `graphs` says, else the library's
    2D-mask path (`plain_step_forward`)."""
    cache, device = bench.cache, bench.context_ids.device
    batch, context = bench.context_ids.shape
    token, pos = token.to(device), bench.positions[:, None]
    mask = torch.ones(batch, context + 1, dtype=torch.long, device=device)
    if uses_static(graphs, device):
        # the plain step in static shapes: its forward and lm_head, as plain_step_forward
        runner = bench.runners[0] = _plain_runner(model, device, graphs)
        mask = torch.zeros((batch, 1, 1, context + 1), dtype=cache.buffer.dtype, device=device)

        def plain():
            runner(cache, token, mask, pos)
            cache.crop(-1)
            sync()
    else:

        def plain():
            plain_step_forward(model, heads, cache, token, mask, pos, num_heads=0)
            cache.crop(-1)
            sync()

    bench.inputs[0] = token
    bench.fns.append(plain)


def _plain_runner(model, device, graphs: bool | None) -> StepRunner:
    """The static-shape runner of the sweep's plain step (window = context + 1)."""
    return StepRunner(
        model,
        force_gqa=torch.device(device).type == "cpu" and uses_gqa(model),
        graphs=graphs_enabled(graphs, device),
        bucket=1,
    )


def _draft_model_bench(
    lm,
    proposal: Tree,
    sizes: list[int],
    context_ids: torch.Tensor,
    graphs: bool | None = None,
    attention: str | None = None,
) -> StepBench:
    """`step_bench` for a draft model: size n > 0 times `SpeculativeDecoder.step_work` (the
    draft's passes over the tree, then the target's verification), size 0 plain decoding; both
    models hold the `context` tokens in caches of their own. `graphs` False: the target's
    verification runs eagerly too (the draft's passes always do)."""
    batch, context = context_ids.shape
    device = lm.device
    sync = synchronizer(device)
    decoders = {
        n: SpeculativeDecoder(lm.model, lm.heads, proposal.prefix(n), timing=False, attention=attention) for n in sizes
    }
    if not uses_static(graphs, device):
        for decoder in decoders.values():
            decoder.td.runner = None  # the eager forward (TreeDecoder._forward)
    state = decoders[0].prefill(context_ids, capacity=context + max(sizes) + 2)
    ts = state.target
    bench = StepBench(sizes, [], ts.cache, context_ids, ts.valid, ts.next_pos)
    for n in sizes:
        if n == 0:
            token, pos = ts.root[:, None], ts.next_pos[:, None]
            mask = torch.ones(batch, context + 1, dtype=torch.long, device=device)

            def plain(token=token, mask=mask, pos=pos):
                plain_step_forward(lm.model, lm.heads, ts.cache, token, mask, pos, num_heads=0)
                ts.cache.crop(-1)
                sync()

            bench.inputs[0] = token
            bench.fns.append(plain)
        else:

            def spec_step(decoder=decoders[n]):
                decoder.step_work(state)
                sync()

            bench.inputs[n] = ts.root[:, None]
            bench.decoders[n] = decoders[n].td
            bench.fns.append(spec_step)
    return bench
