"""The provenance fields of a calibrated table that describe the run rather than its inputs:
the day it ran and the software that made it (docs/formats.md)."""

from __future__ import annotations

import datetime as _dt
import os

import torch
import transformers

from treeopt.errors import UserError
from treeopt.version import __version__


def run_date() -> str:
    """YYYY-MM-DD of the run in UTC, or of SOURCE_DATE_EPOCH when set."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        try:
            when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise UserError(f"SOURCE_DATE_EPOCH: not a Unix time: {epoch!r}") from None
    else:
        when = _dt.datetime.now(_dt.timezone.utc)
    return when.date().isoformat()


def tool_versions() -> dict:
    """The provenance fields naming the software that made a table."""
    return {"tool_version": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
