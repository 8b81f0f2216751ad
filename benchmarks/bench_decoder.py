"""Speed of the reference tree decoder (issue 5). Run:

    python benchmarks/bench_decoder.py [--model demo|PATH] [--runs N] [--max-new-tokens N] [--threads N]
        [--attention split|masked] [--clock wall|thread]

Targets: the non-model work of a decoding step (draft = head top-k, candidate layout, mask and
positions; update = acceptance, bonus, KV-cache update, bookkeeping) is at most 5% of the step
at tree size 64 on the demo model (batch 1), on the eager path and on the static-shape path
(docs/decoder.md#static-shape-steps), whose copies of the inputs into its static
buffers count as non-model work. Both paths are run side by side, interleaved. Also printed, not
targets: tokens per second and tokens per step of tree decoding (64 nodes, eager and static)
against plain greedy decoding (the ordinary transformers path) and against the decoder with the
empty tree, and whether the tokens agree.

Uses the demo model when it exists (calibration/demo_model), else a random model of the demo's
shape (vocab 4096, hidden 256, 4 layers, 4 heads, 4 Medusa heads), whose random heads accept
few tokens: its tokens/s ratio then says little, its non-model share is representative.
Timings on this shared VM are noisy: runs are interleaved and medians reported.

Torch's CPU threads: the project's default for the model timed (`calibration.threads`, the rule
`treeopt sweep` and `treeopt decode` follow: 1 for a small model such as the demo), since the
benchmark judges the decoder as a sweep runs it; `--threads N` overrides it.

`--clock thread` times the same phases (the same share) in this thread's CPU time instead of
wall time: on a machine other processes load, wall time also counts the time the process
waits for a core, mostly inside the long forward, which understates the share a quiet machine
shows (docs/decoder.md#timing-a-step). With one torch thread every operation of a step runs on
the calling thread, so its CPU time is the step's work; more threads are refused.

`main()` returns [(name, measured, target, unit, lower_is_better), ...] for run_all.py.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import types
from importlib import resources
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration import decode_loop, static_steps  # noqa: E402
from calibration.decoder import TreeDecoder  # noqa: E402
from calibration.demo_files import DEMO_MODEL_DIR  # noqa: E402
from calibration.greedy import greedy_decode  # noqa: E402
from calibration.models import load_model, tiny_model_for_tests  # noqa: E402
from calibration.threads import torch_threads  # noqa: E402
from treeopt.accuracy import load_accuracy  # noqa: E402
from treeopt.build import greedy_tree  # noqa: E402

TREE_SIZE = 64
# the decoder's own work (drafting, the cache update, staging inputs) at tree 64, batch 1, in
# either mode: at most 5% of a step (docs/decoder.md#static-shape-steps)
TARGET_SHARE = 0.05
TARGET_SHARE_STATIC = TARGET_SHARE


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


def _step_shares(res, staging) -> tuple[list, list, list]:
    """Per step: the non-model share, the step's ms and the non-model ms. `staging` (steps,)
    seconds the static path spent copying inputs into its static buffers, timed inside the
    verify phase but decoder work: moved to the non-model side."""
    nonmodel = res.draft_s + res.update_s + staging
    step = res.step_s
    return (nonmodel / step).tolist(), (1e3 * step).tolist(), (1e3 * nonmodel).tolist()


def main(
    model: str | None = None,
    runs: int = 3,
    max_new_tokens: int = 32,
    prompts: int = 2,
    threads: int | None = None,
    attention: str | None = None,
    clock: str = "wall",
) -> list[tuple]:
    """The benchmark (module docstring) with `threads` torch CPU threads (None: the project's
    default for the model, `calibration.threads.default_threads`), the decoders' verification
    attention `attention` (None: the device's default; docs/decoder.md#split-verification-attention),
    the phases timed in `clock` time ("wall" or "thread")."""
    with tempfile.TemporaryDirectory() as tmp:
        lm, label = _load(model, Path(tmp))
        with torch_threads(lm.model, lm.device, threads), _phase_clock(clock):
            return _run(lm, label, runs, max_new_tokens, prompts, attention)


@contextlib.contextmanager
def _phase_clock(clock: str):
    """The decoder's phase clock and the static steps' staging clock (both read
    `time.perf_counter` in their modules) on this thread's CPU time for "thread"."""
    if clock == "wall":
        yield
        return
    if torch.get_num_threads() != 1:
        n = torch.get_num_threads()
        print(f"--clock thread: needs one torch thread (other threads' work is not counted), got {n}", file=sys.stderr)
        sys.exit(2)
    modules = (decode_loop, static_steps)
    saved = [m.time for m in modules]
    for m in modules:
        m.time = types.SimpleNamespace(perf_counter=time.thread_time)
    try:
        yield
    finally:
        for m, t in zip(modules, saved, strict=True):
            m.time = t


def _run(lm, label: str, runs: int, max_new_tokens: int, prompts: int, attention: str | None) -> list[tuple]:
    tree = _tree(lm.heads.num_heads)
    decoders = {
        "tree eager": TreeDecoder(lm.model, lm.heads, tree, graphs=False, attention=attention),
        "tree static": TreeDecoder(lm.model, lm.heads, tree, graphs=True, attention=attention),
        "empty tree": TreeDecoder(lm.model, lm.heads, tree.prefix(0), attention=attention),
    }
    eos = lm.tokenizer.eos_token_id
    token_lists = _prompts(lm, prompts)
    print(
        f"model: {label}; tree: greedy {tree.size} nodes, depth {tree.depth}; "
        f"{len(token_lists)} prompts x {max_new_tokens} new tokens, batch 1, "
        f"torch threads {torch.get_num_threads()}; static path: {decoders['tree static'].steps}; "
        f"attention: {decoders['tree eager'].attention}; clock: "
        f"{'thread CPU time' if decode_loop.time.perf_counter is time.thread_time else 'wall'}"
    )

    modes = ("tree eager", "tree static")
    shares = {m: [] for m in modes}
    step_ms = {m: [] for m in modes}
    nonmodel_ms = {m: [] for m in modes}
    speed = {"tree eager": [], "tree static": [], "plain greedy": [], "empty tree": []}
    per_step = {"tree eager": [], "tree static": [], "empty tree": []}
    identical = True
    with torch.inference_mode():
        for run in range(runs + 1):  # run 0 warms up
            for ids in token_lists:
                x = torch.tensor([ids])
                order = list(speed)
                order = order[run % 4 :] + order[: run % 4]  # interleave
                outs = {}
                for name in order:
                    dec = decoders.get(name)
                    if dec is not None and dec.runner is not None:
                        dec.runner.staging_s.clear()
                    t0 = time.perf_counter()
                    if name == "plain greedy":
                        toks = greedy_decode(lm.model, x, max_new_tokens=max_new_tokens, eos_token_id=eos)[0]
                    else:
                        res = dec.generate(x, max_new_tokens=max_new_tokens, eos_token_id=eos)
                        toks = res.tokens[0]
                    dt = time.perf_counter() - t0
                    outs[name] = toks
                    if run == 0:
                        continue
                    speed[name].append(len(toks) / dt)
                    if name != "plain greedy":
                        per_step[name].append(res.tokens_per_step)
                    if name in modes and res.steps:
                        staging = np.zeros(res.steps)
                        if dec.runner is not None:
                            staging = np.asarray(dec.runner.staging_s[-res.steps :])
                        a, b, c = _step_shares(res, staging)
                        shares[name] += a
                        step_ms[name] += b
                        nonmodel_ms[name] += c
                identical &= len({tuple(t) for t in outs.values()}) == 1

    share = {m: statistics.median(shares[m]) for m in modes}
    med = {k: statistics.median(v) for k, v in speed.items()}
    for m in modes:
        print(
            f"{m} {tree.size}: median step {statistics.median(step_ms[m]):.2f} ms, non-model "
            f"{statistics.median(nonmodel_ms[m]):.3f} ms = {100 * share[m]:.1f}% of the step "
            f"(median over {len(shares[m])} steps)"
        )
    for name in speed:
        tps = f", {statistics.median(per_step[name]):.2f} tokens/step" if name in per_step else ""
        print(f"  {name:>12}: {med[name]:8.1f} tokens/s{tps}")
    print(
        f"tree static vs eager: {med['tree static'] / med['tree eager']:.2f}x tokens/s; "
        f"tree static vs plain greedy: {med['tree static'] / med['plain greedy']:.2f}x; "
        f"empty tree vs plain greedy: {med['empty tree'] / med['plain greedy']:.2f}x; "
        f"identical tokens: {'yes' if identical else 'NO'}"
    )
    return [
        (
            f"decoder non-model share of a step, tree {TREE_SIZE}, batch 1",
            share["tree eager"],
            TARGET_SHARE,
            "fraction",
            True,
        ),
        (
            f"decoder non-model share of a step, static shapes, tree {TREE_SIZE}, batch 1",
            share["tree static"],
            TARGET_SHARE_STATIC,
            "fraction",
            True,
        ),
        (
            "decoder output identical to plain greedy (tree 64 eager and static, empty tree)",
            float(identical),
            1.0,
            "bool",
            False,
        ),
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
        help="torch CPU threads (default: the project's for the model, as `treeopt sweep` "
        "chooses them: 1 for a small model on a CPU, else torch's)",
    )
    parser.add_argument("--attention", choices=("split", "masked"), default=None)
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="time the phases in wall time (default) or in this thread's CPU time (a loaded machine)",
    )
    args = parser.parse_args()
    rows = main(
        args.model, args.runs, args.max_new_tokens, threads=args.threads, attention=args.attention, clock=args.clock
    )
    bad = 0
    for name, value, target, unit, lower in rows:
        ok = value <= target if lower else value >= target
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {value:.4g} {unit} (target {'<=' if lower else '>='} {target:g})")
    sys.exit(1 if bad else 0)
