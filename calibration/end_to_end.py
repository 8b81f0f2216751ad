"""The real decoder end to end on prompts, beside the sweep's step latencies (`treeopt sweep
--end-to-end`): prompts batched with left padding, decoded by plain greedy decoding and by each
tree, tokens per second and per step measured (docs/formats.md#sweep-csv-and-namemetajson-treeoptsweepv1)."""

from __future__ import annotations

import contextlib
import random
import sys
import time

import pandas as pd
import torch
from tqdm import tqdm

from calibration.decoder import TreeDecoder
from calibration.model_calls import synchronizer
from calibration.speculative import decoder_for
from calibration.step_bench import check_form, effective_sizes
from treeopt.errors import UserError
from treeopt.tree import Tree

# ---- end to end -----------------------------------------------------------------------------


@contextlib.contextmanager
def left_padding(tokenizer):
    """Pad on the left for the duration (the decoder takes padding anywhere, but left is what
    generation code expects), with a pad token (eos, or unk, when the tokenizer has none)."""
    old_side, old_pad = tokenizer.padding_side, tokenizer.pad_token
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise UserError("tokenizer: has no pad, eos or unk token to pad a batch of prompts with")
        tokenizer.pad_token = fallback
    tokenizer.padding_side = "left"
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = old_side
        if old_pad is None:
            tokenizer.pad_token = None


def prompt_batches(tokenizer, prompts: list[str], batch: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded (input_ids, attention_mask) batches of exactly `batch` prompts: the
    prompts in order, cycled when there are fewer than `batch` (the last incomplete batch is
    dropped so every batch has the same size)."""
    if not prompts:
        raise UserError("prompts: none given")
    count = max(1, len(prompts) // batch)
    out = []
    with left_padding(tokenizer):
        for i in range(count):
            chunk = [prompts[(i * batch + j) % len(prompts)] for j in range(batch)]
            enc = tokenizer(chunk, return_tensors="pt", padding=True)
            out.append((enc["input_ids"].to(device), enc["attention_mask"].to(device)))
    return out


def token_batches(token_lists: list[list[int]], batch: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`prompt_batches` of prompts given as token ids of one length (a model without a
    tokenizer: random weights, `calibration.random_model.random_token_ids`)."""
    if not token_lists:
        raise UserError("prompts: none given")
    count = max(1, len(token_lists) // batch)
    out = []
    for i in range(count):
        ids = torch.tensor([token_lists[(i * batch + j) % len(token_lists)] for j in range(batch)], dtype=torch.long)
        out.append((ids.to(device), torch.ones_like(ids).to(device)))
    return out


def _decoder(lm, tree: Tree, topk: int, verification: str, graphs: bool | None = None):
    """The reference decoder of `lm` over `tree` in the `verification` form, its steps run as
    `graphs` says (docs/decoder.md#static-shape-steps)."""
    if getattr(lm.heads, "kind", "") == "draft-model":
        return decoder_for(lm.model, lm.heads, tree, topk=topk, timing=False)
    return TreeDecoder(lm.model, lm.heads, tree, topk=topk, timing=False, verification=verification, graphs=graphs)


def _decode_batches(decoders: dict, encoded, rng: random.Random, sync, max_new_tokens: int) -> list[dict]:
    """Decode every batch of `encoded` with every size's decoder, in a fresh random order per
    batch: per size (ascending), its nodes, e2e_tokens_per_s and e2e_tokens_per_step
    (`measure_end_to_end`)."""
    sizes = list(decoders)
    emitted = dict.fromkeys(sizes, 0)
    accepted = dict.fromkeys(sizes, 0)
    pairs = dict.fromkeys(sizes, 0)
    seconds = dict.fromkeys(sizes, 0.0)
    for ids, mask in encoded:
        order = list(sizes)
        rng.shuffle(order)
        for n in order:
            sync()
            t0 = time.perf_counter()
            result = decoders[n].generate(ids, mask, max_new_tokens=max_new_tokens)
            sync()
            seconds[n] += time.perf_counter() - t0
            emitted[n] += sum(len(t) for t in result.tokens)
            active = result.accepted > 0
            accepted[n] += int(result.accepted[active].sum())
            pairs[n] += int(active.sum())
    return [
        {
            "nodes": n,
            "e2e_tokens_per_s": emitted[n] / seconds[n],
            "e2e_tokens_per_step": accepted[n] / pairs[n] if pairs[n] else float("nan"),
        }
        for n in sizes
    ]


def measure_end_to_end(
    lm,
    proposal: Tree,
    sizes,
    batches,
    prompts: list[str] | list[list[int]],
    *,
    max_new_tokens: int,
    topk: int = 10,
    warmup: bool = True,
    seed: int = 0,
    progress: bool = True,
    verification: str = "tree",
    graphs: bool | None = None,
) -> pd.DataFrame:
    """The real greedy decoder on `prompts` (texts; token ids of one length for a model
    without a tokenizer), per (batch, tree size): rows batch, nodes,
    e2e_tokens_per_s, e2e_tokens_per_step, e2e_speedup.

    Every batch of prompts is decoded with every tree size in a fresh random order
    (interleaved, like the step sweep), after one untimed warm-up generation per size.
    e2e_tokens_per_s: all new tokens (the prefill's first one included) over the wall time of
    `generate` (prefill included); no eos stop, so every size emits the same number of tokens
    and the ratio to plain decoding (e2e_speedup) is the throughput gain.
    e2e_tokens_per_step: tokens per decoding step per sequence, over the (sequence, step)
    pairs, = accepted nodes + 1 (the first token comes from the prefill, not from a step); the
    measured counterpart of tau. The decoder verifies in the `verification` form.
    """
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: must be >= 1, got {max_new_tokens}")
    check_form(lm.heads, verification)
    sizes = effective_sizes(sizes, proposal)
    batches = sorted({int(b) for b in batches})
    rng = random.Random(seed)
    sync = synchronizer(lm.device)
    rows = []
    bar = tqdm(total=len(batches) * len(sizes), desc="end-to-end", unit="cfg", disable=not progress, file=sys.stderr)
    try:
        for b in batches:
            if lm.tokenizer is None:
                encoded = token_batches(prompts, b, lm.device)
            else:
                encoded = prompt_batches(lm.tokenizer, prompts, b, lm.device)
            decoders = {n: _decoder(lm, proposal.prefix(n), topk, verification, graphs) for n in sizes}
            if warmup:
                for n in sizes:
                    decoders[n].generate(*encoded[0], max_new_tokens=min(2, max_new_tokens))
            for row in _decode_batches(decoders, encoded, rng, sync, max_new_tokens):
                rows.append({"batch": b, **row})
                bar.update(1)
    finally:
        bar.close()
    df = pd.DataFrame(rows, columns=["batch", "nodes", "e2e_tokens_per_s", "e2e_tokens_per_step"])
    base = df[df["nodes"] == 0].set_index("batch")["e2e_tokens_per_s"]
    df["e2e_speedup"] = df["e2e_tokens_per_s"] / df["batch"].map(base)
    return df
