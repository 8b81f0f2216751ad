"""Verification attention paths side by side (docs/decoder.md#split-verification-attention). Run:

    python benchmarks/bench_attention.py [--model demo|PATH] [--contexts 256,1024,2048]
        [--batches 1,4] [--sizes 0,1,64] [--repeats N] [--device cpu|cuda] [--dtype float32]

Times `TreeDecoder.verify_forward` (the step's model work: the forward over q = n + 1 tokens,
the lm_head, the heads) with each attention path ("split": cached prefix unmasked, step block
under its tree mask, log-sum-exp merge; "masked": one sdpa call under the whole mask) over
batch x context x tree size, interleaved, medians of `repeats`. Per (path, batch, size) it
fits time = a + s C over the contexts C: s / (b x layers) is the cost per cached key per
layer, the figure the GPU check compares with the single-token path's (issue 45). The path
whose multi-token cost per cached key is closest to the single-token path's is what engines
pay (they attend the cache with a decoding kernel and the tree block apart).

Target (run_all): the split path's logits equal the masked path's (float32, 1e-4) in every
cell measured. Prints the table and, with --out, writes it as CSV.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.decoder import TreeDecoder  # noqa: E402
from calibration.demo_files import DEMO_MODEL_DIR  # noqa: E402
from calibration.model_calls import synchronizer, text_config  # noqa: E402
from calibration.models import load_model  # noqa: E402
from calibration.split_attention import ATTENTION_PATHS  # noqa: E402
from calibration.threads import torch_threads  # noqa: E402
from treeopt.tree import Tree, make_tree  # noqa: E402


def _tree(size: int, num_heads: int) -> Tree:
    """A chain for size <= the heads' depth, else a tree of `size` nodes filled breadth-first
    over ranks 0..9 within the heads' depth (the shape is not what is timed: q is)."""
    paths: list[list[int]] = []
    frontier: list[list[int]] = [[]]
    while len(paths) < size and frontier:
        nxt = []
        for p in frontier:
            for r in range(10 if p else 10):
                if len(paths) == size or len(p) >= num_heads:
                    break
                paths.append(p + [r])
                nxt.append(p + [r])
        frontier = nxt
    return make_tree(paths, allow_empty=True)


def _cells(lm, decoders, tree_q, batch: int, context: int, repeats: int):
    """{path: (median seconds, logits)} of verify_forward at one cell, paths interleaved."""
    g = torch.Generator().manual_seed(context + batch)
    vocab = lm.heads.vocab_size
    ids = torch.randint(3, vocab, (batch, context), generator=g).to(lm.device)
    tokens = torch.randint(3, vocab, (batch, tree_q), generator=g).to(lm.device)
    sync = synchronizer(lm.device)
    times = {p: [] for p in decoders}
    logits = {}
    states = {p: d.prefill(ids, capacity=context + tree_q) for p, d in decoders.items()}
    for r in range(repeats + 1):
        for p in list(decoders)[r % 2 :] + list(decoders)[: r % 2]:
            dec, st = decoders[p], states[p]
            sync()
            t0 = time.perf_counter()
            out, _ = dec.verify_forward(st.cache, tokens, st.valid, st.next_pos)
            sync()
            if r:
                times[p].append(time.perf_counter() - t0)
            logits[p] = out.float().cpu()
            st.cache.crop(-dec.verify_appends)
    return {p: (statistics.median(times[p]), logits[p]) for p in decoders}


def run(lm, contexts, batches, sizes, repeats: int):
    layers = int(text_config(lm.model).num_hidden_layers)
    rows, worst = [], 0.0
    for size in sizes:
        tree = _tree(size, lm.heads.num_heads)
        decoders = {p: TreeDecoder(lm.model, lm.heads, tree, timing=False, attention=p) for p in ATTENTION_PATHS}
        for batch in batches:
            for context in contexts:
                cell = _cells(lm, decoders, tree.size + 1, batch, context, repeats)
                ref = cell["masked"][1]
                for p, (sec, out) in cell.items():
                    err = float((out - ref).abs().max())
                    worst = max(worst, err)
                    rows.append({"path": p, "size": tree.size, "batch": batch, "context": context, "ms": 1e3 * sec})
                    cell_name = f"{p:>6} n={tree.size:>3} b={batch} C={context:>5}"
                    print(f"{cell_name}: {1e3 * sec:8.3f} ms  max|dlogit| {err:.1e}")
    per_key = []
    for p in ATTENTION_PATHS:
        for size in sizes:
            for batch in batches:
                pts = [(r["context"], r["ms"]) for r in rows if (r["path"], r["size"], r["batch"]) == (p, size, batch)]
                if len(pts) < 2:
                    continue
                c, ms = np.array(pts, dtype=float).T
                slope = np.polyfit(c, ms, 1)[0]  # ms per cached token (all layers, all rows)
                ns = 1e6 * slope / (batch * layers)
                per_key.append((p, size, batch, ns))
                fit = f"fit over {len(pts)} contexts"
                print(f"{p:>6} n={size:>3} b={batch}: {ns:7.2f} ns per cached key per layer ({fit})")
    return rows, per_key, worst


def main(argv: list[str] | None = None) -> list[tuple]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--contexts", default="256,1024,2048")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--sizes", default="0,1,64")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv if argv is not None else [])
    model = args.model or ("demo" if (DEMO_MODEL_DIR / "config.json").is_file() else None)
    lm = load_model(model, device=args.device, dtype=args.dtype)

    def ints(text):
        return [int(x) for x in text.split(",")]

    with torch_threads(lm.model, lm.device, None):
        print(f"model {model}, {args.device} {args.dtype}, torch threads {torch.get_num_threads()}")
        rows, _, worst = run(lm, ints(args.contexts), ints(args.batches), ints(args.sizes), args.repeats)
    if args.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.out, index=False)
    return [("split attention logits vs masked, max abs difference", worst, 1e-4, "logit", True)]


if __name__ == "__main__":
    main(sys.argv[1:])
