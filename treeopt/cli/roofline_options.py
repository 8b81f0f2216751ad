"""The options the roofline commands share (`treeopt roofline ...`, `treeopt report`, `treeopt
hw fit`, the gamma and candidates commands): the model, its drafter, the hardware, the grid."""

from __future__ import annotations

import click

from roofline.engine_presets import FAMILIES
from roofline.grid import DEFAULT_BATCHES, DEFAULT_CONTEXTS
from roofline.hardware import VERIFICATION_MODES
from treeopt.cli.options import AtLeast, HeadsCount, IntList
from treeopt.drafter_cost import DRAFTER_NAMES, MAX_HEAD_LAYERS, MAX_HEADS
from treeopt.engines import ENGINE_NAMES
from treeopt.errors import UserError


def drafter_dir(heads_dir: str | None, drafter_config: str | None) -> str | None:
    """The drafter directory of --heads or --drafter-config (the same thing, named as other
    commands name it, or as a config file)."""
    if heads_dir is not None and drafter_config is not None:
        raise UserError("--heads: give the drafter as --heads DIR or --drafter-config PATH, not both")
    return heads_dir if heads_dir is not None else drafter_config


MODEL_OPTIONS = [
    click.option(
        "--model",
        "model",
        required=True,
        metavar="NAME|CONFIG|DIR|demo",
        help="Built-in shape (llama-7b, vicuna-7b, llama-3-8b, mistral-7b, ...), a config.json, "
        "a model directory, or demo.",
    ),
    click.option(
        "--dtype", default=None, metavar="DTYPE", help="Compute dtype (fp32, bf16, fp16) [default: the model's]."
    ),
]
HARDWARE_OPTION = click.option(
    "--hardware",
    "hardware",
    required=True,
    metavar="NAME|PROFILE.json",
    help="Built-in profile (see `treeopt hw list`) or a profile JSON from `treeopt hw calibrate`.",
)


HEADS_OPTIONS = [
    click.option(
        "--heads",
        "heads_dir",
        type=HeadsCount(directory=True),
        default=None,
        metavar="DIR",
        help="Drafter directory (Medusa heads, Hydra heads or an MLP speculator), as on every command: the "
        "cost shape the roofline charges (as --drafter-config) [default: the Medusa heads next to the model].",
    ),
    click.option(
        "--num-heads",
        "num_heads",
        type=AtLeast(0, MAX_HEADS),
        default=None,
        metavar="K",
        help="Number of draft heads K [default: the accuracy table's, else the Medusa heads config "
        "next to the model, else 5]; 0 = none.",
    ),
    click.option(
        "--head-layers", type=AtLeast(0, MAX_HEAD_LAYERS), default=None, help="ResBlocks per head [default: 1]."
    ),
    click.option(
        "--head-tokens",
        type=AtLeast(1),
        default=None,
        help="Tokens per sequence the heads run on [default: all q, as Medusa's code; a decoder "
        "that runs them on the accepted token only: 1].",
    ),
]
ENGINE_OPTION = click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default=None,
    help="Trees only from this engine's family, priced with its engine family's step costs on a built-in "
    "profile (docs/performance-model.md#engine-presets); the report shows the line it takes.",
)
GPU_OPTIONS = (
    click.option(
        "--tensor-parallel",
        "tensor_parallel",
        type=AtLeast(1),
        default=1,
        show_default=True,
        help="GPUs the model is split over (tensor parallelism: weights and KV split, two all-reduces per layer; "
        "docs/performance-model.md#tensor-parallelism).",
    ),
    click.option(
        "--expert-parallel",
        "expert_parallel",
        is_flag=True,
        help="Spread an MoE's routed experts whole over the --tensor-parallel GPUs (vLLM's --enable-expert-parallel, "
        "SGLang's --ep-size): the slowest GPU's experts are priced (docs/performance-model.md#expert-parallelism).",
    ),
)

ENGINE_COSTS_OPTION = click.option(
    "--engine-costs",
    "engine_costs",
    type=click.Choice(FAMILIES),
    default=None,
    help="Price the steps with this engine family's preset (`treeopt hw list`) on a built-in profile "
    "[default: --engine's family, else ideal]. ibm-tgis has no tree engine: costs only.",
)
VERIFICATION_OPTION = click.option(
    "--verification",
    type=click.Choice(VERIFICATION_MODES),
    default="tree",
    show_default=True,
    help="tree: the tree's tokens under a tree mask, one read of the context; candidates: its root-to-leaf "
    "paths as separate sequences that each re-read the context (engines without tree attention).",
)
SEQUENTIAL_DRAFT_OPTION = click.option(
    "--sequential-draft",
    is_flag=True,
    help="The drafter drafts depth by depth: a tree pays the profile's draft_stage_s once per level of depth.",
)
DRAFTER_OPTIONS = [
    click.option(
        "--drafter",
        type=click.Choice(DRAFTER_NAMES),
        default=None,
        help="Drafter kind: its directory next to the model gives its cost shape [default: Medusa heads "
        "from the heads options].",
    ),
    click.option(
        "--drafter-config",
        default=None,
        metavar="PATH",
        help="A drafter's config.json (or its directory; Medusa, Hydra or MLP speculator): the cost "
        "shape the roofline charges (docs/performance-model.md#drafter-cost).",
    ),
]


GRID_OPTIONS = [
    click.option(
        "--batch",
        "batches",
        type=IntList(1),
        default=",".join(map(str, DEFAULT_BATCHES)),
        show_default=True,
        help="Comma-separated batch sizes.",
    ),
    click.option(
        "--context",
        "contexts",
        type=IntList(0),
        default=",".join(map(str, DEFAULT_CONTEXTS)),
        show_default=True,
        help="Comma-separated context lengths.",
    ),
]
