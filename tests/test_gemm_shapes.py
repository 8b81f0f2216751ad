"""The shape-aware GEMM model (roofline/gemm_shapes.py) and its data, Vidur's per-shape GEMM
timings (roofline/data/vidur-gemm-shapes.csv;
docs/performance-model.md#shape-aware-gemm-efficiency)."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.gemm_shapes import (
    DIES,
    ShapeParams,
    fit_shape_params,
    gemm_time_s,
    shape_timings,
    tile_terms,
    tile_waves,
)
from roofline.hardware import GemmTiles, HardwareProfile, load_hardware
from roofline.latency import gemm_timing, step_time_s
from roofline.profile_fit import apply_terms
from roofline.shapes import model_shape
from treeopt.errors import UserError


def _time(gpu, model, tp, k, n, rows):
    for s in shape_timings(gpu):
        if s.model == model and s.tp == tp and (s.k, s.n) == (k, n):
            return s.time_ms[s.rows.index(rows)]
    raise KeyError((gpu, model, tp, k, n))


# Typed from github.com/microsoft/vidur at 7d47513, data/profiling/compute/<gpu>/<org>/<model>/mlp.csv,
# column time_stats.<operator>.median, the first row with that num_tokens and num_tensor_parallel_workers.
@pytest.mark.parametrize(
    ("gpu", "model", "tp", "k", "n", "rows", "ms"),
    [
        # a100/codellama/CodeLlama-34b-Instruct-hf/mlp.csv, mlp_up_proj (8192 -> 2 x 22016)
        ("a100", "CodeLlama-34b-Instruct-hf", 1, 8192, 44032, 1, 0.447),
        ("a100", "CodeLlama-34b-Instruct-hf", 1, 8192, 44032, 128, 0.508),
        # a100/meta-llama/Llama-2-70b-hf/mlp.csv, tp 8, mlp_down_proj (28672 / 8 -> 8192)
        ("a100", "Llama-2-70b-hf", 8, 3584, 8192, 256, 0.109),
        # h100/internlm/internlm-20b/mlp.csv, tp 4, attn_pre_proj (5120 -> 3 x 5120 / 4)
        ("h100", "internlm-20b", 4, 5120, 3840, 64, 0.019),
        # h100/microsoft/phi-2/mlp.csv, attn_post_proj (2560 -> 2560); the first of two rows at 4096
        ("h100", "phi-2", 1, 2560, 2560, 4096, 0.0845),
        # a100/Qwen/Qwen-72B/mlp.csv, tp 2, attn_post_proj (8192 / 2 -> 8192)
        ("a100", "Qwen-72B", 2, 4096, 8192, 1024, 0.351),
        # a100/meta-llama/Llama-2-7b-hf/mlp.csv, attn_pre_proj (4096 -> 12288)
        ("a100", "Llama-2-7b-hf", 1, 4096, 12288, 128, 0.0745),
    ],
)
def test_data_matches_vidur(gpu, model, tp, k, n, rows, ms):
    assert _time(gpu, model, tp, k, n, rows) == pytest.approx(ms, abs=1e-9)


def test_sm_counts_are_the_whitepapers():
    assert (DIES["a100"].sms, DIES["h100"].sms, DIES["a40"].sms) == (108, 132, 84)


def test_tile_and_wave_counts_by_hand():
    # ceil(100/128) = 1 row tile x 4096/128 = 32 column tiles = 32 tiles: one wave on 108 SMs
    tiles, waves = tile_waves(100, 4096, 128, 128, 108)
    assert (float(tiles), float(waves)) == (32.0, 1.0)
    # ceil(300/128) = 3 x ceil(11008/128) = 86 -> 258 tiles: ceil(258/108) = 3 waves; split-K 2: 516 -> 5
    tiles, waves = tile_waves(300, 11008, 128, 128, 108)
    assert (float(tiles), float(waves)) == (258.0, 3.0)
    assert float(tile_waves(300, 11008, 128, 128, 108, 2)[1]) == 5.0
    # 129 rows need a second row tile: 2 x 32 = 64 tiles on 132 SMs, one wave
    assert [float(x) for x in tile_waves(129, 4096, 128, 128, 132)] == [64.0, 1.0]


@pytest.fixture(scope="module")
def a100_fit():
    train = [s for s in shape_timings("a100") if s.model == "Llama-2-7b-hf" and s.tp == 1]
    assert len(train) == 4
    return fit_shape_params(train, "a100")


def test_time_rises_with_rows(a100_fit):
    rows = np.arange(1, 4097)
    for k, n in ((8192, 44032), (4096, 4096), (1024, 4096)):
        t = gemm_time_s(rows, k, n, "a100", a100_fit)
        assert np.all(np.diff(t) >= 0)
    p = ShapeParams(0.7, 0.8, 3e-6, 1e11)
    assert np.all(np.diff(gemm_time_s(rows, 5120, 13824, "h100", p)) >= 0)


def test_held_out_33b_shape(a100_fit):
    # fitted on Llama-2-7B's four GEMMs, CodeLlama-34B's gate+up projection (8192 -> 44032) is held
    # out: median |T(r)/T(1) error| over its 30 row counts measured 5.3% (worst 15%) at 7d47513
    s = next(s for s in shape_timings("a100") if s.model == "CodeLlama-34b-Instruct-hf" and s.n == 44032)
    rows = np.asarray(s.rows, dtype=float)
    measured = np.asarray(s.time_ms)
    predicted = gemm_time_s(rows, s.k, s.n, "a100", a100_fit)
    errors = np.abs((predicted / predicted[0]) / (measured / measured[0]) - 1.0)[1:]
    assert np.median(errors) < 0.07
    assert errors.max() < 0.2


def test_full_wave_gemm_costs_its_tiles_flops_and_operands_by_hand():
    # 1024 x 8192 output on 128 SMs: 256 x 256 tiles make 4 x 32 = 128 tiles, one full wave; each
    # tile does 2 * 256 * 256 * 8192 FLOPs at peak / 128 and loads (256 + 256) * 8192 fp16
    # operands at 1e11 B/s. Every other kernel needs two or more waves of the same per-wave work.
    peak, operand = 312e12 * 0.9, 1e11
    compute, _ = tile_terms(1024, 8192, 8192, sms=128, flops_per_s=peak, operand_bytes_per_s=operand, bytes_per_s=2e12)
    by_hand = 2 * 256 * 256 * 8192 / (peak / 128) + 2 * 512 * 8192 / operand
    assert float(compute) == pytest.approx(by_hand, rel=1e-12)


def _tiled_a100():
    return load_hardware("a100-80gb-sxm").with_(gemm_tiles=GemmTiles(108, 0.9, 1e20))


def test_a_tiled_profile_prices_a_weight_gemm_by_its_waves():
    # operands and memory free, 108 SMs, 216 rows x 4096 x 4096. By hand over TILES x SPLITS, the
    # fewest FLOPs per SM: 64 x 64 tiles split 16 ways along K, 4 x 64 x 16 = 4096 tiles in 38
    # waves of 2 * 64 * 64 * 256 FLOPs (or 64 x 128 split 16: 19 waves of twice that), 79,691,776
    # FLOPs per SM, against 67,108,864 for a perfect split of 2 * 216 * 4096 * 4096 over 108 SMs.
    hw = _tiled_a100().with_(bandwidth_bytes_per_s=1e18)
    t = gemm_timing(hw, dtype="fp16", dtype_bytes=2, rows=216, in_features=4096, out_features=4096)
    assert float(t.compute_s) == pytest.approx(38 * 2 * 64 * 64 * 256 / (312e12 * 0.9 / 108), rel=1e-12)
    # the row curve alone does not know the width: 4096 and 22016 columns get one efficiency; with
    # tiles (about the A100's fitted values) the narrow GEMM fills fewer of the 108 SMs' waves than
    # the wide one, and they differ (by 10%)
    plain = load_hardware("a100-80gb-sxm")
    tiled = plain.with_(gemm_tiles=GemmTiles(108, 0.94, 8.7e10))
    e = [
        float(gemm_timing(p, dtype="fp16", dtype_bytes=2, rows=160, in_features=4096, out_features=n).compute_s)
        / (2 * 160 * 4096 * n)
        for p in (plain, tiled)
        for n in (4096, 22016)
    ]
    assert e[0] / e[1] == pytest.approx(1.0, rel=1e-12)
    assert abs(e[2] / e[3] - 1.0) > 0.01


def test_a_tiled_step_never_costs_less_for_more_tokens():
    hw = load_hardware("h100-sxm").with_(gemm_tiles=GemmTiles(132, 1.0, 1.56e11))
    q = np.arange(1, 513)
    t = step_time_s(model_shape("llama-2-7b", dtype="fp16"), None, hw, batch=1, tokens=q, context=512)
    assert np.all(np.diff(t) >= 0)


def test_gemm_tiles_round_trip_and_bad_values():
    hw = _tiled_a100()
    back = HardwareProfile.from_dict(hw.to_dict())
    assert back.gemm_tiles == hw.gemm_tiles
    d = hw.to_dict()
    d["gemm_tiles"] = {"sms": 0, "peak_fraction": 0.9, "operand_bytes_per_s": 1e11}
    with pytest.raises(UserError, match="gemm_tiles.*'sms' must be an integer >= 1"):
        HardwareProfile.from_dict(d, source="my.json")
    d["gemm_tiles"] = {"sms": 108, "peak_fraction": 0.9}
    with pytest.raises(UserError, match="my.json: gemm_tiles"):
        HardwareProfile.from_dict(d, source="my.json")


def test_a_fitted_gemm_scale_speeds_up_the_tiles_too():
    # memory made free, so that the fastest kernel is the same at both speeds
    hw = load_hardware("a100-80gb-sxm").with_(gemm_tiles=GemmTiles(108, 0.9, 1e11), bandwidth_bytes_per_s=1e18)
    fitted = apply_terms(hw, {"gemm_efficiency_scale": 2.0}, (1.0, 2.0))

    def compute(p):
        return float(
            gemm_timing(p, dtype="fp16", dtype_bytes=2, rows=1024, in_features=8192, out_features=8192).compute_s
        )

    assert compute(fitted) == pytest.approx(compute(hw) / 2, rel=1e-9)
