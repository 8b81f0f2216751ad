"""The cost of dependent drafters (docs/performance-model.md#drafter-cost): the config a
drafter's authors publish read into `DraftCost`, the rows each stage runs on for a tree, each
stage's FLOPs and bytes derived by hand, and the per-stage fixed cost in the step time."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from roofline.grid import draft_rows_by_prefix, heads_used_by_prefix, speedup_grid
from roofline.hardware import EfficiencyCurve, HardwareProfile, load_hardware
from roofline.latency import memory_required_bytes, step_time_s
from roofline.ops import DraftWork, operators
from roofline.shapes import ModelShape, model_shape
from treeopt.accuracy import load_accuracy
from treeopt.build import tau_curve
from treeopt.cli import main
from treeopt.drafter_cost import DraftCost, draft_cost_from_config, read_draft_cost
from treeopt.errors import UserError
from treeopt.tau import first_heads, proposal_sequence
from treeopt.tree import Tree

TINY = ModelShape(
    "tiny", layers=3, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10, dtype="fp16", dtype_bytes=2
)
HYDRA = DraftCost("hydra", True, stages=2, layers=1, hidden_size=4, inner_size=4, vocab_size=10, grounded=True)
SPEC = DraftCost("mlp-speculator", True, stages=2, layers=1, hidden_size=4, inner_size=6, vocab_size=10)
FLAT = EfficiencyCurve((1.0,), (1.0,))
HUGE = 1e30
# only kernel launches and the engine terms cost time
OVERHEAD_ONLY = HardwareProfile(
    name="overhead-only",
    peak_flops={"fp16": HUGE},
    vector_flops=HUGE,
    bandwidth_bytes_per_s=HUGE,
    capacity_bytes=1e12,
    kernel_overhead_s=1e-6,
    gemm_efficiency=FLAT,
    draft_stage_s=1e-3,
    head_overhead_s=1e-5,
)
# only FLOPs of matrix work cost time, at 1e9 FLOP/s
COMPUTE_ONLY = HardwareProfile(
    name="compute-only",
    peak_flops={"fp16": 1e9},
    vector_flops=HUGE,
    eta_compute=1.0,
    bandwidth_bytes_per_s=HUGE,
    capacity_bytes=1e12,
    kernel_overhead_s=0.0,
    gemm_efficiency=FLAT,
)


def by_name(ops):
    return {op.name: op for op in ops}


# ---- configs in the authors' layouts --------------------------------------------------------


def test_configs_in_the_authors_layouts():
    hydra = draft_cost_from_config(
        {
            "hydra_num_heads": 4,
            "hydra_num_layers": 2,
            "hydra_head_arch": "prefix-mlp",
            "grounded_heads": True,
            "hidden_state_offset": 0,
            "base_model_name_or_path": "lmsys/vicuna-7b-v1.3",
        },
        hidden_size=4096,
        vocab_size=32000,
    )
    assert (
        hydra.drafter,
        hydra.sequential,
        hydra.stages,
        hydra.layers,
        hydra.hidden_size,
        hydra.vocab_size,
        hydra.grounded,
        hydra.prefix_layer,
    ) == ("hydra", True, 4, 2, 4096, 32000, True, True)
    # ibm-fms/llama3-8b-accelerator's config.json
    spec = draft_cost_from_config(
        {
            "model_type": "mlp_speculator",
            "emb_dim": 4096,
            "inner_dim": 3072,
            "vocab_size": 128256,
            "n_predict": 4,
            "top_k_tokens_per_head": [4, 3, 2, 2],
            "n_candidates": 5,
            "tie_weights": True,
            "scale_input": True,
        }
    )
    assert (spec.drafter, spec.sequential, spec.stages, spec.hidden_size, spec.inner_size, spec.vocab_size) == (
        "mlp-speculator",
        True,
        4,
        4096,
        3072,
        128256,
    )
    medusa = draft_cost_from_config({"medusa_num_heads": 5, "medusa_num_layers": 1}, hidden_size=4096, vocab_size=32000)
    assert (medusa.sequential, medusa.stages, medusa.layers) == (False, 5, 1)
    ungrounded = draft_cost_from_config({"hydra_num_heads": 3, "grounded_heads": False}, hidden_size=8, vocab_size=16)
    assert not ungrounded.sequential and not ungrounded.grounded


@pytest.mark.parametrize(
    "config, message",
    [
        ({"foo": 1}, "not a drafter config"),
        ({"hydra_num_heads": 4, "hydra_head_arch": "cross-attn"}, "not supported"),
        ({"model_type": "mlp_speculator", "emb_dim": 8, "n_predict": 0, "vocab_size": 4}, "n_predict"),
        ({"medusa_num_heads": 2}, "hidden_size"),
    ],
)
def test_bad_configs_are_one_line(config, message):
    with pytest.raises(UserError, match=message):
        draft_cost_from_config(config, vocab_size=16)


def test_params_equal_the_modules_parameter_count():
    # the torch modules of calibration.drafters count their own parameters: an independent source
    from calibration.drafters.hydra import HydraHeads  # torch, only for this test
    from calibration.drafters.mlp_speculator import MLPSpeculator
    from calibration.heads import MedusaHeads

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert HYDRA.params == count(HydraHeads(4, 10, 2, 1, grounded=True))
    assert DraftCost("hydra", True, 3, 2, 8, 8, 16, grounded=True).params == count(HydraHeads(8, 16, 3, 2))
    assert (
        DraftCost("hydra", False, 3, 2, 8, 8, 16).params == count(HydraHeads(8, 16, 3, 2, grounded=False)) - 16 * 8
    )  # an ungrounded set keeps an unused embedding table
    assert SPEC.params == count(MLPSpeculator(4, 6, 10, 2))
    assert DraftCost("medusa", False, 3, 2, 8, 8, 16).params == count(MedusaHeads(8, 16, 3, 2))


def test_read_draft_cost_of_a_saved_drafter(tmp_path):
    from calibration.drafters.hydra import HydraHeads  # torch, only for this test
    from treeopt.app.models import draft_cost_of_drafter

    heads = HydraHeads(8, 16, 3, 1)
    heads.save_pretrained(tmp_path / "hydra")
    assert read_draft_cost(tmp_path / "hydra") == draft_cost_of_drafter(heads)
    with pytest.raises(UserError, match="no such file"):
        read_draft_cost(tmp_path / "nothing")


# ---- rows per stage for a tree ----------------------------------------------------------------


def test_draft_rows_by_prefix_hand_derived():
    # root -> (0), (1); (0) -> (0,0), (0,1); (1) -> (1,0); (0,0) -> (0,0,0)
    tree = Tree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    rows = draft_rows_by_prefix(tree, 3)
    expect = [
        [0, 0, 0],  # plain decoding: no drafting
        [1, 0, 0],  # (0): the root drafts
        [1, 0, 0],  # (1): still the root alone
        [1, 1, 0],  # (0,0): (0) drafts at depth 2
        [1, 1, 0],  # (0,1): (0) again
        [1, 2, 0],  # (1,0): (1) joins
        [1, 2, 1],
    ]  # (0,0,0): (0,0) drafts at depth 3
    assert rows.tolist() == expect
    # stages run = the tree's depth
    assert ((rows > 0).sum(axis=1) == heads_used_by_prefix(tree)).all()


# ---- each stage's FLOPs and bytes ------------------------------------------------------------


def test_hydra_stages_hand_derived():
    # b = 2; stage 1 on the root (r = 2 rows), stage 2 on 3 nodes per sequence (r = 6)
    ops = by_name(operators(TINY, DraftWork(HYDRA, np.array([1, 3])), batch=2, tokens=7, context=5))
    # stage 1: input [h, E(root)] 8 wide: linear + residual projection 2*(2*2*8*4) = 256, bias/SiLU/
    # residual 6*2*4 = 48, projection 2*2*4*10 = 160 + bias 2*10 = 20
    assert float(ops["draft_stage_1"].flops) == 256 + 48 + 160 + 20
    # stage 2: input 12 wide: 2*(2*6*12*4) = 1152, 6*6*4 = 144, 2*6*4*10 = 480, 6*10 = 60
    assert float(ops["draft_stage_2"].flops) == 1152 + 144 + 480 + 60
    # bytes (elements x 2): weights 2*(8*4+4) + 4*10 + 10 = 122; inputs read twice 2*2*8 = 32,
    # 3*2*4 = 24 (out, bias, residual), the state 2*4 = 8, logits 2*10 = 20; the 6 children's
    # embeddings gathered (2*4 each) and their 12-wide inputs copied (2*12 each): 6*32 = 192
    assert float(ops["draft_stage_1"].bytes) == 2 * (122 + 32 + 24 + 8 + 20 + 192)
    # the last stage has no children to prepare: weights 2*(12*4+4) + 40 + 10 = 154, acts
    # 2*6*12 = 144, 3*6*4 = 72, 6*4 = 24, 6*10 = 60
    assert float(ops["draft_stage_2"].bytes) == 2 * (154 + 144 + 72 + 24 + 60)
    assert float(ops["draft_stage_1"].rows) == 2 and float(ops["draft_stage_2"].rows) == 6
    assert "draft_heads" not in ops


def test_mlp_speculator_stages_hand_derived():
    ops = by_name(operators(TINY, DraftWork(SPEC, np.array([1, 2])), batch=1, tokens=4, context=0))
    # stage 1: projection of the 4-wide hidden state to inner 6: 2*1*4*6 = 48; weighted sum,
    # LayerNorm, GELU ~10 per element: 60; head 2*1*6*10 = 120
    assert float(ops["draft_stage_1"].flops) == 48 + 60 + 120
    # stage 2 on 2 rows, state 6 wide: 2*2*6*6 = 144, 10*2*6 = 120, 2*2*6*10 = 240
    assert float(ops["draft_stage_2"].flops) == 144 + 120 + 240
    # bytes of stage 2: weights 6*6 + 2*6 + 6*10 = 108; embedding gather 2*2*6 = 24, state in
    # 2*6 = 12, out/LN/GELU 3*2*6 = 36, logits 2*10 = 20
    assert float(ops["draft_stage_2"].bytes) == 2 * (108 + 24 + 12 + 36 + 20)


def test_a_stage_that_does_not_run_costs_nothing():
    ops = by_name(operators(TINY, DraftWork(HYDRA, np.array([1, 0])), batch=3, tokens=2, context=4))
    assert float(ops["draft_stage_2"].flops) == 0 and float(ops["draft_stage_2"].bytes) == 0
    assert float(ops["draft_stage_2"].kernels) == 0
    idle = by_name(operators(TINY, DraftWork(SPEC, np.array([1, 0])), batch=3, tokens=2, context=4))
    assert float(idle["draft_stage_2"].bytes) == 0 and float(idle["draft_stage_2"].kernels) == 0
    one_stage = DraftCost("hydra", True, 1, 1, 4, 4, 10, grounded=True)
    for hw in (OVERHEAD_ONLY, COMPUTE_ONLY):
        assert step_time_s(TINY, DraftWork(HYDRA, np.array([1, 0])), hw, batch=3, tokens=2, context=4) == pytest.approx(
            step_time_s(TINY, DraftWork(one_stage, np.array([1])), hw, batch=3, tokens=2, context=4)
        )


def test_prefix_layer_is_one_decoder_layer_on_one_token():
    cost = DraftCost("hydra", True, 2, 1, 4, 4, 10, grounded=True, prefix_layer=True)
    ops = by_name(operators(TINY, DraftWork(cost, np.array([1, 1])), batch=3, tokens=3, context=5))
    # q_proj of one token per sequence: 2 * 3 * 4 * (2 heads x 2) = 96; once, not per layer
    assert float(ops["prefix_layer.q_proj"].flops) == 96 and ops["prefix_layer.q_proj"].count == 1
    # attention over its own cache of s = 5 entries plus the token: 2 * 3 * 2 * 1 * 6 * 2 = 144
    assert float(ops["prefix_layer.qk"].flops) == 144


# ---- the per-stage fixed cost and the grid ------------------------------------------------------


def test_draft_stage_s_once_per_stage_run():
    work = DraftWork(HYDRA, np.array([1, 2]))
    base = step_time_s(TINY, work, OVERHEAD_ONLY, batch=1, tokens=4, context=3, draft_stages=0)
    assert step_time_s(TINY, work, OVERHEAD_ONLY, batch=1, tokens=4, context=3) == pytest.approx(base + 2e-3)
    one = DraftWork(HYDRA, np.array([1, 0]))
    assert step_time_s(TINY, one, OVERHEAD_ONLY, batch=1, tokens=2, context=3) == pytest.approx(
        step_time_s(TINY, one, OVERHEAD_ONLY, batch=1, tokens=2, context=3, draft_stages=0) + 1e-3
    )


def test_grid_charges_each_tree_its_own_stages():
    tree = Tree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    cost = DraftCost("hydra", True, 3, 1, 4, 4, 10, grounded=True)
    rows = draft_rows_by_prefix(tree, 3)
    tau = np.array([1.0, 1.5, 1.6, 1.9, 2.0, 2.1, 2.3])
    grid = speedup_grid(TINY, DraftWork(cost, rows), COMPUTE_ONLY, tau, [1, 4], [8], tree=tree)
    for row in grid.itertuples():
        n = int(row.nodes)
        expect = (
            step_time_s(TINY, None, COMPUTE_ONLY, batch=row.batch, tokens=1, context=8)
            if n == 0
            else step_time_s(TINY, DraftWork(cost, rows[n]), COMPUTE_ONLY, batch=row.batch, tokens=n + 1, context=8)
        )
        assert row.step_time_s == pytest.approx(expect)
    with pytest.raises(UserError, match="do not apply"):
        speedup_grid(TINY, DraftWork(cost, rows), COMPUTE_ONLY, tau, [1], [8], heads_in_baseline=True)


def test_memory_counts_the_drafter_and_its_widest_stage():
    work = DraftWork(SPEC, np.array([1, 5]))
    plain = memory_required_bytes(TINY, None, batch=2, tokens=5, context=4)
    # plain: the largest activation is the MLP's, b q i x 2 x beta = 2*5*8*2*2 = 320 bytes; with
    # the drafter its weights join and the base logits (b q V) plus the widest stage's (5 rows x V
    # per sequence) are 2*(50 + 50)*2 = 400 bytes
    assert memory_required_bytes(TINY, work, batch=2, tokens=5, context=4) == pytest.approx(
        plain - 320 + SPEC.params * 2 + 400
    )


def test_roofline_ops_with_a_drafter_config(tmp_path, capsys):
    cfg = tmp_path / "hydra" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"hydra_num_heads": 3, "hydra_num_layers": 1, "hydra_head_arch": "mlp"}))
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "roofline",
                "ops",
                "--model",
                "llama-7b",
                "--hardware",
                "a100",
                "--tokens",
                "6",
                "--drafter-config",
                str(cfg),
                "--draft-rows",
                "1,2,2",
                "--json",
            ]
        )
        raise SystemExit(0)
    assert exc.value.code in (0, None)
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    # stage 2 of a grounded Hydra set on 2 rows: 2 GEMMs 3h x h, projection h x V (h = 4096, V = 32000)
    h, v = 4096, 32000
    assert rows["draft_stage_2"]["flops"] == 2 * 2 * 2 * 3 * h * h + 6 * 2 * h + 2 * 2 * h * v + 2 * v
    with pytest.raises(SystemExit) as exc:
        main(["roofline", "ops", "--model", "llama-7b", "--hardware", "a100", "--tokens", "6", "--draft-rows", "1,2"])
        raise SystemExit(0)
    assert exc.value.code == 2


def test_speedup_and_report_charge_the_drafter_of_the_config(tmp_path, capsys):
    csv = str(Path(__file__).resolve().parents[1] / "treeopt" / "data" / "medusa_train_accuracy.csv")
    cfg = tmp_path / "spec" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(
        json.dumps(
            {"model_type": "mlp_speculator", "emb_dim": 4096, "inner_dim": 4096, "vocab_size": 32000, "n_predict": 3}
        )
    )
    grid_csv = tmp_path / "grid.csv"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "roofline",
                "speedup",
                "--model",
                "vicuna-7b",
                "--hardware",
                "a100",
                "--accuracy",
                csv,
                "--drafter-config",
                str(cfg),
                "--batch",
                "1,8",
                "--context",
                "512",
                "--max-nodes",
                "8",
                "-o",
                str(grid_csv),
            ]
        )
        raise SystemExit(0)
    assert exc.value.code in (0, None)
    assert "mlp-speculator: 3 stages" in capsys.readouterr().out
    # every grid cell is the step of the speculator on that prefix tree's nodes, per depth
    grid = pd.read_csv(grid_csv)
    table = load_accuracy(csv, model="vicuna-7b")
    tree = proposal_sequence(first_heads(table, 3), 8, method="greedy")
    cost = read_draft_cost(cfg)
    rows = draft_rows_by_prefix(tree, 3)
    shape, hw = model_shape("vicuna-7b"), load_hardware("a100")
    for row in grid[grid["nodes"] > 0].itertuples():
        expect = step_time_s(
            shape, DraftWork(cost, rows[row.nodes]), hw, batch=row.batch, tokens=row.nodes + 1, context=512
        )
        assert row.step_time_s == pytest.approx(expect, rel=1e-5)
    assert grid["tau"].to_numpy()[:9] == pytest.approx(tau_curve(tree, table.accuracy[:3]), rel=1e-5)
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "report",
                "--model",
                "vicuna-7b",
                "--hardware",
                "a100",
                "--accuracy",
                csv,
                "--drafter-config",
                str(cfg),
                "--batch",
                "1",
                "--context",
                "512",
                "--max-nodes",
                "8",
                "-o",
                str(tmp_path / "report"),
            ]
        )
        raise SystemExit(0)
    assert exc.value.code in (0, None)
    assert "**Drafter**: mlp-speculator: 3 stages" in (tmp_path / "report" / "index.md").read_text()
    report_grid = pd.read_csv(tmp_path / "report" / "grid.csv")
    assert report_grid["step_time_s"].to_numpy() == pytest.approx(
        grid[grid["batch"] == 1]["step_time_s"].to_numpy(), rel=1e-5
    )


def test_step_predictor_charges_a_sequential_drafter_depth_by_depth():
    from types import SimpleNamespace

    import torch  # the predictor reads the loaded model's dtype

    from treeopt.app.models import draft_cost_of_drafter, shape_of
    from treeopt.app.sweep import step_predictor

    hydra = SimpleNamespace(
        kind="hydra", sequential=True, grounded=True, num_heads=3, num_layers=1, hidden_size=256, vocab_size=4096
    )
    lm = SimpleNamespace(name="demo", dtype=torch.float32, heads=hydra)
    hw = load_hardware("a100")
    tree = Tree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    predict = step_predictor(lm, tree, hw)
    cost = draft_cost_of_drafter(hydra)
    rows = draft_rows_by_prefix(tree, 3)
    shape = shape_of("demo", dtype="float32")
    assert predict(2, 1, 64) == step_time_s(shape, None, hw, batch=2, tokens=1, context=64)
    for n in range(1, 7):
        assert predict(2, n + 1, 64) == pytest.approx(
            step_time_s(shape, DraftWork(cost, rows[n]), hw, batch=2, tokens=n + 1, context=64)
        )
