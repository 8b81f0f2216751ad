"""Option types and option sets shared by the command modules. Every bad value becomes one
line naming the option (`treeopt.cli.main` formats click's BadParameter that way)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import click

from treeopt.drafter_cost import MAX_HEADS
from treeopt.stats import DEFAULT_TOLERANCE, MIN_ROUNDS

#: the largest integer any option takes: counts and sizes become numpy int64 arrays, and a
#: product of two of them must not overflow silently
MAX_INT = 2**62


class AtLeast(click.ParamType):
    """An integer >= `minimum` (and <= `maximum`)."""

    name = "integer"

    def __init__(self, minimum: int, maximum: int = MAX_INT, why: str = ""):
        self.minimum = minimum
        self.maximum = maximum
        self.why = why  # said after a value below the minimum

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            try:
                n = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not an integer", param, ctx)
        if n < self.minimum:
            self.fail(f"must be at least {self.minimum}, got {n}" + (f" ({self.why})" if self.why else ""), param, ctx)
        if n > self.maximum:
            self.fail(f"must be at most {self.maximum}, got {str(n)[:24]}", param, ctx)
        return n


class FiniteAtLeast(click.ParamType):
    """A finite number >= `minimum`."""

    name = "number"

    def __init__(self, minimum: float):
        self.minimum = minimum

    def convert(self, value, param, ctx):
        try:
            x = float(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (math.isfinite(x) and x >= self.minimum):
            self.fail(f"must be a finite number >= {self.minimum:g}, got {value}", param, ctx)
        return x


#: --topk: candidates per head index a vocabulary (treeopt.tree.MAX_RANK)
TOPK = AtLeast(1, maximum=2**31)


#: the most paired rounds a sweep takes per configuration: 10,000 rounds of a 1 ms step already
#: take ten seconds per configuration
MAX_ROUNDS = 10_000


def repeats_option(default: int = 10):
    """--repeats of a sweep: paired rounds per configuration, at least treeopt.stats.MIN_ROUNDS."""
    why = "with fewer paired rounds, a 95% interval of the median covers the truth far less often than it says"
    return click.option(
        "--repeats",
        type=AtLeast(MIN_ROUNDS, MAX_ROUNDS, why=why),
        default=default,
        show_default=True,
        help=f"Paired timed rounds per configuration (at least {MIN_ROUNDS}).",
    )


def budget_option():
    """--budget (formerly --time-budget): seconds of extra rounds for the cells still open."""
    return click.option(
        "--budget",
        "--time-budget",
        "time_budget",
        type=FiniteAtLeast(0),
        default=60,
        show_default=True,
        metavar="SECONDS",
        help="Extra time for more rounds where a cell's answer is still open: rounds double per cell "
        "until its tree is settled within --tolerance (0: none).",
    )


def tolerance_option():
    """--tolerance: the equivalence margin of a measured selection (treeopt.stats)."""
    return click.option(
        "--tolerance",
        type=FiniteAtLeast(0),
        default=DEFAULT_TOLERANCE,
        show_default=True,
        metavar="FRACTION",
        help="Speedups within this fraction are the same answer: a smaller tree is taken when its paired "
        "lower bound is at least 1 - FRACTION of every other tree's.",
    )


class IntList(click.ParamType):
    """'1,2,4' -> (1, 2, 4): integers >= `minimum`, sorted and distinct (or in the order given,
    repeats allowed, with `ordered`)."""

    name = "list"

    def __init__(self, minimum: int, *, ordered: bool = False):
        self.minimum = minimum
        self.ordered = ordered

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            items = [int(part) for part in str(value).split(",") if part.strip()]
        except ValueError:
            self.fail(f"expected comma-separated integers, got '{value}'", param, ctx)
        if not items:
            self.fail("expected at least one integer", param, ctx)
        bad = [v for v in items if v < self.minimum]
        if bad:
            self.fail(f"values must be >= {self.minimum}, got {bad[0]}", param, ctx)
        huge = [v for v in items if v > MAX_INT]
        if huge:
            self.fail(f"values must be <= {MAX_INT}, got {str(huge[0])[:24]}", param, ctx)
        return tuple(items) if self.ordered else tuple(sorted(set(items)))


def apply(options):
    """Decorate a command with a list of click options, in order."""

    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


#: what --dtype auto picks: the rule of `calibration.models.resolve_dtype`, said once for the help of
#: every command that runs a model (kept here, not read from there: these options load no torch)
AUTO_DTYPE_RULE = (
    "bfloat16 on a CPU that multiplies it natively (avx512_bf16 or amx_bf16 in /proc/cpuinfo), "
    "else float32; bfloat16 on CUDA (float16 on a GPU without bf16); float16 on MPS"
)


def dtype_option():
    """--dtype of a command that runs a model: auto (`AUTO_DTYPE_RULE`) or a dtype name."""
    return click.option(
        "--dtype",
        default="auto",
        metavar="DTYPE",
        help=f"auto, float32, bfloat16 or float16 [default: auto: {AUTO_DTYPE_RULE}].",
    )


#: options of every command that loads and runs a model (torch)
DRAFTER_OPTION = click.option(
    "--drafter",
    type=click.Choice(["medusa", "hydra", "mlp-speculator", "draft-model", "eagle3", "eagle"]),
    default=None,
    help="Drafter kind [default: read from the drafter's config.json; without --heads, MODEL's Medusa heads]; "
    "hydra, mlp-speculator, draft-model, eagle3 and eagle come from MODEL/hydra, MODEL/mlp_speculator, MODEL/draft, "
    "MODEL/eagle3 and MODEL/eagle.",
)

#: what --random-weights does, said once for every command that takes it
RANDOM_WEIGHTS_HELP = (
    "Time without a checkpoint: random weights of MODEL's shape (MODEL may also be a built-in shape name "
    "or a config.json) and a random drafter of --drafter and --num-heads [default: medusa, 5]; prompts are "
    "random token ids."
)


def random_weights_option(refusal: str | None = None):
    """--random-weights (`RANDOM_WEIGHTS_HELP`); `refusal`: the help of a command that refuses it,
    saying why and where to go instead."""
    return click.option("--random-weights", is_flag=True, help=refusal or RANDOM_WEIGHTS_HELP)


RUN_MODEL_OPTIONS = [
    click.option(
        "--model",
        default="demo",
        show_default=True,
        metavar="demo|DIR",
        help="Base model: the bundled demo or a local transformers model directory.",
    ),
    click.option(
        "--heads",
        default=None,
        metavar="DIR",
        help="Drafter directory: Medusa heads, Hydra heads or an MLP speculator [default: MODEL/heads].",
    ),
    DRAFTER_OPTION,
    click.option(
        "--num-heads",
        type=AtLeast(1, MAX_HEADS),
        default=None,
        metavar="K",
        help="Use this many of the Medusa heads the weights hold [default: the heads config's medusa_num_heads].",
    ),
    click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps."),
    dtype_option(),
    click.option(
        "--threads",
        type=AtLeast(1),
        default=None,
        help="torch CPU threads [default: 1 for models under 100M parameters, else torch's].",
    ),
]


def command_line(ctx: click.Context) -> str:
    """The command line that repeats this command: its path and every parameter the user gave
    (not left at its default), each value quoted for a POSIX shell. Built from what click parsed,
    not from sys.argv, which holds something else when the CLI is called from Python."""
    parts = ctx.command_path.split()
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if param.name not in ctx.params or source in (None, click.core.ParameterSource.DEFAULT):
            continue
        parts += _param_words(param, ctx.params[param.name])
    return " ".join(shlex.quote(p) for p in parts)


def _param_words(param: click.Parameter, value) -> list[str]:
    """The words that give `param` its `value` on a command line."""
    if isinstance(param, click.Argument):
        return [str(v) for v in value] if param.multiple or param.nargs != 1 else [str(value)]
    name = max((o for o in param.opts if o.startswith("--")), key=len, default=param.opts[0])
    if param.is_flag and param.secondary_opts:  # --x/--no-x
        return [name if value else max(param.secondary_opts, key=len)]
    if param.is_flag:
        return [name] if value else []
    values = value if param.multiple else [value]
    return [w for v in values for w in (name, ",".join(map(str, v)) if isinstance(v, tuple) else str(v))]


class HeadsCount(click.ParamType):
    """What `--heads` was before it named a directory on every command: a number of heads. Such
    a value is refused with the option that takes it now."""

    name = "directory"

    def __init__(self, directory: bool):
        self.directory = directory  # whether the command takes a drafter directory as --heads

    def convert(self, value, param, ctx):
        text = str(value).strip()
        if text.isdigit() and not (self.directory and Path(text).is_dir()):
            self.fail(
                f"names a drafter directory, as on every command; the number of draft heads is --num-heads {text}"
            )
        if not self.directory:
            self.fail("this command reads no drafter directory; the number of draft heads is --num-heads")
        if not Path(text).exists():
            self.fail(f"{text}: no such drafter directory")
        return text


#: `--heads` of the commands that take no drafter directory: old usage, refused with what to use
OLD_HEADS_OPTION = click.option("--heads", type=HeadsCount(directory=False), hidden=True, expose_value=False)
