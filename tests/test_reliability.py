"""Nothing lost, nothing overwritten, no traceback: the library side (docs/formats.md#output-safety).

Output safety (treeopt/fileio.py), the calibration commit and checkpoint windows under fault
injection, concurrent writers, the table/sidecar fingerprint, size guards, the exact optimum on
wide tables, and torch messages cut to one line. The expected values come from independent
sources: the filesystem itself, an uninterrupted run, a reference dynamic program and brute
force, hand-derived byte counts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration import demo, runner
from calibration.counts import CalibrationCounts
from calibration.data import load_prompts
from calibration.demo import DemoRecipe
from calibration.demo_files import DEMO_HEADS_DIR, DEMO_MODEL_DIR, DEMO_PROMPTS
from calibration.models import ModelSource, load_model, tiny_model_for_tests
from calibration.runner import (
    CalibrationInterrupted,
    CalibrationSettings,
    calibrate,
    deferred_interrupts,
    run_calibration,
)
from tests.test_reliability_cli import held_by_another_process, refused, refused_in_package
from treeopt.acceptance import load_rank_vectors, rank_vectors_path
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.build import optimal_tree
from treeopt.errors import UserError, first_line
from treeopt.fileio import (
    atomic_outputs,
    check_writable,
    lock_path,
    output_lock,
    refuse_overwriting_inputs,
)
from treeopt.tree import Tree, buffer_bytes, tree_buffers

REPO = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict:
    """Every file under `folder` with its bytes: 'no file created or changed' is equality."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------
# an output that is one of the inputs


def test_output_equal_to_an_input_is_refused_in_every_spelling(tmp_path):
    acc = tmp_path / "acc.json"
    acc.write_text("{}")
    (tmp_path / "link.json").symlink_to(acc)
    os.link(acc, tmp_path / "hard.json")
    (tmp_path / "sub").mkdir()
    (tmp_path / "dirlink").symlink_to(tmp_path)
    before = snapshot(tmp_path)
    for out in (
        acc,
        tmp_path / "link.json",
        tmp_path / "hard.json",
        tmp_path / "sub" / ".." / "acc.json",
        tmp_path / "dirlink" / "acc.json",
    ):
        with pytest.raises(UserError) as err:
            refuse_overwriting_inputs([out], [tmp_path / "other.jsonl", acc])
        message = str(err.value)
        assert "\n" not in message and str(out) in message and str(acc) in message
    # an output that does not exist yet but resolves to an input's path (a dangling link)
    (tmp_path / "dangling").symlink_to(tmp_path / "not-yet.csv")
    with pytest.raises(UserError, match="is also an input"):
        refuse_overwriting_inputs([tmp_path / "dangling"], [tmp_path / "not-yet.csv"])
    before["dangling"] = None
    after = snapshot(tmp_path)
    after["dangling"] = None
    assert after == before  # nothing created or changed


def test_distinct_outputs_and_missing_entries_pass(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("1")
    b.write_text("1")  # same content, different file
    refuse_overwriting_inputs([b, None, tmp_path / "new.json"], [a, None])


# --------------------------------------------------------------------------------------------
# output locations checked before the work


def test_check_writable_names_what_is_wrong_and_creates_nothing(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    before = snapshot(tmp_path)
    cases = {
        tmp_path / "adir": "is a directory",
        tmp_path / "afile" / "out.json": "is not a directory",
        tmp_path / "afile" / "deeper" / "out.json": "is not a directory",
        Path("/proc/treeopt-no/out.json"): "cannot be written in /proc",
    }
    for out, problem in cases.items():
        with pytest.raises(UserError) as err:
            check_writable([tmp_path / "fine.json", out])
        assert str(err.value).startswith(f"{out}: ") and problem in str(err.value)
        assert "\n" not in str(err.value)
    # a folder that does not exist yet is fine (it can be created), and is not created
    check_writable([tmp_path / "new" / "deep" / "out.json", None])
    assert snapshot(tmp_path) == before and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_writable_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(UserError, match="cannot be written in"):
            check_writable([ro / "out.json"])
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------------------------
# several outputs: all or none


def test_atomic_outputs_all_on_success_in_the_order_asked(tmp_path, monkeypatch):
    side, table = tmp_path / "acc.ranks.npz", tmp_path / "sub" / "acc.json"
    side.write_text("old side")
    renamed = []
    real_replace = os.replace

    def record(src, dst):
        renamed.append(Path(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", record)
    with atomic_outputs() as out:
        out.path(side).write_text("new side")
        out.path(table).write_text("new table")
        assert side.read_text() == "old side" and not table.exists()  # nothing visible yet
    assert renamed == [side, table]
    assert side.read_text() == "new side" and table.read_text() == "new table"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["acc.json", "acc.ranks.npz", "sub"]


def test_atomic_outputs_none_on_failure(tmp_path):
    side, table = tmp_path / "acc.ranks.npz", tmp_path / "acc.json"
    side.write_text("old side")
    table.write_text("old table")
    before = snapshot(tmp_path)
    with pytest.raises(OSError, match="disk full"), atomic_outputs() as out:
        out.path(side).write_text("new side")
        out.path(table).write_text("half")
        raise OSError("disk full")
    assert snapshot(tmp_path) == before  # old outputs intact, no temporary left
    with pytest.raises(KeyboardInterrupt), atomic_outputs() as out:
        out.path(side).write_text("new side")
        raise KeyboardInterrupt
    assert snapshot(tmp_path) == before


# --------------------------------------------------------------------------------------------
# a second writer to the same output

HOLDER = textwrap.dedent("""
    import sys, time
    from treeopt.fileio import output_lock
    with output_lock(sys.argv[1]):
        print("locked", flush=True)
        sys.stdin.readline()
""")


def start_holder(output: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(output)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_fails_at_once_naming_the_holder(tmp_path):
    output = tmp_path / "acc.json"
    holder = start_holder(output)
    try:
        with pytest.raises(UserError) as err, output_lock(output):
            pass
        assert str(err.value) == (f"{output}: is being written by another treeopt process (pid {holder.pid})")
        assert lock_path(output) == tmp_path / ".acc.json.lock" and lock_path(output).exists()
    finally:
        holder.communicate("done\n", timeout=60)
    assert holder.returncode == 0
    assert not lock_path(output).exists()  # removed by its holder
    with output_lock(output):  # free again
        assert lock_path(output).read_text().strip() == str(os.getpid())
    assert list(tmp_path.iterdir()) == []


def test_lock_of_a_killed_writer_is_free(tmp_path):
    output = tmp_path / "acc.json"
    holder = start_holder(output)
    holder.kill()  # SIGKILL: no cleanup runs, the kernel drops the flock
    holder.wait(timeout=60)
    assert lock_path(output).exists()
    with output_lock(output):
        pass
    assert not lock_path(output).exists()


def test_lock_is_per_output(tmp_path):
    # another process holds a.json: b.json is free, a.json is not (the lock is re-entrant within
    # one process since a command locks its outputs up front, so the holder is a second process)
    holder = start_holder(tmp_path / "a.json")
    try:
        with output_lock(tmp_path / "b.json"):
            with pytest.raises(UserError, match="another treeopt process"), output_lock(tmp_path / "a.json"):
                pass
    finally:
        holder.communicate("done\n", timeout=60)


def test_lock_is_reentrant_within_a_process_and_released_by_the_outer_holder(tmp_path):
    output = tmp_path / "a.json"
    with output_lock(output):
        with output_lock(output):
            pass
        assert lock_path(output).exists()  # the inner release keeps the outer lock
    assert not lock_path(output).exists()


# --------------------------------------------------------------------------------------------
# the exact optimum on wide tables


def reference_dp(acc: np.ndarray, n: int, widths: list[int]) -> float:
    """The tree-knapsack dynamic program over every rank (docs/builders.md#exact-optimum):
    the best tau of an n-node tree, O(D R n^2). g[m] = best total of m nodes below a node
    of the current depth, per unit of its value."""
    D = len(widths)
    g = np.full(n + 1, -np.inf)
    g[0] = 0.0
    for d in range(D - 1, -1, -1):
        best = np.full(n + 1, -np.inf)
        best[0] = 0.0
        for r in range(widths[d]):
            new = best.copy()
            for m in range(1, n + 1):
                for j in range(1, m + 1):
                    if np.isfinite(g[j - 1]) and np.isfinite(best[m - j]):
                        new[m] = max(new[m], best[m - j] + acc[d, r] * (1.0 + g[j - 1]))
            best = new
        g = best
    return 1.0 + g[n]


def tau(tree: Tree, acc: np.ndarray) -> float:
    return 1.0 + sum(float(np.prod([acc[d, r] for d, r in enumerate(p)])) for p in tree.paths)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 14), st.booleans(), st.data())
def test_optimal_equals_the_unpruned_dp(K, R, n, ties, data):
    values = st.sampled_from([0.0, 0.05, 0.2, 0.2, 0.5]) if ties else st.floats(0.0, 1.0)
    acc = np.array(data.draw(st.lists(st.lists(values, min_size=R, max_size=R), min_size=K, max_size=K)))
    widths = data.draw(st.lists(st.integers(1, R), min_size=K, max_size=K))
    capacity = sum(int(np.prod(widths[: d + 1])) for d in range(K))
    n = min(n, capacity)
    tree = optimal_tree(acc, n, max_children=widths)
    assert tree.size == n and all(p[d] < widths[d] for p in tree.paths for d in range(len(p)))
    assert tau(tree, acc) == pytest.approx(reference_dp(acc, n, widths), rel=1e-12, abs=1e-12)
    m = data.draw(st.integers(0, n))  # every prefix is a tree, and optimal for its size
    assert tau(tree.prefix(m), acc) == pytest.approx(reference_dp(acc, m, widths), rel=1e-12, abs=1e-12)


def test_optimal_on_a_wide_non_monotone_table_beats_the_top_ranks():
    # head 1's best rank is 700 and head 2's is 3: the tree must reach them
    acc = np.full((2, 1000), 0.001)
    acc[0, 700], acc[0, 5], acc[1, 3], acc[1, 999] = 0.6, 0.3, 0.5, 0.4
    tree = optimal_tree(acc, 3)
    # hand-derived: [700] .6, [700, 3] .3, [700, 999] .24, [5] .3 -> the best three
    assert set(tree.paths) == {(700,), (700, 3), (5,)}
    assert tau(tree, acc) == pytest.approx(1 + 0.6 + 0.3 + 0.3)
    assert tree.paths[0] == (700,)  # every prefix is a tree


def test_optimal_prefixes_follow_value_not_depth():
    # hand-derived: [0] .9, [0, 0] .9 x .8 = .72, [1] .05, [0, 1] .09: the 2-node prefix is the
    # chain [0], [0, 0] (tau 2.62), not the two depth-1 nodes (tau 1.95)
    acc = np.array([[0.9, 0.05], [0.8, 0.1]])
    tree = optimal_tree(acc, 4)
    assert tree.paths == ((0,), (0, 0), (0, 1), (1,))
    assert tau(tree.prefix(2), acc) == pytest.approx(1 + 0.9 + 0.72)


def test_optimal_wide_table_matches_dp_at_medium_size():
    rng = np.random.default_rng(3)
    acc = rng.uniform(0, 1, size=(3, 40)) ** 3
    tree = optimal_tree(acc, 30)
    assert tau(tree, acc) == pytest.approx(reference_dp(acc, 30, [40] * 3), rel=1e-12)


# --------------------------------------------------------------------------------------------
# size guards


def test_buffer_bytes_hand_derived():
    # star of 3 nodes: q = 4, depth 1, 3 leaves: mask 16 + chains and retrieve 8 * (4 + 3) * 2
    # + five vectors 5 * 8 * 4
    assert buffer_bytes(3, 1, 3) == 16 + 112 + 160
    star = Tree(((0,), (1,), (2,)))
    tree_buffers(star, 3, max_bytes=288)
    with pytest.raises(UserError, match=r"3 nodes \(depth 1, 3 leaves\) would take 0\.00 GiB"):
        tree_buffers(star, 3, max_bytes=287)


def test_huge_tree_buffers_refused_with_the_estimate_before_allocating():
    star = Tree(tuple((r,) for r in range(100_000)))
    with pytest.raises(UserError) as err:
        tree_buffers(star, 100_000)
    # (10^5 + 1)^2 bytes of mask alone: 9.31 GiB
    assert "100000 nodes" in str(err.value) and "9.3" in str(err.value) and "GiB" in str(err.value)


# --------------------------------------------------------------------------------------------
# torch's messages on one line


def test_first_line_of_torch_refusals(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))

    evil = tmp_path / "base.pt"
    torch.save(Payload(), evil)
    with pytest.raises(Exception) as err:  # noqa: PT011 - whatever torch raises
        torch.load(evil, weights_only=True)
    line = first_line(err.value)
    assert "\n" not in line and "weights_only" not in line and "False" not in line
    assert "could run code" in line and "system" in line
    assert first_line(ValueError("\n\n  first\nsecond")) == "first"
    advice = "Re-run with weights_only" + "=False to load it."  # torch's advice, which must not pass
    assert first_line(f"Bad thing. {advice}") == "Bad thing."
    assert first_line(KeyError()) == "KeyError"


# --------------------------------------------------------------------------------------------
# calibration: the count/commit window, the checkpoint-removal window, finished outputs

PROMPTS = [
    "def f(x):\n    return x + 1\n",
    "import os\n",
    "class A:\n    def __init__(self):\n        self.a = [1, 2, 3]\n",
    "x = 1",
    "for i in range(10):\n    print(i * i)\n",
    "# comment\n",
    "while True:\n    break\n",
]
SETTINGS = CalibrationSettings(steps=5, batch_size=2)
SMALL = {"settings": SETTINGS, "progress": False}


def on_cpu(model_dir) -> ModelSource:
    return ModelSource(str(model_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny"), num_medusa_heads=3)


@pytest.fixture(scope="module")
def loaded(tiny):
    return load_model(str(tiny), device="cpu", dtype="float32")


@pytest.fixture
def work(tmp_path):
    """A folder holding only the prompts file, and the file."""
    folder = tmp_path / "work"
    folder.mkdir()
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return folder, prompts


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Ctrl-C as an interactive Python has it (KeyboardInterrupt), whatever the test process
    inherited: a shell starts background jobs with SIGINT ignored."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def test_deferred_interrupts_holds_ctrl_c_to_the_end_of_the_block():
    steps = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        steps.append("after the signal")  # still runs: the interrupt is held back
    assert steps == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    with deferred_interrupts():  # no signal: nothing raised
        steps.append("quiet")
    assert steps[-1] == "quiet"


def test_sigint_inside_the_count_update_never_double_counts(loaded, work, monkeypatch):
    """The worst point: a batch's hits added, its prompts_done not yet. Without the unit
    commit, the checkpoint holds the batch's hits and a resume counts the batch again."""
    folder, prompts_file = work
    prompts = load_prompts(prompts_file, loaded.tokenizer)
    full = calibrate(loaded, prompts, **SMALL)
    ckpt = folder / "c.partial"
    merges = []
    real_merge = CalibrationCounts._merge_joint

    def merge_then_interrupt(self, joint):
        real_merge(self, joint)
        merges.append(1)
        if len(merges) == 2:  # inside the second batch's commit, hits already added
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(CalibrationCounts, "_merge_joint", merge_then_interrupt)
    with pytest.raises(CalibrationInterrupted) as stop:
        calibrate(loaded, prompts, replace(SETTINGS, checkpoint_every=100), checkpoint=ckpt, progress=False)
    assert stop.value.prompts_done == 4  # the second batch was committed whole
    saved = json.loads(ckpt.read_text())
    assert saved["prompts_done"] == 4
    monkeypatch.setattr(CalibrationCounts, "_merge_joint", real_merge)
    resumed = calibrate(loaded, prompts, checkpoint=ckpt, resume=True, **SMALL)
    assert resumed.table.to_dict() == full.table.to_dict()
    np.testing.assert_array_equal(resumed.ranks, full.ranks)
    np.testing.assert_array_equal(resumed.counts.positions, full.counts.positions)


def test_failed_table_write_keeps_the_checkpoint_and_resume_does_no_prompt_again(tiny, work, monkeypatch):
    folder, prompts_file = work
    reference = folder / "reference.json"
    run_calibration(on_cpu(tiny), str(prompts_file), output=reference, **SMALL)
    out = folder / "acc.json"
    before = snapshot(folder)

    def disk_full(self, path):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(AccuracyTable, "save", disk_full)
        # one line naming the table (issue 47), not the OSError's traceback
        with pytest.raises(UserError, match=r"acc\.json: cannot write \(No space left"):
            run_calibration(on_cpu(tiny), str(prompts_file), output=out, **SMALL)
    left = snapshot(folder)
    ckpt = folder / "acc.json.partial"
    assert set(left) - set(before) == {"acc.json.partial"}  # no table, no sidecar, no temporary
    assert json.loads(left["acc.json.partial"])["prompts_done"] == len(PROMPTS)

    calls = []
    monkeypatch.setattr(runner, "label_ranks", lambda *a, **k: calls.append(1))
    result = run_calibration(on_cpu(tiny), str(prompts_file), output=out, resume=True, **SMALL)
    assert calls == [] and result.complete and result.resumed_prompts == len(PROMPTS)
    assert not ckpt.exists()
    assert out.read_bytes() == reference.read_bytes()  # as if nothing had failed
    assert rank_vectors_path(out).read_bytes() == rank_vectors_path(reference).read_bytes()


def test_resume_on_a_finished_output(tiny, work, monkeypatch, capsys):
    folder, prompts_file = work
    out = folder / "acc.json"
    args = {"data": str(prompts_file), "output": out}
    run_calibration(on_cpu(tiny), **args, **SMALL)
    before = snapshot(folder)
    calls = []
    monkeypatch.setattr(runner, "label_ranks", lambda *a, **k: calls.append(1))
    result = run_calibration(on_cpu(tiny), **args, resume=True, refuse_other_output=True, **SMALL)
    assert result.already_complete and result.complete and calls == []
    assert "already complete" in capsys.readouterr().err
    assert result.table.to_dict() == json.loads(out.read_text()) | {"format": "treeopt.accuracy/v1"}
    assert snapshot(folder) == before  # nothing rewritten

    with pytest.raises(UserError) as err:
        run_calibration(
            on_cpu(tiny),
            **args,
            resume=True,
            refuse_other_output=True,
            settings=replace(SETTINGS, steps=6),
            progress=False,
        )
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{out}: already calibrated from other inputs (steps: 5 vs now 6)")
    assert calls == [] and snapshot(folder) == before


def test_table_and_sidecar_share_a_run_id_checked_by_the_reader(tiny, work):
    folder, prompts_file = work
    args = {"data": str(prompts_file), "progress": False}
    a, b = folder / "a.json", folder / "b.json"
    run_calibration(on_cpu(tiny), output=a, settings=replace(SETTINGS, seed=0), **args)
    run_calibration(on_cpu(tiny), output=b, settings=replace(SETTINGS, seed=1), **args)  # same counts, other run
    table_a = json.loads(a.read_text())
    with np.load(rank_vectors_path(a)) as z:
        assert str(z["run_id"]) == table_a["provenance"]["run_id"]
        assert len(table_a["provenance"]["run_id"]) == 16
    assert table_a["provenance"]["run_id"] != json.loads(b.read_text())["provenance"]["run_id"]
    assert load_rank_vectors(a) is not None
    # b's sidecar beside a's table: equal counts (greedy labels draw nothing random), so only
    # the run_id tells them apart
    rank_vectors_path(a).write_bytes(rank_vectors_path(b).read_bytes())
    with pytest.raises(
        UserError,
        match=r"a\.ranks\.npz: does not belong to the accuracy table "
        r"beside it \(run_id",
    ):
        load_rank_vectors(a)


def test_second_calibration_to_the_same_output_fails_before_loading(tiny, work, monkeypatch):
    folder, prompts_file = work
    out = folder / "acc.json"
    holder = start_holder(out)
    try:
        before = snapshot(folder)
        monkeypatch.setattr(ModelSource, "load", lambda *a, **k: pytest.fail("model loaded"))
        with pytest.raises(UserError, match=f"is being written by another treeopt process \\(pid {holder.pid}\\)"):
            run_calibration(ModelSource(str(tiny)), str(prompts_file), output=out, **SMALL)
        assert snapshot(folder) == before
    finally:
        holder.communicate("done\n", timeout=60)


def test_calibration_outputs_checked_before_the_model_loads(tiny, work, monkeypatch):
    folder, prompts_file = work
    monkeypatch.setattr(ModelSource, "load", lambda *a, **k: pytest.fail("model loaded"))
    before = snapshot(folder)
    bad = {
        prompts_file: "is also an input",
        folder: "is a directory",
        folder / "prompts.jsonl" / "acc.json": "is not a directory",
        Path("/proc/treeopt-test/acc.json"): "cannot be written in /proc",
    }
    for output, problem in bad.items():
        with pytest.raises(UserError) as err:
            run_calibration(ModelSource(str(tiny)), str(prompts_file), output=output, **SMALL)
        assert problem in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="is also an input"):
        run_calibration(
            ModelSource(str(tiny)), str(prompts_file), output=folder / "acc.json", checkpoint=prompts_file, **SMALL
        )
    assert snapshot(folder) == before


# --------------------------------------------------------------------------------------------
# demo train writes only under its output and work folders

TINY_RECIPE = DemoRecipe(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_attention_heads=2,
    seq_len=16,
    batch_size=2,
    base_steps=2,
    num_medusa_heads=2,
    head_steps=2,
    warmup_steps=1,
)


@pytest.fixture
def fake_stdlib(tmp_path, monkeypatch):
    """A small corpus in place of the interpreter's standard library: some files held out."""
    root = tmp_path / "stdlib"
    root.mkdir()
    body = "".join(f"def function_{i}(x):\n    return x * {i} + len(str(x))\n\n" for i in range(40))
    names = [f"mod{i}.py" for i in range(30)]
    for name in names:
        (root / name).write_text(f"# {name}\n" + body)
    assert any(demo.is_held_out(n) for n in names) and not all(demo.is_held_out(n) for n in names)
    monkeypatch.setattr(demo, "stdlib_files", lambda: (root, sorted(names)))
    return root


def test_demo_train_writes_only_under_its_output(tmp_path, fake_stdlib):
    parent = tmp_path / "parent"
    out = parent / "model"
    out.mkdir(parents=True)
    demo.train_demo(out, TINY_RECIPE)
    assert sorted(p.name for p in parent.iterdir()) == ["model"]  # no ../data, no ../demo_work
    names = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "training.json",
        "heads/config.json",
        "data/demo_prompts.jsonl",
        "data/demo_prompts_validation.jsonl",
        ".work/base.pt",
        ".work/heads.pt",
        ".work/recipe.json",
    } <= names
    assert all(n.startswith((".work/", "heads/", "data/")) or "/" not in n for n in names)


def test_demo_train_refuses_other_recipes_and_crafted_checkpoints(tmp_path, fake_stdlib):
    out, work_dir = tmp_path / "model", tmp_path / "work"
    demo.train_demo(out, TINY_RECIPE, work_dir=work_dir)
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match=r"work: holds the work of another recipe or seed \(seed differ\)"):
        demo.train_demo(out, DemoRecipe(**{**TINY_RECIPE.__dict__, "seed": 1}), work_dir=work_dir)
    assert snapshot(tmp_path) == before

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    torch.save(Payload(), work_dir / "base.pt")
    with pytest.raises(UserError) as err:
        demo.train_demo(out, TINY_RECIPE, work_dir=work_dir)
    assert not (tmp_path / "pwned").exists()
    message = str(err.value)
    assert message.startswith(f"{work_dir / 'base.pt'}: not a demo training checkpoint (holds Python objects")
    assert "\n" not in message and "weights_only" not in message
    (work_dir / "base.pt").write_bytes(b"not a torch file at all")
    with pytest.raises(UserError, match="base.pt: not a demo training checkpoint"):
        demo.train_demo(out, TINY_RECIPE, work_dir=work_dir)


def test_accuracy_run_id_must_be_a_string(tmp_path):
    doc = {
        "format": "treeopt.accuracy/v1",
        "num_heads": 1,
        "width": 1,
        "heads": [{"head": 1, "positions": 2, "hits": [1]}],
        "provenance": {"run_id": 5},
    }
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"acc\.json: field 'provenance\.run_id' must be a string, got 5"):
        load_accuracy(path)


def test_atomic_folder_replaces_a_report_whole_or_not_at_all(tmp_path):
    from treeopt.fileio import atomic_folder

    report = tmp_path / "report"
    report.mkdir()
    (report / "index.md").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_folder(report) as folder:
            (folder / "index.md").write_text("new")
            raise RuntimeError("the plot failed")
    assert (report / "index.md").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary left
    with atomic_folder(report) as folder:
        (folder / "index.md").write_text("new")
        (folder / "grid.csv").write_text("x")
    assert sorted(p.name for p in report.iterdir()) == ["grid.csv", "index.md"]
    assert (report / "index.md").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


# A writer killed mid-write (SIGKILL runs no cleanup) leaves its temporary; the next holder of the
# output's lock removes its family of temporaries and nothing else.
KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from treeopt.fileio import atomic_path
    with atomic_path(sys.argv[1]) as tmp:
        tmp.write_text("half a file")
        os.kill(os.getpid(), signal.SIGKILL)
""")


def _killed_writer(output: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(output)], env=env)
    assert proc.returncode == -signal.SIGKILL


def test_the_next_writer_removes_what_a_killed_writer_left(tmp_path):
    for name in ("sweep.csv", "sweep.meta.json", "sweep.samples.npz", "other.csv"):
        _killed_writer(tmp_path / name)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 4 and all(n.endswith(".tmp") for n in left)
    (tmp_path / "sweep-notes.tmp").write_text("a user's file")  # not a treeopt temporary
    with output_lock(tmp_path / "sweep.csv"):
        pass
    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert len(remaining) == 2 and "sweep-notes.tmp" in remaining
    assert [n for n in remaining if n != "sweep-notes.tmp"][0].startswith(".other.csv.")


def test_a_run_folder_lock_removes_temporaries_anywhere_in_the_folder(tmp_path):
    (tmp_path / "prediction").mkdir()
    _killed_writer(tmp_path / "prediction" / "grid.csv")
    (tmp_path / ".prediction.x1y2.tmp").mkdir()  # an atomic_folder cut short
    (tmp_path / ".prediction.x1y2.tmp" / "grid.csv").write_text("partial")
    _killed_writer(tmp_path / "selection.json")
    with output_lock(tmp_path / "run_state.json", whole_folder=True):
        pass
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["prediction"]


def test_a_resumed_sweep_leaves_no_temporary(tmp_path):
    out = tmp_path / "sweep.csv"
    _killed_writer(out)
    _killed_writer(tmp_path / "sweep.meta.json")
    args = ["--accuracy", str(REPO / "reports" / "demo-cpu" / "accuracy.json"), "--sizes", "0,1"]
    args += ["--batch", "1", "--context", "16", "--repeats", "5", "--budget", "0", "--threads", "1", "-o", str(out)]
    proc = subprocess.run([sys.executable, "-m", "treeopt", "sweep", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "sweep.meta.json", "sweep.samples.npz"]


# --------------------------------------------------------------------------------------------
# the commands that load torch: outputs inside the package, a shared checkpoint (issue 47)


@pytest.mark.parametrize(
    "argv",
    [
        f"hw calibrate -o {REPO / 'roofline' / 'data' / 'engine_presets.json'}",
        f"calibrate -o {DEMO_HEADS_DIR / 'config.json'}",
        f"calibrate -o {DEMO_PROMPTS}",
        f"demo train -o {DEMO_MODEL_DIR}",
        f"demo train-drafters -o {DEMO_MODEL_DIR}",
    ],
    ids=["hw-calibrate", "calibrate-demo-heads", "calibrate-demo-prompts", "demo-train", "demo-train-drafters"],
)
def test_the_files_demo_resolves_to_are_never_outputs(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    refused_in_package(argv, capsys)


def test_a_shared_checkpoint_is_locked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with held_by_another_process(tmp_path / "shared.partial") as pid:
        refused(
            "calibrate --model demo --data demo --checkpoint shared.partial -o other.json",
            capsys,
            f"shared.partial: is being written by another treeopt process (pid {pid})",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------
# a damaged model: refused in one line before (config) or right after (tensors) it loads


def _damaged_copy(tiny: Path, tmp_path: Path, **config) -> Path:
    model = tmp_path / "m"
    shutil.copytree(tiny, model)
    doc = json.loads((model / "config.json").read_text())
    doc.update(config)
    (model / "config.json").write_text(json.dumps(doc))  # NaN written as JSON's usual NaN token
    return model


@pytest.mark.parametrize(
    "config, words",
    [
        ({"rms_norm_eps": float("nan")}, "config.json: rms_norm_eps: must be a finite number, got nan"),
        ({"rms_norm_eps": 0.0}, "config.json: rms_norm_eps: must be in (0, 1), got 0.0"),
        ({"num_hidden_layers": 0}, "config.json: num_hidden_layers: must be a whole number >= 1, got 0"),
    ],
    ids=["eps-nan", "eps-zero", "no-layers"],
)
def test_a_model_config_that_would_calibrate_a_wrong_table_is_refused(tiny, tmp_path, config, words):
    model = _damaged_copy(tiny, tmp_path, **config)
    with pytest.raises(UserError) as err:
        load_model(str(model), device="cpu", dtype="float32")
    assert str(err.value) == f"{model / 'config.json'}: {words.split('config.json: ', 1)[1]}"


def test_a_checkpoint_lacking_a_tensor_is_refused_in_one_line(tiny, tmp_path, capsys):
    """transformers would initialise the missing tensor at random and print a load report."""
    from safetensors.torch import load_file, save_file

    model = _damaged_copy(tiny, tmp_path)
    weights = load_file(model / "model.safetensors")
    missing = sorted(k for k in weights if ".layers.0." in k)[0]
    del weights[missing]
    weights["extra.weight"] = torch.zeros(2)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError) as err:
        load_model(str(model), device="cpu", dtype="float32")
    assert str(err.value) == f"--model: {model}: the checkpoint lacks tensor {missing}"
    captured = capsys.readouterr()
    assert "LOAD REPORT" not in captured.err + captured.out  # transformers' report held back
