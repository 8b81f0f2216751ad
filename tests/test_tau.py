"""Which tau a decision uses (docs/statistics.md#which-tau-is-used-when): the walked estimate
where the calibration kept rank vectors, else joint, else independent. Hand-built curves whose
three estimates differ, through `TauCurve.best` and the places that decide with it: the sweep's
`tau` column that selection ships from, and the draft model's predicted speedup."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibration.sweep import _derive
from roofline.hardware import builtin_hardware
from roofline.shapes import ModelShape, model_shape
from treeopt.app.draft_model import gamma_prediction
from treeopt.selection import select as _select
from treeopt.tau import TauCurve
from treeopt.tree import make_tree

CHAIN = make_tree([[0], [0, 0]])


def select(*args, **kwargs) -> dict:
    """The selection's `treeopt.selection/v1` document: what these tests read."""
    return _select(*args, **kwargs).to_json()


INDEPENDENT = np.array([1.0, 1.5, 1.7])
JOINT = np.array([1.0, 1.6, 2.2])
WALKED = np.array([1.0, 1.7, 1.8])
# step times of plain decoding, 1 and 2 nodes, the same in every round: overheads 1, 1.1, 1.25
STEP_S = np.array([0.010, 0.011, 0.0125])


def test_best_is_walked_then_joint_then_independent():
    every = TauCurve(CHAIN, INDEPENDENT, JOINT, WALKED)
    assert every.best.tolist() == WALKED.tolist()
    assert (every.source, every.describe()) == ("walked", "walked from its rank vectors")
    no_walk = TauCurve(CHAIN, INDEPENDENT, JOINT)
    assert (no_walk.best.tolist(), no_walk.source) == (JOINT.tolist(), "joint")
    alone = TauCurve(CHAIN, INDEPENDENT)
    assert (alone.best.tolist(), alone.source) == (INDEPENDENT.tolist(), "independent")
    walk_only = TauCurve(CHAIN, INDEPENDENT, None, WALKED)
    assert (walk_only.best.tolist(), walk_only.source) == (WALKED.tolist(), "walked")


def _measured_cell(tau: TauCurve) -> pd.DataFrame:
    """One (batch 1, context 128) cell of a sweep: measured step times, then the derived columns."""
    measured = pd.DataFrame(
        {
            "batch": 1,
            "context": 128,
            "nodes": [0, 1, 2],
            "step_time_s": STEP_S,
            "overhead": STEP_S / STEP_S[0],
        }
    )
    samples = {(1, 128): ([0, 1, 2], np.tile(STEP_S, (8, 1)))}
    return _derive(measured, tau, None, samples=samples), samples


def test_the_sweep_ships_the_tree_the_walked_tau_picks():
    """By hand: walked speedups 1.7 / 1.1 = 1.545 and 1.8 / 1.25 = 1.44 pick 1 node; joint
    1.6 / 1.1 = 1.455 and 2.2 / 1.25 = 1.76 would pick 2. Noiseless rounds: the intervals are
    points, so the decision is the point estimate's."""
    table, samples = _measured_cell(TauCurve(CHAIN, INDEPENDENT, JOINT, WALKED))
    assert table["tau"].tolist() == WALKED.tolist()
    assert table["tau_joint"].tolist() == JOINT.tolist()
    assert table["tau_walk"].tolist() == WALKED.tolist()
    assert table["speedup"].to_numpy() == pytest.approx([1.0, 1.7 / 1.1, 1.8 / 1.25], rel=1e-12)
    (cell,) = select(table, CHAIN, samples=samples)["cells"]
    assert (cell["nodes"], cell["tau"]) == (1, 1.7)
    assert cell["speedup"] == pytest.approx(1.7 / 1.1, abs=1e-6)
    # the same measurement without rank vectors decides on joint tau: 2 nodes
    table, samples = _measured_cell(TauCurve(CHAIN, INDEPENDENT, JOINT))
    (cell,) = select(table, CHAIN, samples=samples)["cells"]
    assert (cell["nodes"], cell["tau"]) == (2, 2.2)


def test_the_draft_model_prediction_prices_the_walked_tau():
    hw = builtin_hardware()["h100-sxm"]
    target = model_shape("llama-7b")
    draft = ModelShape(
        "draft", layers=4, hidden=1024, intermediate=2816, heads=8, kv_heads=8, head_dim=128, vocab=32000
    )
    pred = gamma_prediction(target, draft, hw, TauCurve(CHAIN, INDEPENDENT, JOINT, WALKED), [1], [128])
    assert pred["tau"].tolist() == WALKED.tolist()
    step = pred["step_time_s"].to_numpy()
    assert pred["speedup"].to_numpy() == pytest.approx(WALKED * step[0] / step, rel=1e-12)
