"""What every stage of the main job is given: the run's settings, the folder it writes into
and where it reports progress."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from treeopt.stats import DEFAULT_TOLERANCE


@dataclass(frozen=True)
class RunSettings:
    """The settings of one `treeopt run`, one field per option (`treeopt/cli/run_cmds.py`)."""

    model: str = "demo"
    heads: str | None = None
    drafter: str | None = None  # drafter kind; None: read from the drafter's config
    num_heads: int | None = None  # heads used of those the weights hold; None: the config's
    data: str | None = None  # calibration prompts; None: the demo's, for the demo only
    validation_data: str | None = None  # held-out prompts; None: the demo's, for the demo only
    device: str = "auto"
    dtype: str = "auto"
    steps: int = 32  # generated tokens per calibration prompt
    max_prompts: int | None = None  # calibration prompts used of --data; None: all
    topk: int = 10
    max_nodes: int = 64
    method: str = "auto"  # proposal sequence: joint when available, else greedy
    sizes: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    contexts: tuple[int, ...] = (128, 512)
    repeats: int = 10
    time_budget_s: float = 60.0  # extra sweep rounds for the cells whose answer is still open
    tolerance: float = DEFAULT_TOLERANCE  # speedups within this fraction are the same answer
    validation_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    validation_prompts: int | None = None
    hw_quick: bool = False
    threads: int | None = None  # torch CPU threads; None: 1 for small models on CPU
    seed: int = 0
    engine: str | None = None  # proposal trees from this engine's family (docs/engines.md)
    mix: str | None = None  # traffic mix (CSV or inline spec): also choose one tree for it
    output: str | None = None  # the run's folder as given (None: not given), for index.md's command


@dataclass(frozen=True)
class Job:
    """One run of the main job: `settings` (the demo's prompts already filled in), the folder
    `out` every stage writes into, `log` for its progress lines, `progress` for its bars, and
    `say` for its results (the selection, the validation, the report's path; None: `log`), which
    the CLI prints on stdout while progress goes to stderr."""

    settings: RunSettings
    out: Path
    log: Callable[[str], None]
    progress: bool = True
    say: Callable[[str], None] | None = None

    def result(self, line: str) -> None:
        """A result line: stdout in the CLI (`say`), else the log."""
        (self.say or self.log)(line)
