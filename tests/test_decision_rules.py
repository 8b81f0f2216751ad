"""Rules that decide something, each against a value computed outside the code: by hand, by
brute force, or from the documented behaviour (docs/statistics.md#choosing-a-tree-with-intervals,
docs/performance-model.md#engine-presets). Every test here kills a planted bug of
tools/mutants.py that the rest of the suite let live."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from roofline.engine_presets import step_costs
from roofline.hardware import load_hardware
from roofline.speculative import best_gamma
from treeopt.stats import interval, ratio_lower_bounds, sequential_confidence, shipped_confidence


def _ratio_draws(values) -> np.ndarray:
    """Draws of two sizes whose ratio speedup(0) / speedup(1) takes exactly `values`."""
    values = np.asarray(values, dtype=float)
    return np.column_stack([values, np.ones_like(values)])


def test_the_equivalence_bound_is_the_two_sided_95_percent_one_the_selection_states():
    # ratios 1, 2, ..., 100: numpy's (linear) quantile at q sits at 1 + q * 99. The 95% interval
    # the selection states has its lower end at q = 0.025: 1 + 2.475 = 3.475 (a one-sided 95%
    # bound, q = 0.05, would be the 90% interval's end: 5.95)
    low = ratio_lower_bounds(_ratio_draws(np.arange(1, 101)), 0.95)
    assert low[0, 1] == pytest.approx(3.475)
    # the other way round the ratios are 1/100 < 1/99 < ...: position 2.475 lies between 1/98 and 1/97
    assert low[1, 0] == pytest.approx(1 / 98 + 0.475 * (1 / 97 - 1 / 98))
    assert np.diag(low) == pytest.approx([1.0, 1.0])


def test_the_percentile_interval_cuts_half_the_error_rate_from_each_end():
    draws = np.arange(1, 101, dtype=float)[:, None]
    lo, hi = interval(draws, 0.90)  # q = 0.05 and 0.95: 1 + 4.95 and 1 + 94.05
    assert (lo[0], hi[0]) == pytest.approx((5.95, 95.05))


def test_the_shipped_level_spends_the_error_rate_over_the_sizes_bonferroni():
    # 5% over 7 tree sizes: 1 - 0.05 / 7; over 4 looks: 1 - 0.05 / 4 = 98.75% (docs/statistics.md)
    assert shipped_confidence(0.95, 7) == pytest.approx(1 - 0.05 / 7)
    assert sequential_confidence(4, 0.95) == pytest.approx(0.9875)
    assert shipped_confidence(0.95, 0) == pytest.approx(0.95)  # one size at least


def test_engine_costs_beat_the_engines_family_as_documented():
    # --engine medusa is the hf-eager family; --engine-costs ibm-tgis is asked for explicitly and
    # wins (step_costs' docstring; docs/performance-model.md#engine-presets): IBM's published
    # fixed cost per forward, 0.747 ms, not HF eager's 16.9 ms
    costs = step_costs(load_hardware("h100-sxm"), engine="medusa", family="ibm-tgis")
    assert costs.family == "ibm-tgis"
    assert costs.profile.forward_overhead_s == pytest.approx(0.0007473)
    assert step_costs(load_hardware("h100-sxm"), engine="medusa").family == "hf-eager"


def test_a_profile_file_named_like_a_builtin_keeps_its_measured_terms():
    # a profile that keeps the name h100-sxm but measured its own fixed cost per forward is not
    # the built-in: no preset replaces what it measured
    mine = load_hardware("h100-sxm").with_(forward_overhead_s=2.5e-4)
    costs = step_costs(mine, engine="medusa")
    assert costs.family is None and costs.profile.forward_overhead_s == 2.5e-4
    assert "not applied" in costs.line


def test_best_gamma_never_picks_a_row_that_does_not_fit_in_memory():
    # by hand: gamma 4 is the fastest but does not fit; gamma 2 is the fastest that fits
    grid = pd.DataFrame(
        {
            "batch": [1, 1, 1, 1],
            "context": [512, 512, 512, 512],
            "gamma": [0, 2, 3, 4],
            "speedup": [1.0, 1.4, 1.3, 1.9],
            "fits_memory": [True, True, True, False],
        }
    )
    (row,) = best_gamma(grid).itertuples(index=False)
    assert (row.gamma, row.speedup) == (2, 1.4)


def test_the_framework_cost_of_candidate_sequences_by_hand():
    # docs/performance-model.md#verification-modes: b c candidate sequences of q / c tokens each;
    # every sequence's context is read per candidate, and a candidate row of one token takes the
    # plain (causal) path. Terms chosen so that each rule moves the answer.
    from roofline.latency import framework_overhead_s
    from roofline.shapes import model_shape
    from roofline.step_shape import StepShape

    hw = load_hardware("h100-sxm").with_(
        forward_overhead_s=1e-3,
        layer_overhead_s=1e-5,
        token_overhead_s=1e-6,
        context_overhead_s=1e-8,
        plain_context_overhead_s=2e-9,
    )
    shape = model_shape("vicuna-7b")  # 32 layers
    # b 2, q 8 as 4 candidates of 2 tokens, s 1000: per layer 1e-5 + 1e-6 * 16 + 1e-8 * 2 * 4 * 1000
    rows = framework_overhead_s(shape, hw, StepShape(2, 8, 1000, candidates_per_sequence=4))
    assert rows == pytest.approx(1e-3 + 32 * (1e-5 + 16e-6 + 8e-5))
    # 8 candidates of one token each: the plain path's cost per key, 2e-9 * 2 * 8 * 1000
    single = framework_overhead_s(shape, hw, StepShape(2, 8, 1000, candidates_per_sequence=8))
    assert single == pytest.approx(1e-3 + 32 * (1e-5 + 16e-6 + 3.2e-5))
