"""Rules defined once in the core and shared by every package: per-rank hit counting, the
Wilson interval, where a model's Medusa heads sit, dtype names, and reading input files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import binomtest

from treeopt.accuracy import rank_hits, wilson_interval
from treeopt.dtypes import DTYPE_BYTES, TORCH_NAMES, dtype_bytes, normalize_dtype
from treeopt.errors import UserError
from treeopt.fileio import read_json_input, read_text_input
from treeopt.layout import default_heads_dir

# --- per-rank hits -----------------------------------------------------------------------------


def brute_hits(ranks, width):
    """Position by position, head by head."""
    num_heads = ranks.shape[1]
    hits = np.zeros((num_heads, width), np.int64)
    positions = np.zeros(num_heads, np.int64)
    for row in ranks.tolist():
        for k, r in enumerate(row):
            if r >= 0:
                positions[k] += 1
                if r < width:
                    hits[k, r] += 1
    return hits, positions


@pytest.mark.parametrize("seed", range(6))
def test_rank_hits_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, num_heads, width = rng.integers(0, 300), rng.integers(1, 6), rng.integers(1, 12)
    # -1 = no label, 0 .. width-1 = hit at that rank, width .. 2 width = miss
    ranks = rng.integers(-1, 2 * width + 1, size=(n, num_heads)).astype(rng.choice([np.int16, np.int64]))
    counts = rank_hits(ranks, int(width))
    hits, positions = brute_hits(ranks, int(width))
    np.testing.assert_array_equal(counts.hits, hits)
    np.testing.assert_array_equal(counts.positions, positions)
    assert counts.hits.shape == (num_heads, width)


def test_rank_hits_by_hand_and_bad_shapes():
    counts = rank_hits([[0, 1, -1], [2, 9, 0], [0, 0, 0], [11, 0, -1]], 10)
    assert counts.positions.tolist() == [4, 4, 2]
    assert counts.hits[0].tolist() == [2, 0, 1] + [0] * 7  # rank 11 is a miss
    assert counts.hits[1].tolist() == [2, 1] + [0] * 7 + [1]
    with pytest.raises(UserError, match=r"ranks: expected an \(N, K\) array"):
        rank_hits(np.zeros(3, np.int64), 4)
    with pytest.raises(UserError, match="width: must be >= 1"):
        rank_hits(np.zeros((3, 2), np.int64), 0)


# --- Wilson interval ---------------------------------------------------------------------------


def test_wilson_interval_hand_computed():
    # 5 of 10 at 95%: centre 0.5, half-width z sqrt(1/40 + z^2/400) / (1 + z^2/10) = 0.2634
    interval = wilson_interval(5, 10)
    assert float(interval.low) == pytest.approx(0.2366, abs=1e-4)
    assert float(interval.high) == pytest.approx(0.7634, abs=1e-4)


def test_wilson_interval_matches_scipy_binomtest_elementwise():
    hits = np.array([[0, 1, 7, 10], [3, 10, 99, 100]])
    n = np.array([[10], [100]])
    for confidence in (0.8, 0.95, 0.99):
        interval = wilson_interval(hits, n, confidence=confidence)
        for (i, j), k in np.ndenumerate(hits):
            expected = binomtest(int(k), int(n[i, 0])).proportion_ci(confidence, method="wilson")
            assert interval.low[i, j] == pytest.approx(expected.low, abs=1e-12)
            assert interval.high[i, j] == pytest.approx(expected.high, abs=1e-12)
    edge = wilson_interval([0, 10, 0], [10, 10, 0])
    assert edge.low[0] == 0.0 and edge.high[1] == 1.0  # exact at the boundaries
    assert np.isnan(edge.low[2]) and np.isnan(edge.high[2])  # no observation, no interval
    with pytest.raises(UserError, match="confidence: must be between 0 and 1"):
        wilson_interval(1, 2, confidence=95)


# --- heads directory ---------------------------------------------------------------------------


def config(path, **fields):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(fields))
    return path


def test_default_heads_dir_rule(tmp_path):
    model = config(tmp_path / "model", model_type="llama")
    assert default_heads_dir(model) is None
    (model / "heads").mkdir()  # a directory without config.json is not heads
    assert default_heads_dir(model) is None
    config(model / "medusa_heads", medusa_num_heads=5)
    assert default_heads_dir(model) == model / "medusa_heads"
    config(model / "heads", medusa_num_heads=3)
    assert default_heads_dir(str(model)) == model / "heads"  # heads/ before medusa_heads/
    # a published Medusa checkpoint is its own heads directory
    published = config(tmp_path / "medusa-vicuna-7b", medusa_num_heads=5, medusa_num_layers=1)
    assert default_heads_dir(published) == published
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{medusa_num_heads")
    assert default_heads_dir(broken) is None
    assert default_heads_dir(tmp_path / "missing") is None


# --- dtype names -------------------------------------------------------------------------------


def test_dtype_names():
    for spelling, canonical in [
        ("float32", "fp32"),
        ("FP32", "fp32"),
        ("torch.bfloat16", "bf16"),
        ("half", "fp16"),
        ("float16", "fp16"),
        ("float8_e4m3fn", "fp8"),
        ("int8", "int8"),
    ]:
        assert normalize_dtype(spelling) == canonical
    assert {name: dtype_bytes(name) for name in DTYPE_BYTES} == {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
    # every canonical name has a torch name, and that name normalises back to it
    assert {normalize_dtype(TORCH_NAMES[name]) for name in DTYPE_BYTES} == set(DTYPE_BYTES)
    with pytest.raises(UserError, match=r"--dtype: unknown dtype 'fp7' \(use one of fp32, bf16"):
        normalize_dtype("fp7", what="--dtype")
    with pytest.raises(UserError, match=r"unknown dtype 'int8' \(use one of fp32, fp16\)"):
        normalize_dtype("int8", choices=("fp32", "fp16"))


# --- input files -------------------------------------------------------------------------------


def test_read_input_files_one_wording(tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(UserError, match=r"nope\.json: no such file \(expected a tree file\)$"):
        read_text_input(missing, "a tree file")
    with pytest.raises(UserError, match=r": is a directory, not a tree file$"):
        read_text_input(tmp_path, "a tree file")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"ok \xe9")
    with pytest.raises(UserError, match=r"latin\.txt: not a UTF-8 text file \(byte 3\)$"):
        read_text_input(latin, "a text file")
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf[1, 2]")
    assert read_json_input(bom, "a JSON file") == [1, 2]
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "a": 1,\n}')
    with pytest.raises(UserError, match=r"broken\.json: not valid JSON \(line 3: "):
        read_json_input(broken, "a JSON file")
