import os

# The models in the tests are tiny: one thread is fastest, and on a busy 2-core machine a
# second OpenMP thread makes every op wait for the other core.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The longest tests start first, so that with `pytest -n auto` (README) no core is left running
# one of them alone at the end. Measured with `--durations`: each takes about a minute or more
# on one core; a name that no longer exists is simply not moved.
LONGEST_FIRST = (
    "tests/test_mutants.py::test_this_commits_slice_of_planted_bugs_is_killed",
    "tests/test_pipeline.py::test_two_runs_on_a_busy_machine_agree",
    "tests/test_run_draft_model.py::test_run_with_a_draft_model_measures_chains_and_trees_and_picks_a_form",
    "tests/test_architecture.py::test_every_calibration_module_imports_first",
    "tests/test_demo_drafters.py::test_run_with_hydra_and_the_side_by_side_report",
    "tests/test_select_pooled.py::test_select_on_a_run_sweep_repeats_the_runs_pooled_evidence",
    "tests/test_run_forms.py::test_run_with_an_mlp_speculator_measures_candidate_sequences_and_picks_a_form",
)


def pytest_collection_modifyitems(items):
    rank = {node_id: i for i, node_id in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))  # stable: the rest keep their order
