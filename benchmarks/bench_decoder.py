"""Speed of the reference tree decoder (issue 5). Run:

    python benchmarks/bench_decoder.py [--model demo|PATH] [--runs N] [--max-new-tokens N]

Target: the non-model work of a decoding step (draft = head top-k, candidate layout, mask and
positions; update = acceptance, bonus, KV-cache update, bookkeeping) stays under 15% of the step
at tree size 64 on the demo model (batch 1). Also printed, not targets: tokens per second and
tokens per step of tree decoding (64 nodes) against plain greedy decoding (the ordinary
transformers path) and against the decoder with the empty tree, and whether the tokens agree.

Uses the demo model when it exists (calibration/demo_model), else a random model of the demo's
shape (vocab 4096, hidden 256, 4 layers, 4 heads, 4 Medusa heads), whose random heads accept
few tokens: its tokens/s ratio then says little, its non-model share is representative.
Timings on this shared VM are noisy: runs are interleaved and medians reported.

`main()` returns [(name, measured, target, unit, lower_is_better), ...] for run_all.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.decoder import TreeDecoder  # noqa: E402
from calibration.demo_files import DEMO_MODEL_DIR  # noqa: E402
from calibration.greedy import greedy_decode  # noqa: E402
from calibration.models import load_model, tiny_model_for_tests  # noqa: E402
from treeopt.accuracy import load_accuracy  # noqa: E402
from treeopt.build import greedy_tree  # noqa: E402

TREE_SIZE = 64
TARGET_SHARE = 0.15


def _tree(num_heads: int, topk: int = 10):
    """The 64-node greedy tree for the Medusa authors' Vicuna-7B head accuracies."""
    table = load_accuracy(str(resources.files("treeopt").joinpath("data/medusa_train_accuracy.csv")), model="vicuna-7b")
    acc = table.accuracy[:num_heads, :topk]
    return greedy_tree(acc, TREE_SIZE)


def _load(model: str | None, tmp: Path):
    if model is None:
        model = "demo" if (DEMO_MODEL_DIR / "config.json").is_file() else None
    if model is None:
        path = tiny_model_for_tests(
            tmp / "demo_shaped", vocab=4096, hidden=256, layers=4, heads=4, kv_heads=4, num_medusa_heads=4
        )
        return load_model(str(path), device="cpu", dtype="float32"), "random demo-shaped model"
    return load_model(model, device="cpu", dtype="float32"), model


def _prompts(lm, n: int, length: int = 96) -> list[list[int]]:
    if lm.name == "demo":
        from calibration.data import load_prompts

        return [list(p) for p in load_prompts("demo", lm.tokenizer, prompt_tokens=length, max_prompts=n).token_ids]
    g = torch.Generator().manual_seed(0)
    vocab = lm.heads.vocab_size
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def main(model: str | None = None, runs: int = 3, max_new_tokens: int = 32, prompts: int = 2) -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        lm, label = _load(model, Path(tmp))
        tree = _tree(lm.heads.num_heads)
        tree_dec = TreeDecoder(lm.model, lm.heads, tree)
        plain_dec = TreeDecoder(lm.model, lm.heads, tree.prefix(0))
        eos = lm.tokenizer.eos_token_id
        token_lists = _prompts(lm, prompts)
        print(
            f"model: {label}; tree: greedy {tree.size} nodes, depth {tree.depth}; "
            f"{len(token_lists)} prompts x {max_new_tokens} new tokens, batch 1, "
            f"torch threads {torch.get_num_threads()}"
        )

        shares, step_ms, nonmodel_ms = [], [], []
        speed = {"tree": [], "plain greedy": [], "empty tree": []}
        per_step = {"tree": [], "empty tree": []}
        identical = True
        with torch.inference_mode():
            for run in range(runs + 1):  # run 0 warms up
                for ids in token_lists:
                    x = torch.tensor([ids])
                    order = ["tree", "plain greedy", "empty tree"]
                    order = order[run % 3 :] + order[: run % 3]  # interleave
                    outs = {}
                    for name in order:
                        t0 = time.perf_counter()
                        if name == "plain greedy":
                            toks = greedy_decode(lm.model, x, max_new_tokens=max_new_tokens, eos_token_id=eos)[0]
                        else:
                            res = (tree_dec if name == "tree" else plain_dec).generate(
                                x, max_new_tokens=max_new_tokens, eos_token_id=eos
                            )
                            toks = res.tokens[0]
                        dt = time.perf_counter() - t0
                        outs[name] = toks
                        if run == 0:
                            continue
                        speed[name].append(len(toks) / dt)
                        if name != "plain greedy":
                            per_step[name].append(res.tokens_per_step)
                        if name == "tree" and res.steps:
                            step = res.step_s
                            shares.extend(((res.draft_s + res.update_s) / step).tolist())
                            step_ms.extend((1e3 * step).tolist())
                            nonmodel_ms.extend((1e3 * (res.draft_s + res.update_s)).tolist())
                    identical &= outs["tree"] == outs["plain greedy"] == outs["empty tree"]

        share = statistics.median(shares)
        med = {k: statistics.median(v) for k, v in speed.items()}
        print(
            f"tree {tree.size}: median step {statistics.median(step_ms):.2f} ms, non-model "
            f"{statistics.median(nonmodel_ms):.3f} ms = {100 * share:.1f}% of the step "
            f"(median over {len(shares)} steps; target < {100 * TARGET_SHARE:.0f}%)"
        )
        for name in speed:
            tps = f", {statistics.median(per_step[name]):.2f} tokens/step" if name in per_step else ""
            print(f"  {name:>12}: {med[name]:8.1f} tokens/s{tps}")
        print(
            f"tree vs plain greedy: {med['tree'] / med['plain greedy']:.2f}x tokens/s; "
            f"empty tree vs plain greedy: {med['empty tree'] / med['plain greedy']:.2f}x; "
            f"identical tokens: {'yes' if identical else 'NO'}"
        )
        return [
            (f"decoder non-model share of a step, tree {TREE_SIZE}, batch 1", share, TARGET_SHARE, "fraction", True),
            ("decoder output identical to plain greedy (tree 64, empty tree)", float(identical), 1.0, "bool", False),
        ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's). On a loaded shared machine "
        "1 avoids OpenMP oversubscription stalls of several ms per op.",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = main(args.model, args.runs, args.max_new_tokens)
    bad = 0
    for name, value, target, unit, lower in rows:
        ok = value <= target if lower else value >= target
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {value:.4g} {unit} (target {'<=' if lower else '>='} {target:g})")
    sys.exit(1 if bad else 0)
