"""Calibration in many processes and across devices: the counts equal one process's, exactly.

Two CPU processes talk through gloo (torchrun as a user runs it, and torch.multiprocessing for a
process that fails half-way); a model spread over two CPU "devices" by accelerate (layers kept
in memory and layers offloaded to disk, moved in for each forward) gives the counts of the model
loaded whole.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibration.data import load_prompts
from calibration.distributed import (
    Processes,
    processes_from_env,
    rank_checkpoint_path,
    shard_bounds,
)
from calibration.models import ModelSource, load_model, tiny_model_for_tests
from calibration.runner import CalibrationInterrupted, CalibrationSettings, calibrate, run_calibration
from treeopt.acceptance import rank_vectors_path
from treeopt.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "def f(x):\n    return x + 1\n",
    "import os\nprint(os.getcwd())\n",
    "class A:\n    def __init__(self):\n        self.a = [1, 2, 3]\n",
    "for i in range(10):\n    total += i * i\n",
    "with open('f') as fh:\n    data = fh.read()\n",
    "x = {'a': 1, 'b': 2}\nfor k, v in x.items():\n    print(k, v)\n",
    "while True:\n    break\n",
]
SETTINGS = CalibrationSettings(steps=6, topk=4, batch_size=2)  # 7 prompts: 4 batches, 2 per process


def on_cpu(model_dir) -> ModelSource:
    return ModelSource(str(model_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _same_outputs(single: Path, many: Path, processes: int) -> None:
    """Table and sidecar of a many-process run equal the one-process run's: counts, joint
    counts, provenance (which adds only the process count) and the sidecar byte for byte."""
    one, two = json.loads(single.read_text()), json.loads(many.read_text())
    assert two["provenance"].pop("processes") == processes
    assert one == two
    assert rank_vectors_path(single).read_bytes() == rank_vectors_path(many).read_bytes()


# ---------------------------------------------------------------------------------------------
# shards and placement


def test_shards_are_whole_batches_covering_every_prompt_once():
    for total in range(0, 40):
        for batch in (1, 2, 3, 8):
            for world in (1, 2, 3, 5):
                bounds = [shard_bounds(total, batch, r, world) for r in range(world)]
                # contiguous, in order, from 0 to total
                assert bounds[0][0] == 0 and bounds[-1][1] == total
                assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
                # each shard starts on a batch boundary: the batches are one process's batches
                assert all(lo % batch == 0 for lo, hi in bounds if hi > lo)
                # whole batches split as evenly as they divide
                nb = [-(-(hi - lo) // batch) for lo, hi in bounds]
                assert max(nb) - min(nb) <= 1 and sum(nb) == -(-total // batch)


def test_processes_from_torchrun_environment():
    assert processes_from_env({}) == Processes(0, 1, 0)
    assert processes_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == Processes(3, 4, 1)
    with pytest.raises(UserError, match="rank 4 of 4"):
        processes_from_env({"RANK": "4", "WORLD_SIZE": "4"})
    assert rank_checkpoint_path("a.json.partial", Processes(1, 2, 1)).name == "a.json.partial.rank1-of-2"
    assert rank_checkpoint_path("a.json.partial", Processes()).name == "a.json.partial"


# ---------------------------------------------------------------------------------------------
# torchrun, as a user runs it


@pytest.mark.slow
def test_torchrun_two_processes_equal_one_process(tiny, prompts_file, tmp_path):
    single = tmp_path / "one.json"
    run_calibration(on_cpu(tiny), str(prompts_file), output=single, settings=SETTINGS, progress=False)
    many = tmp_path / "two.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "-m",
        "treeopt",
        "calibrate",
        "--model",
        str(tiny),
        "--data",
        str(prompts_file),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--steps",
        "6",
        "--topk",
        "4",
        "--batch-size",
        "2",
        "-o",
        str(many),
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _same_outputs(single, many, 2)
    # process 0 alone speaks; every process removed its checkpoint after the outputs were written
    assert proc.stdout.count("calibrated 7 prompts") == 1 and "2 processes" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "one.json",
        "one.ranks.npz",
        "prompts.jsonl",
        "two.json",
        "two.ranks.npz",
    ]


# ---------------------------------------------------------------------------------------------
# a process that fails half-way, then --resume


def _worker(
    rank: int, world: int, port: int, model: str, data: str, output: str, fail_after: int, resume: bool
) -> None:
    """One calibration process (torch.multiprocessing target). Process 1 is interrupted after
    `fail_after` batches when `fail_after` > 0; each writes what happened to OUTPUT.rankR.log."""
    import calibration.runner as runner  # the spawned child patches its own copy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SOURCE_DATE_EPOCH="1700000000")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank == 1 and fail_after > 0:
        real, calls = runner.label_ranks, []

        def failing(*args, **kwargs):
            if len(calls) == fail_after:
                raise KeyboardInterrupt
            calls.append(1)
            return real(*args, **kwargs)

        runner.label_ranks = failing
    log = Path(f"{output}.rank{rank}.log")
    try:
        run_calibration(
            on_cpu(model),
            data,
            output=output,
            settings=SETTINGS,
            progress=False,
            resume=resume,
            processes=Processes(rank, world, rank),
        )
        log.write_text("done")
    except CalibrationInterrupted as stop:
        log.write_text(f"interrupted {stop.prompts_done}")
    except Exception as err:  # process 0 loses its peer in the exchange
        log.write_text(f"failed {type(err).__name__}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_failed_process_keeps_the_others_checkpoints_and_resumes(tiny, prompts_file, tmp_path):
    # 14 prompts, 7 batches of 2: process 0 has batches 0-2 (prompts 0..5), process 1 batches
    # 3-6 (prompts 6..13)
    doubled = tmp_path / "prompts14.jsonl"
    doubled.write_text(prompts_file.read_text() * 2)
    single, out = tmp_path / "one.json", tmp_path / "two.json"
    run_calibration(on_cpu(tiny), str(doubled), output=single, settings=SETTINGS, progress=False)
    data = (str(tiny), str(doubled), str(out))
    ckpt = [rank_checkpoint_path(f"{out}.partial", Processes(r, 2, r)) for r in range(2)]
    mp.start_processes(_worker, args=(2, _free_port(), *data, 1, False), nprocs=2, join=True, start_method="spawn")
    assert Path(f"{out}.rank1.log").read_text() == "interrupted 8"  # its first batch (6, 7) done
    assert Path(f"{out}.rank0.log").read_text().startswith("failed")
    assert not out.exists()
    # each checkpoint holds its own shard's work: process 0 all of it, process 1 one batch
    docs = [json.loads(c.read_text()) for c in ckpt]
    assert [d["prompts_done"] for d in docs] == [6, 8]
    assert [d["fingerprint"]["shard"] for d in docs] == [[0, 6], [6, 14]]
    # resume: process 0 has nothing left, process 1 continues from prompt 8
    mp.start_processes(_worker, args=(2, _free_port(), *data, 0, True), nprocs=2, join=True, start_method="spawn")
    assert [Path(f"{out}.rank{r}.log").read_text() for r in range(2)] == ["done", "done"]
    _same_outputs(single, out, 2)
    assert not any(c.exists() for c in ckpt)
    # resume on the finished whole: nothing to run, the same outputs
    before = out.read_bytes()
    mp.start_processes(_worker, args=(2, _free_port(), *data, 0, True), nprocs=2, join=True, start_method="spawn")
    assert out.read_bytes() == before


# ---------------------------------------------------------------------------------------------
# a model spread over devices


def test_sharded_model_gives_the_unsharded_counts(tiny, prompts_file, tmp_path):
    pytest.importorskip("accelerate", reason="the [scale] extra (CI installs it with [dev])")
    whole = load_model(str(tiny), device="cpu", dtype="float32")
    prompts = load_prompts(prompts_file, whole.tokenizer)
    expected = calibrate(whole, prompts, SETTINGS, progress=False)
    # two CPU "devices": layer 0 and the output layer in memory, layer 1 and the final norm on
    # disk (accelerate moves their weights in for each forward)
    split = {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "disk",
        "lm_head": "cpu",
    }
    for device_map in (split, "auto"):
        sharded = load_model(
            str(tiny), device="cpu", dtype="float32", device_map=device_map, offload_dir=str(tmp_path / "offload")
        )
        if device_map is split:
            assert sharded.model.hf_device_map == split
        got = calibrate(sharded, prompts, SETTINGS, progress=False)
        np.testing.assert_array_equal(got.table.hits, expected.table.hits)
        np.testing.assert_array_equal(got.table.positions, expected.table.positions)
        assert got.table.joint == expected.table.joint
        np.testing.assert_array_equal(got.ranks, expected.ranks)
    assert sharded.device == torch.device("cpu")  # the heads sit where the last hidden state is
    assert any(
        p.device.type == "meta"
        for p in load_model(
            str(tiny), device="cpu", dtype="float32", device_map=split, offload_dir=str(tmp_path / "offload")
        ).model.parameters()
    )  # the disk layers really left memory


def test_device_map_refused_with_many_processes(tiny, prompts_file):
    with pytest.raises(UserError, match="--device-map: one process spreads"):
        run_calibration(
            ModelSource(str(tiny), device="cpu", device_map="auto"), str(prompts_file), processes=Processes(0, 2, 0)
        )


@pytest.mark.slow
def test_torchrun_draft_scores_equal_one_process(tmp_path):
    """An EAGLE draft's scores (`--draft-scores`) gathered from two processes are the one-process
    sidecar byte for byte (each process drafts the pools of its own whole batches)."""
    args = ["--model", "demo", "--drafter", "eagle3", "--data", "demo", "--device", "cpu", "--dtype", "float32"]
    args += ["--max-prompts", "4", "--prompt-tokens", "24", "--steps", "10", "--batch-size", "2"]
    args += ["--draft-scores", "2", "-q"]
    single = tmp_path / "one.json"
    one = subprocess.run(
        [sys.executable, "-m", "treeopt", "calibrate", *args, "-o", str(single)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    many = tmp_path / "two.json"
    run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
    run += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    proc = subprocess.run(
        [*run, "-m", "treeopt", "calibrate", *args, "-o", str(many)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    from treeopt.draft_scores import draft_scores_path, load_draft_scores

    assert load_draft_scores(draft_scores_path(many)).rows == 4 * 9
    assert draft_scores_path(single).read_bytes() == draft_scores_path(many).read_bytes()
