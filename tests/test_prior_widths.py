"""The priors a profile fit starts from, as docs/performance-model.md#fitting-a-profile-to-measured-steps
states them: centred on the base's value, time scales in median measured steps, and a narrower
prior (relative to the value) for a term the base measured. Every expected value is worked out
here by hand from that table, not read from `PRIORS`."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from roofline.hardware import load_hardware
from roofline.profile_fit import step_points_frame, term_priors

A100 = load_hardware("a100-80gb-sxm")
# three rows whose median step is 20 ms: time scales are in units of it
POINTS = step_points_frame(
    pd.DataFrame({"batch": [1, 1, 2], "context": [128, 512, 128], "tokens": [1, 4, 1], "step_ms": [10.0, 20.0, 40.0]}),
    source="hand",
)
MEDIAN_STEP_S = 0.020
Z95 = 1.959964


def test_an_unmeasured_time_term_gets_one_median_step_around_zero():
    priors = term_priors(A100, POINTS)
    # the built-in A100 is an ideal engine: fixed costs 0, a scale of one median step (20 ms),
    # a tenth of one per verified token (2 ms), ranges 0-10 and 0-1 median steps
    forward = priors["forward_overhead_s"]
    assert (forward.centre, forward.measured) == (0.0, False)
    assert forward.sd == pytest.approx(0.020)
    assert (forward.lower, forward.upper) == pytest.approx((0.0, 0.200))
    token = priors["verified_token_s"]
    assert token.sd == pytest.approx(0.002)
    assert token.upper == pytest.approx(0.020)
    # its own 95% interval is 0 .. 1.96 median steps
    assert forward.interval() == pytest.approx((0.0, Z95 * MEDIAN_STEP_S))


def test_a_datasheet_bandwidth_prior_is_0_1_wide_and_stops_at_0_92():
    eta = term_priors(replace(A100, eta_memory=0.78), POINTS)["eta_memory"]
    assert (eta.centre, eta.sd, eta.lower, eta.upper, eta.measured) == pytest.approx((0.78, 0.10, 0.30, 0.92, False))
    # a datasheet efficiency above the range is clipped into it before it centres anything
    assert term_priors(replace(A100, eta_memory=0.97), POINTS)["eta_memory"].centre == pytest.approx(0.92)


def test_a_measured_term_is_held_to_half_its_value_and_a_measured_bandwidth_to_35_percent():
    calibrated = replace(
        A100,
        eta_memory=0.6,
        forward_overhead_s=4e-3,
        spec_step_overhead_s=1e-3,
        verified_token_s=0.0,
        calibration={"device": "hand", "threads": 1},
    )
    priors = term_priors(calibrated, POINTS)
    # measured fixed costs: 50% of their own value, not one median step
    assert priors["forward_overhead_s"].measured
    assert priors["forward_overhead_s"].sd == pytest.approx(0.5 * 4e-3)
    assert priors["spec_step_overhead_s"].sd == pytest.approx(0.5 * 1e-3)
    assert priors["forward_overhead_s"].interval() == pytest.approx((4e-3 * (1 - 0.5 * Z95), 4e-3 * (1 + 0.5 * Z95)))
    # a time the base leaves at 0 was not measured: the weak prior of an unmeasured term
    assert not priors["verified_token_s"].measured
    assert priors["verified_token_s"].sd == pytest.approx(0.1 * MEDIAN_STEP_S)
    # a measured streaming read: 0.05-1 of it, 35% of the value wide
    eta = priors["eta_memory"]
    assert (eta.lower, eta.upper) == pytest.approx((0.05, 1.0))
    assert eta.sd == pytest.approx(0.35 * 0.6)


def test_a_fitted_base_holds_only_its_fitted_terms():
    fitted = replace(
        A100,
        eta_memory=0.7,
        forward_overhead_s=2e-3,
        spec_step_overhead_s=3e-3,
        calibration={"fit": {"terms": ["forward_overhead_s"]}},
    )
    priors = term_priors(fitted, POINTS)
    assert priors["forward_overhead_s"].sd == pytest.approx(0.5 * 2e-3)
    # not among the fitted terms, on a base that measured nothing else: weak again
    assert priors["spec_step_overhead_s"].sd == pytest.approx(MEDIAN_STEP_S)
    assert priors["eta_memory"].sd == pytest.approx(0.10)
    assert priors["eta_memory"].upper == pytest.approx(0.92)


def test_the_gemm_scale_is_log_normal_and_stops_below_the_compute_roof():
    gemm = term_priors(A100, POINTS)["gemm_efficiency_scale"]
    roof = A100.eta_compute * max(A100.gemm_efficiency.values)
    assert gemm.transform == "log"
    assert gemm.centre == pytest.approx(1.0)
    assert gemm.upper == pytest.approx(min(2.0, 1.0 / roof))
    # x/÷ e^0.3 at one scale: the 95% interval is e^(±1.96 x 0.3), cut at the roof
    lo, hi = gemm.interval()
    assert lo == pytest.approx(np.exp(-Z95 * 0.3))
    assert hi == pytest.approx(min(np.exp(Z95 * 0.3), gemm.upper))
