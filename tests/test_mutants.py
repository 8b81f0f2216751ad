"""The planted bugs of tools/mutants.py are checked, not stated (docs/architecture.md#planted-bugs).

Every mutant's snippet must still be in the code (a refactor that moves code must move its
mutants), and one slice of a recorded rotation is planted per commit and must be killed by its
tests: slice `git rev-list --count HEAD` mod ROTATION_COMMITS (60), so that any 60 consecutive
commits plant every listed mutant at least once. `python tools/mutants.py --slice I` reruns a
commit's slice, `python tools/mutants.py` runs all of them.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the number of consecutive commits within which every listed mutant is planted (stated in
#: docs/architecture.md#planted-bugs; tools/mutants.py holds it as ROTATION_COMMITS)
ROTATION_COMMITS = 60
#: the most mutants one commit plants: the suite's 15-minute budget (docs/architecture.md#planted-bugs)
MAX_PER_COMMIT = 9
SAMPLE_SIZE = 12


def _mutants_module():
    spec = importlib.util.spec_from_file_location("treeopt_mutants", ROOT / "tools" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _slice_index() -> tuple[int, str]:
    """(the rotation's index for this checkout, where it comes from): TREEOPT_MUTANT_SLICE if set,
    else the number of commits up to HEAD; without git (an exported tree), the day, so that such
    checkouts still rotate, a slice a day."""
    if os.environ.get("TREEOPT_MUTANT_SLICE"):
        return int(os.environ["TREEOPT_MUTANT_SLICE"]), "TREEOPT_MUTANT_SLICE"
    count = subprocess.run(
        ["git", "rev-list", "--count", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    if count.isdigit():
        return int(count), "git rev-list --count HEAD"
    return int(time.time() // 86400), "the day (no git)"


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


def test_the_rotation_plants_every_mutant_within_the_stated_number_of_commits():
    mutants = _mutants_module()
    every = mutants.MUTANTS
    assert mutants.ROTATION_COMMITS == ROTATION_COMMITS
    for start in (0, 7, 1000):  # any window of ROTATION_COMMITS consecutive commits
        slices = [mutants.rotation_slice(every, i) for i in range(start, start + ROTATION_COMMITS)]
        planted = [m.id for s in slices for m in s]
        assert sorted(planted) == sorted(m.id for m in every)  # each exactly once
    # each commit pays for at most ceil(N / ROTATION_COMMITS) mutants
    assert max(len(mutants.rotation_slice(every, i)) for i in range(ROTATION_COMMITS)) == math.ceil(
        len(every) / ROTATION_COMMITS
    )
    assert math.ceil(len(every) / ROTATION_COMMITS) <= MAX_PER_COMMIT, (
        f"{len(every)} mutants plant more than {MAX_PER_COMMIT} a commit: raise ROTATION_COMMITS in "
        "tools/mutants.py and tests/test_mutants.py (and where docs/architecture.md and README.md state it)"
    )
    assert mutants.rotation_slice(every, 3) == mutants.rotation_slice(every, 3 + ROTATION_COMMITS)


def test_the_sample_is_fixed_by_its_seed():
    mutants = _mutants_module()
    every = mutants.MUTANTS
    first = mutants.sample(every, SAMPLE_SIZE, "abc")
    assert first == mutants.sample(every, SAMPLE_SIZE, "abc")
    assert len(first) == SAMPLE_SIZE == len({m.id for m in first})


@pytest.mark.slow
def test_this_commits_slice_of_planted_bugs_is_killed():
    index, source = _slice_index()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "mutants.py"), "--slice", str(index), "--skip", "pending"],
        capture_output=True,
        text=True,
        check=False,
    )
    where = f"slice {index % ROTATION_COMMITS} of {ROTATION_COMMITS} (index {index} from {source})"
    assert proc.returncode == 0, f"{where}: a listed mutant survived\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
