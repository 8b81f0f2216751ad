"""Nothing overwritten, nothing refused too late: the command side of the reliability suite
(docs/formats.md#output-safety, issue 47's cases).

Every case runs `treeopt ARGS` in-process in a fresh folder of valid inputs written in the real
formats (an accuracy table with its rank-vector sidecar, a hardware profile) and asserts what a
user relies on: exit status 2, one line on stderr naming the file, no traceback, and nothing
created, changed or removed, neither in the folder nor at the path the output named (a device
node stays a device, the package's files keep their bytes). No model is loaded: these are fast.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import treeopt
from treeopt.acceptance import rank_vectors_path, save_rank_vectors
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.cli import main
from treeopt.errors import UserError
from treeopt.fileio import (
    MAX_INPUT_BYTES,
    MAX_NAME_BYTES,
    atomic_folder,
    atomic_outputs,
    atomic_path,
    check_writable,
    package_folders,
    refuse_unsafe_output,
)
from treeopt.npz_input import read_npz

REPO = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict:
    """Every entry under `folder`: files by their bytes, links by their target, folders."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """A folder holding acc.json and its rank-vector sidecar (the layout `calibrate` writes)."""
    rng = np.random.default_rng(0)
    ranks = np.minimum(rng.geometric(0.5, size=(300, 3)) - 1, 4)
    table = AccuracyTable.from_ranks(ranks, 5, provenance={"model": "tiny", "run_id": "0123456789abcdef"})
    table.save(tmp_path / "acc.json")
    save_rank_vectors(rank_vectors_path(tmp_path / "acc.json"), ranks, np.arange(300), 5, run_id="0123456789abcdef")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(argv: str, capsys, words: str = "") -> str:
    """Run the command; assert exit 2 and one error line (holding `words`); return the line."""
    with pytest.raises(SystemExit) as exc:
        main(shlex.split(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("treeopt: error: "), err
    assert words.lower() in lines[0].lower(), lines[0]
    return lines[0]


# --------------------------------------------------------------------------------------------
# outputs that would destroy something


def test_a_device_as_output_is_refused_and_stays_a_device(work, capsys):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    before = os.stat("/dev/full")
    refused(
        "build --accuracy acc.json --nodes 4 -o /dev/full", capsys, "/dev/full: cannot write: is not a regular file"
    )
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_a_fifo_as_output_is_refused_without_opening_it(work, capsys):
    os.mkfifo(work / "pipe")
    before = snapshot(work)
    refused("build --accuracy acc.json --nodes 4 -o pipe", capsys, "pipe: cannot write: is not a regular file")
    assert snapshot(work) == before and stat.S_ISFIFO(os.stat(work / "pipe").st_mode)


@pytest.mark.parametrize("sidecar", ["acc.ranks.npz", "acc.alpha.json"])
def test_a_sidecar_of_an_input_is_never_an_output(work, capsys, sidecar):
    if sidecar == "acc.alpha.json":
        (work / sidecar).write_text("{}")
    before = snapshot(work)
    refused(f"build --accuracy acc.json --nodes 4 -o {sidecar}", capsys, "is also an input")
    assert snapshot(work) == before


def test_a_file_of_an_input_model_folder_is_never_an_output(tmp_path):
    from treeopt.cli.safety import check_outputs, input_files

    model = tmp_path / "m"
    (model / "heads").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "heads/config.json", "heads/x.safetensors"):
        (model / name).write_text("{}")
    for name in ("model.safetensors", "tokenizer.json", "heads/x.safetensors"):
        with pytest.raises(UserError, match="is also an input"):
            check_outputs([model / name], input_files(str(model)))
    check_outputs([model / "accuracy.json"], input_files(str(model)))  # a new file beside it is fine


def package_file_cases():
    """Commands that load no torch; those that do are in tests/test_reliability.py."""
    treeopt_dir, calibration_dir, _ = package_folders()
    return [
        f"build --accuracy acc.json --nodes 4 -o {treeopt_dir / 'data' / 'medusa_trees.json'}",
        f"build --accuracy acc.json --nodes 4 -o {calibration_dir / 'demo_model' / 'heads' / 'config.json'}",
        f"report --model llama-7b --hardware a100 -o {treeopt_dir.parent}",
    ]


def refused_in_package(argv: str, capsys) -> None:
    target = Path(argv.split(" -o ")[1])
    before = target.read_bytes() if target.is_file() else None
    line = refused(argv, capsys, "package")
    assert "installed" in line
    if before is not None:
        assert target.read_bytes() == before


@pytest.mark.parametrize("argv", package_file_cases(), ids=["trees", "demo-heads", "report-holding-packages"])
def test_nothing_is_written_inside_the_installed_packages(work, capsys, argv):
    """The bundled files `--data demo` and the demo model resolve to, the reference trees and the
    engine presets are inputs of every run: an output there is refused before any work."""
    refused_in_package(argv, capsys)


def test_a_file_name_ending_in_a_slash_writes_no_file(work, capsys):
    before = snapshot(work)
    refused("build --accuracy acc.json --nodes 4 -o newdir/", capsys, "newdir/: names a folder")
    assert snapshot(work) == before


def test_a_name_too_long_for_the_file_system_is_one_line(work, capsys):
    refused(f"build --accuracy acc.json --nodes 4 -o {'x' * 300}", capsys, "file name too long (300 bytes")
    # the longest name accepted still leaves room for its temporary beside it
    with atomic_path(work / ("y" * MAX_NAME_BYTES)) as tmp:
        tmp.write_text("ok")
    assert (work / ("y" * MAX_NAME_BYTES)).read_text() == "ok"


def test_the_library_writers_refuse_the_same_targets(tmp_path):
    """The check sits in the writers too, so a Python caller cannot replace a device or a
    package file either."""
    treeopt_dir = package_folders()[0]
    for writer in (
        lambda: atomic_path(treeopt_dir / "data" / "medusa_trees.json").__enter__(),
        lambda: atomic_outputs().__enter__().path("/dev/null"),
        lambda: atomic_folder(treeopt_dir.parent).__enter__(),
    ):
        with pytest.raises(UserError, match="installed|not a regular file|holds"):
            writer()
    with pytest.raises(UserError, match="names a folder"):
        check_writable([str(tmp_path / "newdir") + "/"])
    refuse_unsafe_output(tmp_path / "fresh.json")  # a new path is fine
    refuse_unsafe_output(tmp_path, folder=True)  # so is an existing output folder


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, code):
    (tmp_path / "out.json").write_text("old")
    with pytest.raises(UserError) as err, atomic_path(tmp_path / "out.json"):
        raise OSError(code, os.strerror(code))
    assert str(err.value) == f"{tmp_path / 'out.json'}: cannot write ({os.strerror(code)}); nothing was written"
    with pytest.raises(UserError, match="cannot write"), atomic_outputs() as out:
        out.path(tmp_path / "a.json").write_text("new")
        raise OSError(code, os.strerror(code))
    assert snapshot(tmp_path) == {"out.json": b"old"}


def test_other_errors_while_writing_are_not_disguised(tmp_path):
    with pytest.raises(KeyError), atomic_path(tmp_path / "out.json"):
        raise KeyError("a bug stays a bug")
    assert snapshot(tmp_path) == {}


# --------------------------------------------------------------------------------------------
# every writer locked, SIGTERM as Ctrl-C

HOLDER = textwrap.dedent("""
    import sys
    from treeopt.fileio import output_lock
    with output_lock(sys.argv[1]):
        print("locked", flush=True)
        sys.stdin.readline()
""")


@contextlib.contextmanager
def held_by_another_process(output: Path):
    """`output` locked by a second process (as a running treeopt writer holds it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(output)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield proc.pid
    finally:
        proc.communicate("done\n", timeout=60)


@pytest.mark.parametrize(
    "argv, locked",
    [
        ("build --accuracy acc.json --nodes 4 -o tree.json", "tree.json"),
        ("buffers [[0],[1]] -o tree.json", "tree.json"),
        (
            "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json --batch 1 --context 128 -o g.csv",
            "g.csv",
        ),
        ("report --model llama-7b --hardware a100 --accuracy acc.json -o rep", "rep"),
    ],
    ids=["build", "buffers", "speedup", "report"],
)
def test_a_second_writer_of_the_same_output_fails_at_once(work, capsys, argv, locked):
    with held_by_another_process(work / locked) as pid:
        before = snapshot(work)
        refused(argv, capsys, f"{locked}: is being written by another treeopt process (pid {pid})")
        assert snapshot(work) == before


def test_a_file_inside_a_folder_being_written_is_refused(work, capsys):
    """`run -o R` locks R whole: a build (or calibrate) writing R/x.json beside it fails at once."""
    (work / "R").mkdir()
    with held_by_another_process(work / "R") as pid:
        before = snapshot(work)
        refused("build --accuracy acc.json --nodes 4 -o R/tree.json", capsys, f"(pid {pid}) is writing")
        assert snapshot(work) == before


SLOW_WRITER = textwrap.dedent("""
    import sys, time
    import click
    from treeopt import cli
    from treeopt.fileio import atomic_path

    @cli.cli.command("slow")
    def slow():
        with atomic_path(sys.argv[1]) as tmp:
            tmp.write_text("half")
            print("writing", flush=True)
            time.sleep(60)

    cli.main(["slow"])
""")


def test_sigterm_stops_as_ctrl_c_does_with_a_word(tmp_path):
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip() == "treeopt: terminated (SIGTERM)"
    assert list(tmp_path.iterdir()) == []  # the temporary removed, as after Ctrl-C


#: What pip's console script does (`from MODULE import FUNCTION; sys.exit(FUNCTION())`, with the
#: target read from pyproject.toml), with a real SIGINT sent to the process at the moment the
#: command line starts importing click: Ctrl-C in its first ~0.3 s, made deterministic.
CTRL_C_WHILE_STARTING = textwrap.dedent("""
    import importlib, os, signal, sys, tomllib

    target = tomllib.load(open(sys.argv[1], "rb"))["project"]["scripts"]["treeopt"]
    module, function = target.split(":")

    class CtrlCOnClick:
        def find_spec(self, name, path=None, target=None):
            if name == "click":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, CtrlCOnClick())
    sys.argv = ["treeopt", "build", "--help"]
    sys.exit(getattr(importlib.import_module(module), function)())
""")


def test_ctrl_c_while_the_console_script_imports_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-c", CTRL_C_WHILE_STARTING, str(REPO / "pyproject.toml")]
    out = subprocess.run(run, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert (out.returncode, out.stderr, out.stdout) == (130, "treeopt: interrupted\n", "")
    python_m = [sys.executable, "-m", "treeopt", "build", "--help"]  # the same entry as `python -m treeopt`
    assert subprocess.run(python_m, capture_output=True, env=env, cwd=tmp_path, timeout=120).returncode == 0


def test_stdout_full_or_closed(work):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "treeopt", "build", "--accuracy", "acc.json", "--nodes", "4"]
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            out = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env, cwd=work)
        assert out.returncode == 2 and out.stderr == "treeopt: error: stdout: cannot write (No space left on device)\n"
    closed = subprocess.run(["sh", "-c", '"$@" >&-', "sh", *argv], stderr=subprocess.PIPE, text=True, env=env, cwd=work)
    assert closed.returncode == 0 and closed.stderr == ""  # as a reader gone (`| head -0`)


# --------------------------------------------------------------------------------------------
# inputs that would exhaust the machine: refused by kind and size before they are read


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_as_input_is_refused_without_reading(work, capsys, device):
    if not Path(device).exists():
        pytest.skip(f"no {device} here")
    refused(f"build --accuracy {device} --nodes 4", capsys, f"{device}: is not a regular file")


def test_a_fifo_as_input_is_refused_without_opening_it(work, capsys):
    """Opening a FIFO without a writer would wait forever: it is told by its kind, not opened."""
    os.mkfifo(work / "pipe.json")
    refused("build --accuracy pipe.json --nodes 4", capsys, "pipe.json: is not a regular file")


def test_input_sizes_are_bounded_before_reading(tmp_path):
    from calibration.data import MAX_TEXT_BYTES, check_prompt_source

    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:  # sparse: the size is claimed without the disk holding it
        fh.truncate(MAX_TEXT_BYTES + 1)
    with pytest.raises(UserError, match=r"big\.txt: 64\.0 MiB, more than a text file of prompts may be"):
        check_prompt_source(big)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_INPUT_BYTES + 1)
    with pytest.raises(UserError, match=r"huge\.json: 1\.0 GiB, more than an accuracy file may be"):
        load_accuracy(huge)


# --------------------------------------------------------------------------------------------
# late or multi-line errors: one line, exit 2, in the real formats


def _npy_header_claiming(shape: tuple, dtype: str) -> bytes:
    """An .npy member whose header claims `shape` but holds no data (numpy's documented layout)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _npz_with(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(f"{name}.npy", data)


def test_a_rank_sidecar_claiming_a_huge_array_is_refused_before_allocating(work):
    """The tau curves walk the sidecar beside a JSON table (`treeopt.tau.load_tau_curves`, what
    `sweep`, `validate` and `run` read): numpy would allocate 745 GiB from the header first."""
    from treeopt.tau import load_tau_curves

    _npz_with(work / "acc.ranks.npz", {"ranks": _npy_header_claiming((10**11, 4), "<i2")})
    with pytest.raises(UserError) as err:
        load_tau_curves(work / "acc.json", 4)
    assert str(err.value).startswith(f"{work / 'acc.ranks.npz'}: 'ranks' claims shape (100000000000, 4) of int16")
    assert "745 GiB" in str(err.value)


def test_python_objects_in_an_npz_are_refused_without_numpys_pickle_advice(tmp_path):
    np.savez(tmp_path / "acc.ranks.npz", ranks=np.array([{"a": 1}], dtype=object))
    with pytest.raises(UserError) as err:
        read_npz(tmp_path / "acc.ranks.npz", "a rank-vector file")
    assert "Python objects" in str(err.value) and "allow_pickle" not in str(err.value)


def _samples(path: Path, **columns) -> None:
    """A sweep samples file (docs/formats.md): one cell of batch 1, context 128, sizes 0 and 4,
    two rounds, with `columns` replacing the named arrays."""
    arrays = {
        "batch": np.array([1, 1, 1, 1]),
        "context": np.array([128, 128, 128, 128]),
        "nodes": np.array([0, 4, 0, 4]),
        "round": np.array([0, 0, 1, 1]),
        "seconds": np.array([0.010, 0.012, 0.011, 0.012]),
    }
    np.savez(path, **{**arrays, **columns})


@pytest.mark.parametrize(
    "columns, words",
    [
        ({"seconds": np.array([0.01, 0.012, 0.011])}, "equally long"),
        ({"round": np.array([0, 0, -1, -1])}, "'round' must hold integers >= 0"),
        ({"round": np.array([0, 0, 10**12, 10**12])}, "incomplete rounds"),
        ({"seconds": np.array([0.01, -0.012, 0.011, 0.0])}, "finite step times > 0"),
    ],
    ids=["unequal", "negative-round", "huge-round", "negative-seconds"],
)
def test_a_damaged_samples_file_is_one_line(tmp_path, columns, words):
    from treeopt.selection import read_round_samples

    _samples(tmp_path / "s.samples.npz", **columns)
    with pytest.raises(UserError, match=words):
        read_round_samples(tmp_path / "s.samples.npz")
    _samples(tmp_path / "good.samples.npz")
    sizes, x = read_round_samples(tmp_path / "good.samples.npz")[(1, 128)]
    assert sizes == [0, 4] and x.tolist() == [[0.010, 0.012], [0.011, 0.012]]


@pytest.fixture
def selection(work) -> Path:
    """A selection written by `roofline speedup --select` (treeopt.selection/v1)."""
    main(
        shlex.split(
            "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json --batch 1,4 "
            "--context 128 --max-nodes 8 --select sel.json"
        )
    )
    return work / "sel.json"


def test_a_cell_reference_with_a_unicode_digit_is_the_projects_error(selection, capsys):
    capsys.readouterr()
    refused("buffers sel.json:batch=²", capsys, "the cell must be 'batch=B,context=S'")
    with pytest.raises(UserError, match="the cell must be"):
        treeopt.load_tree("sel.json:batch=²")
    treeopt.load_tree("sel.json:batch=1")  # the ASCII digit still names the cell


def test_a_selection_whose_cells_hold_a_number_is_one_line(selection, capsys):
    doc = json.loads(selection.read_text())
    doc["cells"][0] = 7
    selection.write_text(json.dumps(doc))
    capsys.readouterr()
    refused("buffers sel.json:batch=1", capsys, "cells[0] is int, expected an object")


def test_duplicate_json_keys_are_refused_not_silently_kept_last(work, capsys):
    text = (work / "acc.json").read_text()
    (work / "dup.json").write_text(text.replace('"num_heads":', '"num_heads": 9, "num_heads":', 1))
    refused("build --accuracy dup.json --nodes 4", capsys, "dup.json: the key 'num_heads' is given twice")


@pytest.mark.parametrize(
    "argv, words",
    [
        ("build --accuracy acc.json --nodes 4 -o {long}", "file name too long"),
        (
            "roofline speedup --model llama-7b --hardware a100 --accuracy acc.json --mix 1:1e308,4:1e308 "
            "--batch 1,4 --context 128 --max-nodes 4 -o {long}",
            "file name too long",
        ),
        ("select --grid g.csv --threshold -1", "--threshold: must be a finite number >= 0"),
        ("sweep --model demo --accuracy acc.json --repeats 1000000000 -o s.csv", "--repeats: must be at most 10000"),
    ],
    ids=["name-300", "mix-overflow-name-300", "threshold-negative", "repeats-huge"],
)
def test_implausible_options_are_one_line(work, capsys, argv, words):
    refused(argv.format(long="x" * 300), capsys, words)


@pytest.mark.parametrize(
    "option, words",
    [
        ("--num-heads 1000000", "--num-heads: must be at most 64"),
        ("--head-layers 100000", "--head-layers: must be at most 64"),
    ],
)
def test_draft_heads_beyond_any_drafter_are_one_line(work, capsys, option, words):
    """A million heads priced every speculative step at hours and wrote the profile, exit 0."""
    (work / "steps.csv").write_text("batch,context,tokens,step_ms\n1,128,1,10\n4,512,1,12\n8,1024,1,15\n")
    before = snapshot(work)
    refused(f"hw fit --model llama-7b --hardware a100 --measurements steps.csv {option} -o fit.json", capsys, words)
    refused(f"roofline speedup --model llama-7b --hardware a100 --accuracy acc.json --batch 1 {option}", capsys, words)
    assert snapshot(work) == before
    from roofline.shapes import DraftHeadsShape

    with pytest.raises(UserError, match="'num_heads' is 1000000, beyond any drafter's"):
        DraftHeadsShape(1_000_000, 1, 4096, 32000)  # the library refuses what the API passes on too
    DraftHeadsShape(64, 64, 4096, 32000)  # the largest accepted


def test_mix_weights_near_the_float_maximum_stay_finite():
    from treeopt.mix import parse_mix

    mix = parse_mix("1:1e308,4:1e308")
    assert mix.weight == (0.5, 0.5)  # equal weights, not inf / inf


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("eta_compute", 1.5, "'eta_compute' is a fraction of the peak, at most 1"),
        ("forward_overhead_s", 1e300, "'forward_overhead_s' is 1e+300 s"),
    ],
)
def test_implausible_hardware_profiles_are_refused(work, capsys, key, value, words):
    main(shlex.split("hw list --json"))
    profile = json.loads(capsys.readouterr().out)[0]
    profile[key] = value
    (work / "hw.json").write_text(json.dumps(profile))
    refused(
        "roofline speedup --model llama-7b --hardware hw.json --accuracy acc.json --batch 1 --context 128",
        capsys,
        words,
    )


def test_source_date_epoch_past_year_9999_is_one_line(work, capsys, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "99999999999999999999")
    refused("build --accuracy acc.json --nodes 4", capsys, "SOURCE_DATE_EPOCH: '99999999999999999999' is not")


def test_the_api_raises_the_projects_error_for_none():
    with pytest.raises(UserError):
        treeopt.load_accuracy(None)
    with pytest.raises(UserError):
        treeopt.build_tree(None, 8)


def test_prompt_records_nested_deep_or_holding_a_lone_surrogate_are_one_line(tmp_path):
    from calibration.data import check_prompt_source

    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"messages": ' + "[" * 50_000 + "]" * 50_000 + "}\n")
    with pytest.raises(UserError, match=r"deep\.jsonl:1: JSON nested too deeply"):
        check_prompt_source(deep)
    lone = tmp_path / "lone.jsonl"
    lone.write_text('{"prompt": "def f(): \\ud800"}\n')
    with pytest.raises(UserError, match=r"lone\.jsonl:1: the user text holds a lone surrogate \(\\ud800\)"):
        check_prompt_source(lone)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"prompt": "a", "prompt": "b"}\n')
    with pytest.raises(UserError, match="given twice"):
        check_prompt_source(dup)


def _write_sweep(folder: Path) -> None:
    """A sweep as `treeopt sweep` writes it (docs/formats.md): the CSV of one cell, batch 1 and
    context 128, sizes 0 to 2, its metadata and the per-round samples of three rounds."""
    import pandas as pd

    from treeopt.selection import SWEEP_COLUMNS, write_round_samples

    tau, step = [1.0, 1.6, 1.9], [0.010, 0.011, 0.012]
    rows = [
        {
            "batch": 1,
            "context": 128,
            "nodes": n,
            "tau": tau[n],
            "tau_independent": tau[n],
            "overhead": step[n] / step[0],
            "speedup": tau[n] * step[0] / step[n],
            "step_time_s": step[n],
        }
        for n in range(3)
    ]
    pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS).to_csv(folder / "sweep.csv", index=False)
    meta = {
        "format": "treeopt.sweep/v1",
        "proposal": [[0], [0, 0]],
        "measurement": {"sizes": [0, 1, 2], "repeats": 3, "confidence": 0.95},
    }
    (folder / "sweep.meta.json").write_text(json.dumps(meta))
    rounds = np.array([step, step, step]) * np.array([[1.0], [1.01], [0.99]])
    write_round_samples(folder / "sweep.samples.npz", {(1, 128): ([0, 1, 2], rounds)})


def _damage_meta(folder: Path, **measurement) -> None:
    meta = json.loads((folder / "sweep.meta.json").read_text())
    meta.update(measurement.pop("top", {}))
    meta["measurement"].update(measurement)
    (folder / "sweep.meta.json").write_text(json.dumps(meta))


def _samples_elsewhere(folder: Path) -> None:
    from treeopt.selection import write_round_samples

    write_round_samples(folder / "sweep.samples.npz", {(8, 4096): ([0, 1, 2], np.full((3, 3), 0.01))})


def _samples_folder(folder: Path) -> None:
    (folder / "sweep.samples.npz").unlink()
    (folder / "sweep.samples.npz").mkdir()


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda f: _damage_meta(f, confidence=1.5), "measurement.confidence must be in [0.5, 1), got 1.5"),
        (lambda f: _damage_meta(f, repeats=0), "measurement.repeats must be a whole number >= 1, got 0"),
        (
            lambda f: _damage_meta(f, top={"format": "treeopt.sweep/v9"}),
            "format 'treeopt.sweep/v9', this treeopt reads",
        ),
        (_samples_elsewhere, "batch 8 context 4096, a cell the sweep CSV has not"),
        (_samples_folder, "sweep.samples.npz: is a directory"),
    ],
    ids=["confidence", "repeats", "future-format", "samples-other-cells", "samples-directory"],
)
def test_damaged_sweep_sidecars_are_one_line(work, capsys, damage, words):
    _write_sweep(work)
    main(shlex.split("select --sweep sweep.csv"))  # the undamaged sweep is read
    capsys.readouterr()
    damage(work)
    refused("select --sweep sweep.csv", capsys, words)
