"""The drafter's own scores recorded by `treeopt calibrate --draft-scores` (issue 43): the sidecar
against `treeopt sglang-tau`'s own pass on the same prompts (a separate drafting pass, equal in
float32 bit for bit), resumed runs against uninterrupted ones, and every damaged or foreign
sidecar refused in one line naming the file (docs/formats.md#draft-score-sidecar-namescoresnpz)."""

from __future__ import annotations

import numpy as np
import pytest

from treeopt.draft_scores import (
    DraftScores,
    draft_scores_path,
    draft_scores_tau,
    load_draft_scores,
    save_draft_scores,
)
from treeopt.engines import sglang_pool_size
from treeopt.errors import UserError
from treeopt.npz_input import write_npz

# sglang-tau's own pass: 4 demo prompts of 24 tokens, 12 new tokens, steps 3 of topk 2
STEPS, TOPK, NEW, PROMPTS = 3, 2, 12, 4


def _source():
    from calibration.models import ModelSource

    return ModelSource("demo", None, "eagle3", None, "cpu", "float32")


def _calibrate(out, *, max_prompts=PROMPTS, batch_size=16, resume=False, topk=TOPK):
    from calibration.runner import CalibrationSettings, run_calibration

    # why batch 16 and --steps NEW + STEPS: the batches and the greedy sequences of sglang-tau's
    # pass (CHUNK prompts at once, new tokens + steps generated)
    settings = CalibrationSettings(
        steps=NEW + STEPS, topk=4, batch_size=batch_size, max_prompts=max_prompts, draft_scores_topk=topk
    )
    return run_calibration(
        _source(), "demo", output=out, settings=settings, prompt_tokens=24, resume=resume, progress=False, threads=1
    )


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "acc.json"
    _calibrate(out)
    return out


def test_the_sidecar_predicts_what_sglang_tau_drafts_itself(calibrated):
    """Same prompts, same triple: sglang-tau's own pass (greedy continuation and pool drafted
    again, steps 3 only) and the calibration's sidecar (pools of all 8 depths, cut to 3) give
    the same pool scores and the same tau, exactly."""
    from treeopt.app.sglang_tau import TauSettings, _predicted, _prompts, sglang_tau

    settings = TauSettings(STEPS, TOPK, (3, 6, 9), max_prompts=PROMPTS, prompt_tokens=24, new_tokens=NEW)
    own = sglang_tau(_source(), "demo", settings)
    from_file = sglang_tau(_source(), "demo", settings, scores=draft_scores_path(calibrated))
    assert [r.num_draft_tokens for r in own] == [3, 6, 9]
    for a, b in zip(own, from_file, strict=True):
        assert (a.tau_predicted, a.tau_predicted_se, a.steps_walked) == (
            b.tau_predicted,
            b.tau_predicted_se,
            b.steps_walked,
        )
    assert own[0].steps_walked > PROMPTS  # the walk took steps, not an empty set
    recorded = load_draft_scores(draft_scores_path(calibrated))
    lm = _source().load()
    scores, on_path, seq = _predicted(lm, _prompts(lm, "demo", settings), settings)
    pool = sglang_pool_size(STEPS, TOPK)
    assert recorded.steps_recorded == lm.heads.num_heads and recorded.topk == TOPK
    assert np.array_equal(recorded.pool_probability[:, :pool], scores)
    assert np.array_equal(recorded.on_path_index[:, :STEPS], on_path)
    assert np.array_equal(recorded.sequence_index, seq)
    # the path's nodes are found in the pool, and the pool's scores are probabilities
    assert (on_path[:, 0] >= 0).mean() > 0.3
    assert np.all(recorded.pool_probability[:, :TOPK].sum(1) <= 1 + 1e-6)


def test_the_sidecar_rows_are_the_rank_vector_rows(calibrated):
    from treeopt.acceptance import load_rank_vectors
    from treeopt.accuracy import load_accuracy

    ranks, sequence = load_rank_vectors(calibrated)
    recorded = load_draft_scores(draft_scores_path(calibrated))
    assert np.array_equal(recorded.sequence_index, sequence)
    assert recorded.run_id == load_accuracy(calibrated).provenance["run_id"]
    # on-path node at depth 1 exists exactly when the label's rank is below topk (a depth-1
    # pool node is the root's rank-r child, r < topk)
    assert np.array_equal(recorded.on_path_index[:, 0] >= 0, (ranks[:, 0] >= 0) & (ranks[:, 0] < TOPK))


def test_a_resumed_calibration_writes_the_same_sidecar(tmp_path):
    """Two prompts, stopped (checkpoint kept), then resumed to four: the sidecar is byte for
    byte the one of an uninterrupted run with the same batches."""
    whole, part = tmp_path / "whole.json", tmp_path / "part.json"
    _calibrate(whole, batch_size=2)
    first = _calibrate(part, max_prompts=2, batch_size=2)
    assert not first.complete and first.checkpoint is not None
    # the table of the prompts so far has its sidecar: generated - 1 rows per prompt
    assert load_draft_scores(draft_scores_path(part)).rows == 2 * (NEW + STEPS - 1)
    _calibrate(part, batch_size=2, resume=True)
    assert draft_scores_path(part).read_bytes() == draft_scores_path(whole).read_bytes()


def test_a_resume_never_mixes_pools_of_another_topk(tmp_path):
    out = tmp_path / "acc.json"
    _calibrate(out, max_prompts=2, batch_size=2)
    with pytest.raises(UserError, match="draft_scores_topk"):
        _calibrate(out, batch_size=2, resume=True, topk=3)


def test_calibrate_refuses_draft_scores_for_a_drafter_no_engine_trees_dynamically(tmp_path):
    from calibration.models import ModelSource
    from calibration.runner import CalibrationSettings, run_calibration

    with pytest.raises(UserError, match="--draft-scores: .*medusa drafters are not served that way"):
        run_calibration(
            ModelSource("demo", None, "medusa", None, "cpu", "float32"),
            "demo",
            output=tmp_path / "a.json",
            settings=CalibrationSettings(steps=8, max_prompts=1, draft_scores_topk=2),
            progress=False,
        )
    assert not (tmp_path / "a.json").exists()


# ---- the file itself


def _scores(rows_per_prompt=4, prompts=2, steps=2, topk=2, seed=0) -> DraftScores:
    g = np.random.default_rng(seed)
    n, m = rows_per_prompt * prompts, sglang_pool_size(steps, topk)
    return DraftScores(
        g.random((n, m)).astype(np.float32),
        g.integers(-1, m, (n, steps)).astype(np.int32),
        np.repeat(np.arange(prompts), rows_per_prompt).astype(np.int32),
        steps,
        topk,
        rows_per_prompt + 1,
        "abc",
    )


def test_round_trip(tmp_path):
    s = _scores()
    save_draft_scores(tmp_path / "a.scores.npz", s)
    back = load_draft_scores(tmp_path / "a.scores.npz")
    assert np.array_equal(back.pool_probability, s.pool_probability)
    assert np.array_equal(back.on_path_index, s.on_path_index)
    assert (back.steps_recorded, back.topk, back.generated_tokens, back.run_id) == (2, 2, 5, "abc")


def test_tau_by_hand(tmp_path):
    """One prompt of 4 generated tokens, steps 1 of topk 2, hand-walked: rows t = 0..2, steps
    start at rows 0 .. new_tokens - 2 = 1 only (4 - 1 new tokens). Row 0's on-path node is pool
    node 1 (0.3, one node scores higher), row 1's is node 0 (0.9, the best), row 2 has none."""
    s = DraftScores(
        np.array([[0.6, 0.3], [0.9, 0.05], [0.5, 0.5]], np.float32),
        np.array([[1], [0], [-1]], np.int32),
        np.zeros(3, np.int32),
        1,
        2,
        4,
    )
    # num_draft_tokens 2 (one node): row 0 rejects (0.3 not best) -> step of 1 token at t=0,
    # next at t=1 accepts node 0 -> 2 tokens, next start t=3 is past the walk: tau = 3 / 2
    assert draft_scores_tau(s, 1, 2, 2)[0] == pytest.approx(1.5)
    # num_draft_tokens 3 (both nodes): t=0 accepts -> 2 tokens, next start t=2 is past rows 0..1
    # of the walk: tau = 2 / 1
    assert draft_scores_tau(s, 1, 2, 3)[0] == pytest.approx(2.0)


def _write(path, **override):
    s = _scores()
    arrays = {
        "format": np.asarray("treeopt.draft-scores/v1"),
        "pool_probability": s.pool_probability,
        "on_path_index": s.on_path_index,
        "sequence_index": s.sequence_index,
        "steps_recorded": np.asarray(2),
        "topk": np.asarray(2),
        "generated_tokens": np.asarray(5),
        "run_id": np.asarray("abc"),
    }
    arrays.update(override)
    write_npz(path, {k: v for k, v in arrays.items() if v is not None})


@pytest.mark.parametrize(
    "override, message",
    [
        ({"format": np.asarray("treeopt.draft-scores/v2")}, "written by a newer treeopt"),
        ({"format": None}, "not a draft-score file"),
        ({"pool_probability": np.full((8, 6), np.nan, np.float32)}, "outside \\[0, 1\\] \\(NaN included\\)"),
        ({"pool_probability": np.zeros((8, 5), np.float32)}, "must be \\(N, 6\\) float32"),
        ({"on_path_index": np.zeros((8, 3), np.int32)}, "'on_path_index' must be \\(8, 2\\)"),
        ({"on_path_index": np.full((8, 2), 6, np.int32)}, "outside -1..5"),
        (
            {
                "pool_probability": np.zeros((7, 6), np.float32),
                "on_path_index": np.zeros((7, 2), np.int32),
                "sequence_index": np.repeat([0, 1], [3, 4]).astype(np.int32),
            },
            "a prompt holds 3 rows, expected 4",
        ),
        ({"steps_recorded": np.asarray(0)}, "'steps_recorded' must be an integer >= 1"),
    ],
)
def test_bad_sidecars_are_refused_naming_the_file(tmp_path, override, message):
    path = tmp_path / "bad.scores.npz"
    _write(path, **override)
    with pytest.raises(UserError, match=message) as err:
        load_draft_scores(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_a_truncated_sidecar_is_refused(tmp_path):
    path = tmp_path / "cut.scores.npz"
    _write(path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(UserError, match=str(path)):
        load_draft_scores(path)


def test_a_triple_the_file_cannot_answer(tmp_path):
    s = _scores()
    with pytest.raises(UserError, match="recorded for topk 2, not 3"):
        draft_scores_tau(s, 1, 3, 3)
    with pytest.raises(UserError, match="recorded for topk 2, not 1"):  # a smaller topk's beams differ too
        draft_scores_tau(s, 1, 1, 2)
    with pytest.raises(UserError, match="--steps 3 is outside 1..2"):
        draft_scores_tau(s, 3, 2, 3)
    with pytest.raises(UserError, match="fewer than 2"):
        draft_scores_tau(_scores(rows_per_prompt=2), 2, 2, 3)


def test_the_command_reads_a_bad_sidecar_in_one_line(tmp_path, capsys):
    from treeopt.cli import main

    path, out = tmp_path / "bad.scores.npz", tmp_path / "tau.csv"
    _write(path, pool_probability=np.full((8, 6), np.nan, np.float32))
    args = ["sglang-tau", "--scores", str(path), "--steps", "2", "--topk", "2", "--draft-tokens", "3", "-o", str(out)]
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"treeopt: error: {path}:") and "\n" not in err
    assert not out.exists()


def test_the_command_predicts_from_a_sidecar_without_a_model(tmp_path, capsys):
    from treeopt.cli import main

    path, out = tmp_path / "good.scores.npz", tmp_path / "tau.csv"
    _write(path)
    main(["sglang-tau", "--scores", str(path), "--steps", "2", "--topk", "2", "--draft-tokens", "3,6", "-o", str(out)])
    import pandas as pd

    rows = pd.read_csv(out)
    assert rows["num_draft_tokens"].tolist() == [3, 6]
    expected = [draft_scores_tau(_scores(), 2, 2, n)[0] for n in (3, 6)]
    assert rows["tau_predicted"].tolist() == pytest.approx(expected)


def test_another_commands_output_never_replaces_the_sidecar(calibrated, capsys):
    """The sidecar is an input beside its table: `treeopt build` on the table refuses it as its
    output, in one line, and leaves it as it was (docs/formats.md#output-safety)."""
    from treeopt.cli import main

    side = draft_scores_path(calibrated)
    before = side.read_bytes()
    with pytest.raises(SystemExit) as stop:
        main(["build", "--accuracy", str(calibrated), "--nodes", "4", "-o", str(side)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"treeopt: error: {side}:") and "is also an input" in err and "\n" not in err
    assert side.read_bytes() == before


def test_the_calibrate_command_refuses_draft_scores_it_cannot_record(tmp_path, capsys):
    """One line, exit 2, no output: a drafter no engine drafts a dynamic tree with, and data labels."""
    from treeopt.cli import main

    out = tmp_path / "acc.json"
    base = ["calibrate", "--max-prompts", "1", "--steps", "10", "--prompt-tokens", "24", "-q", "-o", str(out)]
    for extra, message in (
        (["--drafter", "medusa", "--draft-scores", "2"], "medusa drafters are not served that way"),
        (["--drafter", "eagle3", "--draft-scores", "2", "--labels", "data"], "needs greedy labels"),
    ):
        with pytest.raises(SystemExit) as stop:
            main([*base, *extra])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("treeopt: error: --draft-scores:") and message in err and "\n" not in err
        assert not out.exists() and not draft_scores_path(out).exists()
