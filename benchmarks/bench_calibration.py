"""Calibration throughput (issue 4): the calibration pass vs the bare teacher-forced forward.

    python benchmarks/bench_calibration.py [--batch-size 8] [--prompt-len 128] [--steps 32]
        [--repeats 9] [--device cpu] [--dtype float32] [--model demo|DIR|random] [--threads N]

On one batch of B sequences of P prompt + S generated tokens (random token ids), times, with
interleaved repeats and medians (this machine has bursts of 5-10x slowdown):

- bare:         `model(input_ids)`, the base model's plain teacher-forced forward (all logits);
- bare+heads:   the base forward plus every Medusa head at every position (what a forward
                "with heads" costs, e.g. Medusa's training forward);
- calibration:  `calibration.runner.label_ranks`: decoder body forward (no base lm_head), heads
                at the labelled positions only, one fused compare per chunk for the ranks;
- generation:   `greedy_continuations` for S and 2S steps (KV cache): per-token cost must not grow
                with the length (no quadratic re-encoding), compared with re-encoding without a
                cache for a few steps.

Target (issue 4): calibration throughput >= 80% of the bare forward's. Both ratios are printed;
It exits 1 when the throughput target is missed.

With ``--processes N`` (N >= 2) it also measures how calibration scales over processes (issue
16): the same `treeopt calibrate` (demo model, ``--scaling-prompts`` demo prompts) once in one
process and once under ``torchrun --nproc-per-node N``, and prints the calibration pass's wall
time of each (the command's own "this run" time, model loading excluded), the whole command's
wall time, and the scaling efficiency T1 / (N * TN). Each process here is a CPU process with one
torch thread, so N should not exceed the cores.

The model is the demo model when it exists (or --model DIR), else `random`: a random Llama of
the demo's shape (vocab 4096, hidden 256, 4 layers, 4 heads of 1 ResBlock).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.demo_files import DEMO_MODEL_DIR  # noqa: E402
from calibration.labels import decoder_body, greedy_continuations, label_ranks  # noqa: E402
from calibration.models import load_model, tiny_model_for_tests  # noqa: E402
from treeopt.timing import measure_interleaved  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(fns: dict, repeats: int, rng) -> dict[str, float]:
    """Median seconds of each fn, running them in a shuffled order each round."""
    times = {name: [] for name in fns}
    names = list(fns)
    for name in names:  # warm-up
        fns[name]()
    for _ in range(repeats):
        rng.shuffle(names)
        for name in names:
            times[name].append(timed(fns[name]))
    return {name: statistics.median(v) for name, v in times.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def calibrate_wall(processes: int, prompts: int, out: Path) -> tuple[float, float]:
    """(calibration pass s, whole command s) of `treeopt calibrate` on the demo in `processes`
    processes (torchrun when more than one)."""
    args = [
        "-m",
        "treeopt",
        "calibrate",
        "--model",
        "demo",
        "--data",
        "demo",
        "--max-prompts",
        str(prompts),
        "--steps",
        "32",
        "--batch-size",
        "8",
        "--device",
        "cpu",
        "-o",
        str(out),
    ]
    launch = (
        []
        if processes == 1
        else [
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(processes),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
        ]
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *launch, *args], capture_output=True, text=True, env=env, timeout=1800)
    whole = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"calibrate in {processes} processes failed:\n{proc.stderr[-2000:]}")
    return float(re.search(r"this run ([0-9.]+) s", proc.stdout).group(1)), whole


def scaling(processes: int, prompts: int) -> float:
    """Print the scaling of calibration over `processes` processes; return the efficiency."""
    with tempfile.TemporaryDirectory() as tmp:
        one_pass, one_whole = calibrate_wall(1, prompts, Path(tmp) / "one.json")
        many_pass, many_whole = calibrate_wall(processes, prompts, Path(tmp) / "many.json")
        same = (Path(tmp) / "one.ranks.npz").read_bytes() == (Path(tmp) / "many.ranks.npz").read_bytes()
    efficiency = one_pass / (processes * many_pass)
    print(f"scaling: demo model, {prompts} demo prompts x 32 greedy steps, batch 8, CPU, 1 thread per process")
    print(f"  1 process:   calibration {one_pass:7.1f} s  (whole command {one_whole:6.1f} s)")
    print(f"  {processes} processes: calibration {many_pass:7.1f} s  (whole command {many_whole:6.1f} s)")
    print(f"  scaling efficiency T1 / ({processes} x T{processes}) = {efficiency:.2f}; rank vectors identical: {same}")
    return efficiency


def main(argv=None) -> list[tuple]:
    """Print the measurements; return rows (name, value, target, unit, lower_is_better) for run_all."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="auto", help="demo, a model DIR, random, or auto")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's; 1 avoids OpenMP stalls on a busy CPU)",
    )
    ap.add_argument(
        "--processes",
        type=int,
        default=0,
        help="also measure scaling of `treeopt calibrate` over this many processes (>= 2)",
    )
    ap.add_argument("--scaling-prompts", type=int, default=64)
    args = ap.parse_args(argv or [])

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tmp = None
    choice = args.model
    if choice == "auto":
        choice = "demo" if (DEMO_MODEL_DIR / "config.json").is_file() else "random"
    if choice == "random":
        tmp = tempfile.TemporaryDirectory()
        path = tiny_model_for_tests(
            Path(tmp.name), vocab=4096, hidden=256, layers=4, heads=4, kv_heads=4, num_medusa_heads=4
        )
        lm = load_model(str(path), device=args.device, dtype=args.dtype)
        name = "random Llama, demo shape"
    else:
        lm = load_model(choice, device=args.device, dtype=args.dtype)
        name = lm.name
    model, heads = lm.model, lm.heads
    torch.set_grad_enabled(False)
    n_params = sum(p.numel() for p in model.parameters())
    n_heads = sum(p.numel() for p in heads.parameters())
    vocab = heads.vocab_size
    B, P, S = args.batch_size, args.prompt_len, args.steps
    T = P + S
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(3, vocab, size=(B, T))).to(lm.device)
    seqs = ids.tolist()
    starts = [P - 1] * B

    def bare():
        model(input_ids=ids).logits.sum().item()

    def bare_heads():
        hidden = decoder_body(model)(input_ids=ids).last_hidden_state
        model.lm_head(hidden).sum().item()
        for head in heads:
            head(hidden).sum().item()

    def calib():
        label_ranks(model, heads, seqs, starts)

    print(
        f"model: {name} ({n_params / 1e6:.1f}M params + heads {n_heads / 1e6:.1f}M, vocab {vocab}, "
        f"{heads.num_heads} heads), device {lm.device}, dtype {str(lm.dtype).replace('torch.', '')}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"batch {B} x ({P} prompt + {S} generated) = {B * T} tokens; median of {args.repeats} interleaved repeats")
    med = interleaved({"bare": bare, "bare+heads": bare_heads, "calibration": calib}, args.repeats, rng)
    tok = B * T
    for key in ("bare", "bare+heads", "calibration"):
        print(f"  {key:<12} {med[key] * 1e3:9.1f} ms  {tok / med[key]:10,.0f} tok/s")
    r_bare = med["bare"] / med["calibration"]
    r_heads = med["bare+heads"] / med["calibration"]
    print(f"calibration / bare forward throughput:       {r_bare:6.2f}  (target >= 0.80)")
    print(f"calibration / bare+heads forward throughput: {r_heads:6.2f}")

    # generation: KV cache, linear in steps
    prompts = [s[:P] for s in seqs]
    reps = max(3, args.repeats // 3)
    # medians over interleaved rounds with slowdown outliers re-taken (treeopt.timing): the
    # per-step figures are differences of whole runs, so one burst would swing them
    stats = measure_interleaved(
        [
            lambda: greedy_continuations(model, prompts, S),
            lambda: greedy_continuations(model, prompts, 2 * S),
            lambda: greedy_continuations(model, prompts, 1),
        ],
        rounds=max(5, args.repeats),
    )
    gen = {name: st.median_s for name, st in zip(("S", "2S", "prefill"), stats)}
    per_step_s = (gen["S"] - gen["prefill"]) / (S - 1)
    per_step_2s = (gen["2S"] - gen["prefill"]) / (2 * S - 1)
    print(
        f"generation (KV cache): {S} steps {gen['S'] * 1e3:.0f} ms, {2 * S} steps "
        f"{gen['2S'] * 1e3:.0f} ms ({B * S / gen['S']:,.0f} generated tok/s); per decode step "
        f"{per_step_s * 1e3:.2f} ms over {S} steps vs {per_step_2s * 1e3:.2f} ms over {2 * S} "
        f"(ratio {per_step_2s / per_step_s:.2f}; re-encoding would grow ~{(P + S) / (P + S / 2):.2f}x+)"
    )

    def no_cache(n=4):
        x = ids[:, :P]
        for _ in range(n):
            nxt = model(input_ids=x).logits[:, -1].argmax(-1)
            x = torch.cat([x, nxt[:, None]], 1)

    nc = statistics.median(timed(no_cache) for _ in range(reps)) / 4
    print(
        f"  (re-encoding without a cache: {nc * 1e3:.1f} ms per step at length {P}, "
        f"{nc / per_step_s:.1f}x a cached step)"
    )
    if tmp is not None:
        tmp.cleanup()
    if args.processes >= 2:
        scaling(args.processes, args.scaling_prompts)
    return [
        ("calibration pass / bare forward throughput", r_bare, 0.8, "x", False),
        ("KV-cache decode step, 64 vs 32 steps", per_step_2s / per_step_s, 1.5, "x", True),
    ]


if __name__ == "__main__":
    rows = main(sys.argv[1:])
    sys.exit(0 if rows[0][1] >= rows[0][2] else 1)
