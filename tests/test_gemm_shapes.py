"""The shape-aware GEMM model (roofline/gemm_shapes.py) and its data, Vidur's per-shape GEMM
timings (roofline/data/vidur-gemm-shapes.csv;
docs/performance-model.md#shape-aware-gemm-efficiency-not-yet-in-the-latency-model)."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.gemm_shapes import DIES, ShapeParams, fit_shape_params, gemm_time_s, shape_timings, tile_waves


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
    p = ShapeParams(128, 128, 0.7, 0.8, 3e-6)
    assert np.all(np.diff(gemm_time_s(rows, 5120, 13824, "h100", p)) >= 0)


def test_held_out_33b_shape(a100_fit):
    # fitted on Llama-2-7B's four GEMMs, CodeLlama-34B's gate+up projection (8192 -> 44032) is held
    # out: median |T(r)/T(1) error| over its 30 row counts measured 2.6% (worst 15%) at 7d47513
    s = next(s for s in shape_timings("a100") if s.model == "CodeLlama-34b-Instruct-hf" and s.n == 44032)
    rows = np.asarray(s.rows, dtype=float)
    measured = np.asarray(s.time_ms)
    predicted = gemm_time_s(rows, s.k, s.n, "a100", a100_fit)
    errors = np.abs((predicted / predicted[0]) / (measured / measured[0]) - 1.0)[1:]
    assert np.median(errors) < 0.05
    assert errors.max() < 0.25
