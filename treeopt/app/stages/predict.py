"""Stage 4 of the main job: the roofline's prediction for this machine's profile, for the
trees and tau the sweep measures (`prediction/`): the roofline report for heads and
speculators, the gamma and tree tables for a draft model (docs/architecture.md#draft-models-in-the-main-job)."""

from __future__ import annotations

from pathlib import Path

from roofline.hardware import HardwareProfile
from roofline.report import ReportRequest, build_report
from treeopt.app.draft_model import chain_tau_curves, write_gamma_prediction
from treeopt.app.models import draft_cost_of_drafter, draft_shape_of, heads_shape_of_drafter
from treeopt.app.stages.calibrate import accuracy_path
from treeopt.app.stages.hardware import Bench
from treeopt.app.stages.job import Job
from treeopt.app.stages.proposal import Proposal

_DRAFT_UNITS = {
    "medusa": "Medusa heads",
    "hydra": "Hydra heads",
    "mlp-speculator": "MLP speculator stages",
    "eagle3": "EAGLE-3 draft depths",
    "eagle": "EAGLE draft depths",
}


def predict(job: Job, proposal: Proposal, bench: Bench, hw: HardwareProfile) -> Path:
    """Write the prediction into `prediction/`; returns that folder."""
    s, lm, out = job.settings, bench.lm, job.out / "prediction"
    if lm.heads.kind == "draft-model":
        write_gamma_prediction(
            bench.shape,
            draft_shape_of(lm.heads, dtype=bench.dtype),
            hw,
            chain_tau_curves(accuracy_path(job), s.max_nodes)[1],
            s.batches,
            s.contexts,
            out,
            title=f"Predicted: {s.model} with its draft model on {hw.name}",
            tree=proposal.tau,
        )
        return out
    build_report(_report_request(job, proposal, bench, hw), out)
    return out


def _report_request(job: Job, proposal: Proposal, bench: Bench, hw: HardwareProfile) -> ReportRequest:
    s, lm, table, tree = job.settings, bench.lm, proposal.table, proposal.tree
    # Medusa's heads run in parallel on the accepted token; a sequential drafter's stages are
    # charged depth by depth (docs/performance-model.md#drafter-cost)
    heads_shape = heads_shape_of_drafter(lm.heads)
    return ReportRequest(
        bench.shape,
        heads_shape,
        hw,
        accuracy=table,
        accuracy_label=f"calibrated on {s.data} ({accuracy_path(job).name})",
        batches=s.batches,
        contexts=s.contexts,
        max_nodes=s.max_nodes,
        joint=table.joint is not None,
        proposal=tree,
        tau=proposal.tau.best,
        used_heads=True,
        tau_source=f"The {proposal.method} proposal sequence of {tree.size} nodes the sweep measures; τ "
        + proposal.tau.describe(),
        title=f"Predicted: {s.model} with {lm.heads.num_heads} {_DRAFT_UNITS[lm.heads.kind]} on {hw.name}",
        engine=proposal.engine,
        draft_cost=draft_cost_of_drafter(lm.heads),
    )
