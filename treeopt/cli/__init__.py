"""The `treeopt` command line: a thin layer over the library.

Commands are registered by name and imported only when invoked (`LazyGroup`), so that a
tree-only command such as `treeopt build` never loads torch, while every command module keeps
its imports at the top. Bad input anywhere ends in one line on stderr and exit status 2, never a
traceback.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

import click

from treeopt.errors import UserError
from treeopt.fileio import REFUSED_WRITES
from treeopt.version import __version__

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class ReaderGone(Exception):
    """stdout was closed by its reader while a command wrote to it."""


class LazyGroup(click.Group):
    """A click group whose subcommands live in other modules: `commands` maps a name to
    ("module:attribute", short help). The short help is kept here so that `--help` lists the
    commands without importing them."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as err:
            # click turns a closed stdout into exit status 1; the reader going away
            # (`treeopt hw list | head -1`) is not an error, so it travels past click to `main`
            raise ReaderGone from err

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not isinstance(command, click.Group):
            refuse_repeated_options(command, rest)
        return name, command, rest

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name not in self.lazy:
            return super().get_command(ctx, name)
        module, attribute = self.lazy[name][0].split(":")
        command = getattr(importlib.import_module(module), attribute)
        command.name = name
        return command

    def format_commands(self, ctx, formatter):
        rows = [
            (name, self.lazy[name][1] if name in self.lazy else self.commands[name].get_short_help_str())
            for name in self.list_commands(ctx)
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def refuse_repeated_options(command: click.Command, args: list[str]) -> None:
    """Refuse an option given more than once: click keeps only its last value, so `--batch 1
    --batch 8` would silently price batch 8 alone. Options that collect (multiple=True) may
    repeat; a flag and its negation (--graphs --no-graphs) count as the same option."""
    by_name = {
        name: param
        for param in command.params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }
    seen: dict[str, list[str]] = {}
    lists = {param.name for param in command.params if getattr(param.type, "name", "") == "list"}
    tokens = iter(args)
    for token in tokens:
        if token == "--":  # the rest are arguments
            break
        name, has_value, _ = token.partition("=")
        param = by_name.get(name)
        if param is None:
            continue
        if not param.is_flag and not has_value:
            next(tokens, None)  # the option's value, whatever it looks like
        if not param.multiple:
            seen.setdefault(param.name, []).append(name)
    for param_name, names in seen.items():
        if len(names) > 1:
            hint = f": one comma-separated list, {names[0]} A,B,C" if param_name in lists else ""
            distinct = list(dict.fromkeys(names))
            if len(distinct) > 1:  # a flag and its negation
                raise UserError(f"{' and '.join(distinct)} given together; give one of them")
            raise UserError(f"{names[0]} given {len(names)} times; give it once{hint}")


def _lazy_group(name: str, help_text: str, lazy: dict[str, tuple[str, str]]) -> LazyGroup:
    return LazyGroup(name=name, help=help_text, lazy=lazy, context_settings=CONTEXT)


hw = _lazy_group(
    "hw",
    "Hardware profiles: the built-in datasheet table and calibrated profiles.",
    {
        "list": ("treeopt.cli.hw_cmds:hw_list", "List the built-in hardware profiles."),
        "published": (
            "treeopt.cli.hw_cmds:hw_published",
            "Published step times of optimised engines beside the built-in profiles' predictions.",
        ),
        "calibrate": (
            "treeopt.cli.calibration_cmds:hw_calibrate",
            "Measure this machine and write a hardware profile.",
        ),
        "fit": (
            "treeopt.cli.hw_cmds:hw_fit",
            "Fit a profile's engine terms to measured step times of any engine.",
        ),
    },
)
roofline = _lazy_group(
    "roofline",
    "The operator-level latency model and the predicted speedup grid.",
    {
        "ops": ("treeopt.cli.roofline_cmds:roofline_ops", "Every operator of one forward pass, with its roof."),
        "speedup": (
            "treeopt.cli.roofline_cmds:roofline_speedup",
            "Predicted speedup for every batch x context x tree size.",
        ),
        "predict": ("treeopt.cli.roofline_cmds:roofline_predict", "Predicted step time for every row of a step CSV."),
        "gamma": (
            "treeopt.cli.gamma_cmds:roofline_gamma",
            "Predicted best draft length of a draft model per batch x context.",
        ),
        "candidates": (
            "treeopt.cli.candidates_cmds:candidates_cmd",
            "IBM's candidate form: n candidate sequences or their prefix tree, per cell.",
        ),
    },
)
demo = _lazy_group(
    "demo",
    "The bundled demo model (a small Llama with Medusa heads trained on Python's stdlib).",
    {
        "train": ("treeopt.cli.run_cmds:demo_train", "Train the demo model (the recipe behind the bundled one)."),
        "train-drafters": (
            "treeopt.cli.demo_cmds:demo_train_drafters",
            "Train the demo's Hydra heads and MLP speculator on the demo model.",
        ),
        "compare-drafters": (
            "treeopt.cli.demo_cmds:demo_compare_drafters",
            "Put `treeopt run` folders of several drafters side by side in one report.",
        ),
        "train-draft": (
            "treeopt.cli.run_cmds:demo_train_draft",
            "Train the demo's draft model (the recipe behind the bundled one).",
        ),
    },
)


@click.group(
    cls=LazyGroup,
    context_settings=CONTEXT,
    lazy={
        "build": ("treeopt.cli.tree_cmds:build_cmd", "Build a tree of N nodes from an accuracy table."),
        "show": ("treeopt.cli.tree_cmds:show_cmd", "Draw a tree with its statistics, and tau given --accuracy."),
        "buffers": ("treeopt.cli.tree_cmds:buffers_cmd", "Medusa's verification buffers of a tree, as text or JSON."),
        "compare": (
            "treeopt.cli.tree_cmds:compare_cmd",
            "tau of several trees under one accuracy table, side by side.",
        ),
        "check": ("treeopt.cli.tree_cmds:check_cmd", "Whether an engine drafts a tree as written, and what instead."),
        "select": (
            "treeopt.cli.select_cmds:select_cmd",
            "Pick the best tree per (batch, context) from a sweep or grid.",
        ),
        "report": ("treeopt.cli.roofline_cmds:report_cmd", "Write a predicted report: plots, grid, selection."),
        "calibrate": ("treeopt.cli.calibration_cmds:calibrate_cmd", "Measure per-rank accuracies of draft heads."),
        "acceptance": (
            "treeopt.cli.acceptance_cmds:acceptance_group",
            "The engine's reported acceptance against what the drafter should do.",
        ),
        "decode": ("treeopt.cli.decode_cmds:decode_cmd", "Generate with the reference tree decoder."),
        "sweep": ("treeopt.cli.run_cmds:sweep_cmd", "Measure step latency per tree size x batch x context."),
        "validate": ("treeopt.cli.run_cmds:validate_cmd", "Check predicted tau and step latency against measurements."),
        "run": ("treeopt.cli.run_cmds:run_cmd", "The main job: calibrate, build, predict, sweep, select, validate."),
        "sglang-tau": (
            "treeopt.cli.sglang_cmds:sglang_tau_cmd",
            "Tokens per step of SGLang's dynamic EAGLE tree, from the draft's own scores.",
        ),
    },
)
@click.version_option(__version__, prog_name="treeopt")
def cli() -> None:
    """Find the best static speculative-decoding tree (medusa_choices) for your model,
    draft heads, hardware and batch size."""


cli.add_command(hw)
cli.add_command(roofline)
cli.add_command(demo)


def _option_name(param: str) -> str:
    """A library argument (max_depth) as the option that sets it (--max-depth)."""
    return param if param.startswith("-") or param.isupper() else "--" + param.replace("_", "-")


def _bad_parameter(err: click.BadParameter) -> str:
    if isinstance(err, click.MissingParameter) and err.param is not None:
        name = max(err.param.opts, key=len) if isinstance(err.param, click.Option) else err.param.human_readable_name
        metavar = err.param.metavar if isinstance(err.param, click.Option) else None
        return f"{name} {metavar} is required" if metavar else f"{name} is required"
    if isinstance(err.param, click.Option):
        name = max(err.param.opts, key=len)
    elif err.param is not None:
        name = err.param.human_readable_name
    else:
        name = err.param_hint or "value"
    return f"{name}: {err.message}"


#: 9999-12-31T23:59:59Z, the last second Python's datetime can hold (a run's date is one)
LAST_EPOCH = 253402300799


def _check_environment() -> None:
    """Refuse an environment that would fail deep inside a library import. numpy's f2py reads
    SOURCE_DATE_EPOCH with int() when scipy loads it, so a non-integer value would surface as a
    traceback from whichever command first imports scipy; the reproducible-builds specification
    (https://reproducible-builds.org/specs/source-date-epoch/) says it is a decimal integer."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is None:
        return
    try:
        seconds = int(epoch)
    except ValueError:
        raise UserError(f"SOURCE_DATE_EPOCH: not a Unix time (a whole number of seconds): {epoch!r}") from None
    if not 0 <= seconds <= LAST_EPOCH:
        raise UserError(f"SOURCE_DATE_EPOCH: {epoch[:24]!r} is not a Unix time from 1970 to 9999")


#: set when SIGTERM stopped the command (said as such, exit status 128 + 15)
_TERMINATED: list[int] = []


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (`kill`, a job scheduler, `timeout`) stops a command as Ctrl-C does, so that every
    cleanup runs: a calibration saves its checkpoint, an atomic writer removes its temporaries.
    It goes through the SIGINT handler in place, so a block that holds Ctrl-C back
    (`calibration.interrupts.deferred_interrupts`) holds SIGTERM back too."""
    _TERMINATED.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def _install_sigterm() -> None:
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # not when a host program chose one
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread: the host program owns the signals
            pass


def _stopped() -> None:
    """One line and the shell's exit status for a command stopped by Ctrl-C or SIGTERM."""
    if _TERMINATED:
        click.echo("treeopt: terminated (SIGTERM)", err=True)
        sys.exit(128 + signal.SIGTERM)
    click.echo("treeopt: interrupted", err=True)
    sys.exit(130)


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at devnull, so that the interpreter's final flush of what
    could not be written does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _flush_stdout() -> None:
    """Write out what the command printed while its errors can still be told (`> /dev/full`)."""
    if sys.stdout is not None:
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    _TERMINATED.clear()
    if sys.stdout is None:  # started with stdout closed (`treeopt ... >&-`): as a reader gone
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (stdout lives as long as the process)
    try:
        _install_sigterm()
        _check_environment()
        cli.main(args=argv, prog_name="treeopt", standalone_mode=False)
        _flush_stdout()
    except UserError as err:
        message = f"{_option_name(err.param)}: {err.detail}" if err.param else str(err)
        click.echo(f"treeopt: error: {message}", err=True)
        sys.exit(2)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _stopped()
    except click.BadParameter as err:
        click.echo(f"treeopt: error: {_bad_parameter(err)}", err=True)
        sys.exit(2)
    except click.UsageError as err:
        # One line, like every other bad input; `--help` shows the usage.
        where = f" ({err.ctx.command_path})" if err.ctx is not None else ""
        click.echo(f"treeopt: error{where}: {err.format_message()}", err=True)
        sys.exit(2)
    except click.ClickException as err:
        click.echo(f"treeopt: error: {err.format_message()}", err=True)
        sys.exit(2 if err.exit_code in (1, 2) else err.exit_code)
    except (BrokenPipeError, ReaderGone):
        # The reader went away (`treeopt hw list | head -1`): not an error.
        _stdout_to_devnull()
        sys.exit(0)
    except OSError as err:
        if err.errno not in REFUSED_WRITES:
            raise
        # only files written in place fail this way: stdout (`> /dev/full`), as outputs are
        # written atomically and refused in one line (`treeopt.fileio.atomic_path`)
        _stdout_to_devnull()
        click.echo(f"treeopt: error: {err.filename or 'stdout'}: cannot write ({err.strerror or err})", err=True)
        sys.exit(2)
