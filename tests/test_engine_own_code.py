"""Every vLLM line treeopt exports for today's release, constructed by vLLM's own configuration
code (docs/engines.md#checked-against-the-engines-own-code).

Skipped unless vLLM is importable: its 0.33.0 wheel installs and validates on a CPU machine
without a GPU (`pip install --no-deps vllm==0.33.0` plus the pure-Python modules its config
package imports), but importing it takes about half a minute and the wheel is 336 MB, so CI does
not install it. Run it with vLLM on the path, e.g. `PYTHONPATH=/path/to/vllm-site pytest
tests/test_engine_own_code.py`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import get_args

import pytest

from treeopt.engine_data import get_engine
from treeopt.engines import export_for
from treeopt.schedules import BatchChoice, selection_schedule, vllm_schedule_config
from treeopt.tree import make_tree

vllm_config = pytest.importorskip("vllm.config")
dynamic = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")

DEMO = Path(__file__).resolve().parents[1] / "calibration" / "demo_model"


def _methods(literal) -> set[str]:
    """Every name of vLLM's SpeculativeMethod Literal (it nests other Literals)."""
    out: set[str] = set()
    for arg in get_args(literal):
        out |= _methods(arg) if get_args(arg) else {arg}
    return out


def _construct(config: dict):
    """vLLM's SpeculativeConfig of `config`: its keys, values and schedule through vLLM's own
    validators. ModelConfig cannot inspect a model's architecture on a CPU-only install, so the
    method is checked against SpeculativeMethod and the rest is built as "ngram", the one method
    that loads no model."""
    assert config["method"] in _methods(vllm_config.speculative.SpeculativeMethod), config
    return vllm_config.SpeculativeConfig(**{**config, "method": "ngram"})


def _lines():
    """Every newest-release vLLM line: chains of 1..8 tokens for each chain method, and schedules."""
    for name in ("vllm", "vllm-draft-model"):
        engine = get_engine(name)
        for n in range(1, 9):
            yield json.loads(shlex.split(export_for(engine, make_tree([[0] * d for d in range(1, n + 1)])).line)[1])
    for choices in ([(1, 4), (4, 3), (16, 1)], [(1, 2), (8, 0)], [(2, 3), (8, 3), (64, 1)]):
        yield vllm_schedule_config([BatchChoice(b, k) for b, k in choices], "draft_model")
    # the schedules `select`/`run --engine` print: a selection's cells at two contexts
    cells = [{"batch": b, "context": c, "nodes": k} for b, c, k in ((1, 128, 3), (1, 512, 2), (8, 128, 1), (8, 512, 1))]
    for name in ("vllm", "vllm-draft-model"):
        yield selection_schedule(cells, get_engine(name))["config"]
    # a draft model's schedule names its directory ("model")
    yield selection_schedule(cells, get_engine("vllm-draft-model"), draft_model=str(DEMO / "draft"))["config"]


def test_vllm_033_accepts_every_exported_line():
    accepted = 0
    for config in _lines():
        spec = _construct(config)
        assert spec.num_speculative_tokens == config["num_speculative_tokens"]
        if "num_speculative_tokens_per_batch_size" in config:
            dynamic.validate_and_normalize_dynamic_sd_schedule(config["num_speculative_tokens_per_batch_size"])
        accepted += 1
    assert accepted == 22


def test_vllm_033_refuses_what_treeopt_no_longer_exports():
    for bad in (
        {"method": "medusa", "num_speculative_tokens": 2},
        {"method": "mlp_speculator", "num_speculative_tokens": 2},
    ):
        with pytest.raises(AssertionError):
            _construct(bad)
    with pytest.raises(Exception, match="speculative_token_tree"):  # noqa: B017 - pydantic's ValidationError
        _construct({"method": "eagle", "num_speculative_tokens": 2, "speculative_token_tree": "[(0,), (0, 0)]"})
