"""The planted bugs of tools/mutants.py are checked, not stated (docs/architecture.md#planted-bugs).

Every mutant's snippet must still be in the code (a refactor that moves code must move its
mutants), and a sample of them is planted and must be killed by its tests. The sample is drawn
with the commit as the seed, so each commit checks a different dozen and the whole list is
covered over successive commits; `python tools/mutants.py` runs all of them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_SIZE = 12


def _mutants_module():
    spec = importlib.util.spec_from_file_location("treeopt_mutants", ROOT / "tools" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _seed() -> str:
    """TREEOPT_MUTANT_SEED if set, else the checked-out commit, else a fixed seed."""
    if os.environ.get("TREEOPT_MUTANT_SEED"):
        return os.environ["TREEOPT_MUTANT_SEED"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return head.stdout.strip() or "0"


def test_every_mutant_still_finds_its_code():
    mutants = _mutants_module()
    assert mutants.snippet_problems(ROOT, mutants.MUTANTS) == []


def test_mutant_ids_are_unique_and_each_names_its_tests():
    mutants = _mutants_module().MUTANTS
    ids = [m.id for m in mutants]
    assert len(ids) == len(set(ids))
    for m in mutants:
        assert m.tests and all((ROOT / t.split("::")[0]).is_file() for t in m.tests), m.id
        assert m.original != m.replacement, m.id


def test_the_sample_is_fixed_by_its_seed_and_covers_the_list():
    mutants = _mutants_module()
    every = mutants.MUTANTS
    first = mutants.sample(every, SAMPLE_SIZE, "abc")
    assert first == mutants.sample(every, SAMPLE_SIZE, "abc")
    assert len(first) == SAMPLE_SIZE == len({m.id for m in first})
    seen = {m.id for seed in range(200) for m in mutants.sample(every, SAMPLE_SIZE, str(seed))}
    assert len(seen) > 0.95 * len(every)


@pytest.mark.slow
def test_a_sample_of_planted_bugs_is_killed():
    seed = _seed()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "mutants.py"),
            "--sample",
            str(SAMPLE_SIZE),
            "--seed",
            seed,
            "--skip",
            "pending",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"seed {seed}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
