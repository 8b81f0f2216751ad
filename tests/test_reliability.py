"""Nothing lost, nothing overwritten, no traceback: the library side of issue 13.

Output safety (treeopt/fileio.py), the calibration commit and checkpoint windows under fault
injection, concurrent writers, the table/sidecar fingerprint, size guards, the exact optimum on
wide tables, and torch messages cut to one line. The expected values come from independent
sources: the filesystem itself, an uninterrupted run, a reference dynamic program and brute
force, hand-derived byte counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    for out in (acc, tmp_path / "link.json", tmp_path / "hard.json",
                tmp_path / "sub" / ".." / "acc.json", tmp_path / "dirlink" / "acc.json"):
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
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(output)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_fails_at_once_naming_the_holder(tmp_path):
    output = tmp_path / "acc.json"
    holder = start_holder(output)
    try:
        with pytest.raises(UserError) as err, output_lock(output):
            pass
        assert str(err.value) == (f"{output}: is being written by another treeopt process "
                                  f"(pid {holder.pid})")
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
    with output_lock(tmp_path / "a.json"), output_lock(tmp_path / "b.json"):
        with pytest.raises(UserError, match="another treeopt process"), \
                output_lock(tmp_path / "a.json"):
            pass


# --------------------------------------------------------------------------------------------
# the exact optimum on wide tables


def reference_dp(acc: np.ndarray, n: int, widths: list[int]) -> float:
    """The tree-knapsack dynamic program over every rank (docs/builders.md "Exact optimum"):
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
    capacity = sum(int(np.prod(widths[:d + 1])) for d in range(K))
    n = min(n, capacity)
    tree = optimal_tree(acc, n, max_children=widths)
    assert tree.size == n and all(p[d] < widths[d] for p in tree.paths for d in range(len(p)))
    assert tau(tree, acc) == pytest.approx(reference_dp(acc, n, widths), rel=1e-12, abs=1e-12)


def test_optimal_on_a_wide_non_monotone_table_beats_the_top_ranks():
    # head 1's best rank is 700 and head 2's is 3: the tree must reach them
    acc = np.full((2, 1000), 0.001)
    acc[0, 700], acc[0, 5], acc[1, 3], acc[1, 999] = 0.6, 0.3, 0.5, 0.4
    tree = optimal_tree(acc, 3)
    # hand-derived: [700] .6, [700, 3] .3, [700, 999] .24, [5] .3 -> the best three
    assert set(tree.paths) == {(700,), (700, 3), (5,)}
    assert tau(tree, acc) == pytest.approx(1 + 0.6 + 0.3 + 0.3)
    assert tree.paths[0] == (700,)  # every prefix is a tree


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
    import torch  # noqa: PLC0415 - torch only here: the rest of this module is torch-free

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
    assert first_line("Bad thing. Re-run with weights_only=False to load it.") == "Bad thing."
    assert first_line(KeyError()) == "KeyError"

