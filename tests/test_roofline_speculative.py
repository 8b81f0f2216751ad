"""Draft-model step cost and gamma choice (roofline/speculative.py, treeopt/chain.py) against
hand-derived formulas: Leviathan et al. 2023's speedup and the sum of the passes a step runs."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.hardware import builtin_hardware
from roofline.latency import step_time_s
from roofline.shapes import ModelShape, model_shape
from roofline.speculative import best_gamma, draft_model_step_time_s, gamma_grid
from treeopt.chain import chain_tau
from treeopt.cli import main

HW = builtin_hardware()["h100-sxm"]
TARGET = model_shape("llama-7b")
DRAFT = ModelShape("draft", layers=4, hidden=1024, intermediate=2816, heads=8, kv_heads=8, head_dim=128, vocab=32000)


def test_chain_tau_is_leviathans_closed_form_for_constant_alpha():
    # (1 - a^(g+1)) / (1 - a) at a = 0.75: 1, 1.75, 2.3125, 2.734375 (Leviathan et al. 2023, eq. 1)
    assert np.allclose(chain_tau([0.75] * 3), [1.0, 1.75, 2.3125, 2.734375])
    assert np.allclose(chain_tau([1.0, 0.5, 0.0]), [1.0, 2.0, 2.5, 2.5])


def test_step_is_gamma_draft_passes_plus_one_verification():
    g, s, b = 3, 300, 4
    want = sum(step_time_s(DRAFT, None, HW, batch=b, tokens=1, context=s + j) for j in range(g))
    want += step_time_s(TARGET, None, HW, batch=b, tokens=g + 1, context=s)
    assert draft_model_step_time_s(TARGET, DRAFT, HW, batch=b, gamma=g, context=s) == pytest.approx(want, rel=1e-12)
    plain = step_time_s(TARGET, None, HW, batch=b, tokens=1, context=s)
    assert draft_model_step_time_s(TARGET, DRAFT, HW, batch=b, gamma=0, context=s) == pytest.approx(plain, rel=1e-12)


def test_speedup_reproduces_leviathans_formula_where_verification_is_free():
    # Memory-bound batch 1: verifying 8 tokens costs what one does, so the speedup is
    # (1 - a^(g+1)) / ((1 - a)(g c + 1)) with c = one draft pass / one target pass (Leviathan
    # et al. 2023, section 3.4; their T5-XXL/T5-small: a = 0.75, g = 7 -> 3.4x at c ~ 0.008).
    a, g, s = 0.75, 7, 128
    c = step_time_s(DRAFT, None, HW, batch=1, tokens=1, context=s) / step_time_s(
        TARGET, None, HW, batch=1, tokens=1, context=s
    )
    formula = (1 - a ** (g + 1)) / ((1 - a) * (g * c + 1))
    grid = gamma_grid(TARGET, DRAFT, HW, [a] * 8, batches=[1], contexts=[s])
    assert grid.loc[grid["gamma"] == g, "speedup"].item() == pytest.approx(formula, rel=0.01)
    # c = 0.008 is the cost ratio at which the formula gives the published 3.4x
    assert (1 - a**8) / ((1 - a) * (7 * 0.00824 + 1)) == pytest.approx(3.4, abs=0.005)


def test_best_gamma_falls_with_batch_and_is_none_when_drafting_never_pays():
    grid = gamma_grid(TARGET, DRAFT, HW, [0.75] * 8, batches=[1, 256], contexts=[128])
    best = best_gamma(grid).set_index("batch")["gamma"]
    assert best[1] == 7 and 0 < best[256] < best[1]  # compute-bound verification costs ~ gamma + 1
    none = best_gamma(gamma_grid(TARGET, DRAFT, HW, [0.05] * 4, batches=[256], contexts=[128]))
    assert none["gamma"].tolist() == [0]


def test_cli_gamma(tmp_path, capsys):
    out = tmp_path / "g.csv"
    main(
        [
            "roofline",
            "gamma",
            "--model",
            "llama-7b",
            "--draft-model",
            "llama-7b",
            "--hardware",
            "h100-sxm",
            "--alpha-value",
            "0.9",
            "--batch",
            "1",
            "--context",
            "128",
            "--max-gamma",
            "4",
            "-o",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    # a draft as costly as the target: step(g) > (g + 1) x plain > tau(g) x plain: never pays
    assert "none" in text and out.is_file()
    with pytest.raises(SystemExit) as exc:
        main(["roofline", "gamma", "--model", "llama-7b", "--draft-model", "llama-7b", "--hardware", "h100-sxm"])
    assert exc.value.code == 2
