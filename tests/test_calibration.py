"""The calibration runner (issue 4): counts against a slow per-position reference, joint
consistency, left padding, checkpoint/resume, determinism, data sources, Medusa import, the
demo quality floor and bad inputs. Tiny random models unless stated: a run takes a second."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from calibration import runner
from calibration.counts import CalibrationCounts
from calibration.data import (
    chunk_ids,
    load_prompts,
    read_json_prompts,
    read_prompt_texts,
)
from calibration.demo_files import DEMO_MODEL_DIR, DEMO_PROMPTS
from calibration.labels import greedy_continuations, label_ranks, pad_left
from calibration.medusa_import import import_medusa_accuracy
from calibration.models import ModelSource, load_model, tiny_model_for_tests
from calibration.runner import CalibrationInterrupted, CalibrationSettings, calibrate, run_calibration
from treeopt.acceptance import load_rank_vectors, rank_vectors_path
from treeopt.accuracy import AccuracyTable, joint_counts_from_ranks, load_accuracy
from treeopt.cli import main
from treeopt.errors import UserError

PROMPTS = [
    "def f(x):\n    return x + 1\n",
    "import os\n",
    "class A:\n    def __init__(self):\n        self.a = [1, 2, 3]\n",
    "x = 1",
    "for i in range(10):\n    print(i * i)\n",
    "# comment\n",
    "while True:\n    break\n",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny"), num_medusa_heads=3)


@pytest.fixture(scope="module")
def loaded(tiny):
    return load_model(str(tiny), device="cpu", dtype="float32")


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")


# ---------------------------------------------------------------------------------------------
# slow reference: one prompt at a time, no cache, one forward per position, Python loops


def reference_ranks(loaded, token_ids, steps, labels):
    """Rank vectors (N, K) computed position by position, the obvious way."""
    model, heads = loaded.model, loaded.heads
    K = heads.num_heads
    rows = []
    with torch.no_grad():
        for prompt in token_ids:
            seq = list(prompt)
            if labels == "greedy":
                for _ in range(steps):  # greedy by full re-encoding (no cache, no padding)
                    seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
                first = len(prompt) - 1
            else:
                first = 0
            L = len(seq)
            for t in range(first, L - 2):  # positions where head 0 has a label
                out = model(torch.tensor([seq[: t + 1]]), output_hidden_states=True)
                h = out.hidden_states[-1][0, -1]
                # the hidden state the base lm_head reads:
                assert torch.allclose(model.lm_head(h), out.logits[0, -1], atol=1e-4)
                row = []
                for k in range(K):
                    if t + k + 2 <= L - 1:
                        logits = heads[k](h).tolist()
                        label = logits[seq[t + k + 2]]
                        row.append(sum(1 for v in logits if v > label))
                    else:
                        row.append(-1)
                rows.append(row)
    return np.array(rows, dtype=np.int64), seq


def counts_from_ranks(ranks, width):
    K = ranks.shape[1]
    hits = np.zeros((K, width), np.int64)
    for row in ranks:
        for k, r in enumerate(row):
            if 0 <= r < width:
                hits[k, r] += 1
    positions = (ranks >= 0).sum(0)
    return hits, positions


def brute_joint(ranks, width):
    joint = {}
    for row in ranks.tolist():
        path = ()
        for r in row:
            if not 0 <= r < width:
                break
            path += (r,)
            joint[path] = joint.get(path, 0) + 1
    return joint


def tokenized(loaded, texts):
    return [tuple(loaded.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts]


# ---------------------------------------------------------------------------------------------
# counts


@pytest.mark.parametrize("labels", ["greedy", "data"])
def test_counts_match_slow_reference(loaded, prompts_file, labels):
    steps, topk = 6, 12
    prompts = load_prompts(prompts_file, loaded.tokenizer, max_prompts=4)
    ref, _ = reference_ranks(loaded, prompts.token_ids, steps, labels)
    result = calibrate(loaded, prompts, CalibrationSettings(steps, topk, labels, batch_size=3), progress=False)
    hits, positions = counts_from_ranks(ref, topk)
    assert (ref >= 0).any() and (hits.sum() > 0)
    np.testing.assert_array_equal(result.table.hits, hits)
    np.testing.assert_array_equal(result.table.positions, positions)
    assert result.table.joint == brute_joint(ref, topk)
    # the kept rank vectors: the reference's rows (prompt by prompt, t increasing), misses
    # capped at topk, -1 for no label
    assert result.ranks.dtype == np.int16 and result.sequence.dtype == np.int32
    np.testing.assert_array_equal(result.ranks, np.minimum(ref, topk))
    # rows per prompt: t = P-1 .. P+steps-3 (greedy), 0 .. P-3 (data)
    per_prompt = [steps - 1 if labels == "greedy" else max(len(p) - 2, 0) for p in prompts.token_ids[:4]]
    np.testing.assert_array_equal(result.sequence, np.repeat(np.arange(4), per_prompt))
    if labels == "greedy":
        # head k has steps - 1 - k labelled positions per prompt
        assert positions.tolist() == [4 * (steps - 1 - k) for k in range(3)]
    prov = result.table.provenance
    assert prov["labels"] == labels and prov["topk"] == topk and prov["prompts"] == 4
    assert prov["date"] == "2023-11-14"


def test_label_ranks_exact_and_full_width(loaded):
    """Exact ranks (any width up to the vocabulary), rows in label_rows order."""
    token_ids = tokenized(loaded, PROMPTS[:3])
    ref, _ = reference_ranks(loaded, token_ids, 0, "data")
    ranks = label_ranks(
        loaded.model, loaded.heads, [list(p) for p in token_ids], [0] * 3, chunk_elements=64 * 5
    )  # 5 rows per chunk
    np.testing.assert_array_equal(ranks, ref)
    assert ranks.max() > 10  # ranks beyond any small top-k are exact too
    # width = vocabulary: every label is ranked, so nothing is a miss
    result = calibrate(
        loaded, load_prompts_from(loaded, PROMPTS[:3]), CalibrationSettings(labels="data", topk=64), progress=False
    )
    assert result.table.hits.sum(1).tolist() == result.table.positions.tolist()


def load_prompts_from(loaded, texts):
    from calibration.data import PromptSet

    return PromptSet(tuple(tokenized(loaded, texts)), "inline", "0" * 64, "jsonl")


def test_joint_counts_consistent_with_per_rank_counts(loaded):
    prompts = load_prompts_from(loaded, PROMPTS)
    for topk in (5, 64):
        t = calibrate(loaded, prompts, CalibrationSettings(steps=8, topk=topk, batch_size=4), progress=False).table
        joint = t.joint
        # depth 1 = head 0's hits, rank by rank
        for r in range(topk):
            assert joint.get((r,), 0) == t.hits[0, r]
        # children never exceed their prefix; depth-d totals never exceed positions[d-1]
        for path, n in joint.items():
            children = sum(c for p, c in joint.items() if len(p) == len(path) + 1 and p[:-1] == path)
            assert children <= n
        for d in range(1, t.num_heads + 1):
            total = sum(c for p, c in joint.items() if len(p) == d)
            assert total <= t.positions[d - 1]
            if topk == 64 and d == 1:  # full width: every labelled position has a depth-1 path
                assert total == t.positions[0]
        if topk == 64:  # every label ranked: full-depth paths exist
            assert max(len(p) for p in joint) == t.num_heads


def test_greedy_generation_uses_cache_and_matches_unbatched(loaded):
    token_ids = [list(p) for p in tokenized(loaded, PROMPTS[:4])]
    assert len({len(p) for p in token_ids}) == 4  # different lengths: real left padding
    batched = greedy_continuations(loaded.model, token_ids, 7, pad_id=0)
    for p, gen in zip(token_ids, batched):
        _, seq = reference_ranks(loaded, [p], 7, "greedy")
        assert gen == seq[len(p) :]


def test_left_padding_gives_the_counts_of_single_prompts(loaded):
    prompts = load_prompts_from(loaded, PROMPTS)
    batched = calibrate(loaded, prompts, CalibrationSettings(steps=8, topk=10, batch_size=7), progress=False).table
    single = calibrate(loaded, prompts, CalibrationSettings(steps=8, topk=10, batch_size=1), progress=False).table
    np.testing.assert_array_equal(batched.hits, single.hits)
    np.testing.assert_array_equal(batched.positions, single.positions)
    assert batched.joint == single.joint


def test_counts_add_up_over_batches(loaded):
    ranks = np.array([[0, 1, -1], [2, 9, 0], [0, 0, 0], [11, 0, -1]])
    counts = CalibrationCounts.zeros(3, 10)
    counts.add_ranks(ranks[:2])
    counts.add_ranks(ranks[2:])
    assert counts.positions.tolist() == [4, 4, 2]
    assert counts.hits[0].tolist() == [2, 0, 1] + [0] * 7
    assert counts.joint == joint_counts_from_ranks(ranks, 10) == brute_joint(ranks, 10)


# ---------------------------------------------------------------------------------------------
# checkpoint / resume / determinism / CLI


def run_cli(*args):
    """Exit status of `treeopt ARGS` (main() returns on success, exits on errors)."""
    try:
        main(list(args))
    except SystemExit as exc:
        return exc.code
    return 0


def test_resume_equals_uninterrupted_and_output_is_deterministic(tiny, prompts_file, tmp_path):
    common = [
        "calibrate",
        "--model",
        str(tiny),
        "--data",
        str(prompts_file),
        "--steps",
        "5",
        "--batch-size",
        "2",
        "--checkpoint-every",
        "2",
        "-q",
    ]
    full, again, resumed = tmp_path / "full.json", tmp_path / "again.json", tmp_path / "res.json"
    for out in (full, again):
        assert run_cli(*common, "-o", str(out)) == 0
    assert full.read_bytes() == again.read_bytes()
    assert not (tmp_path / "full.json.partial").exists()  # removed once complete

    assert run_cli(*common, "--max-prompts", "4", "-o", str(resumed)) == 0
    partial = json.loads((tmp_path / "res.json.partial").read_text())
    assert partial["prompts_done"] == 4
    assert json.loads(resumed.read_text())["provenance"]["prompts"] == 4
    assert run_cli(*common, "--resume", "-o", str(resumed)) == 0
    assert resumed.read_bytes() == full.read_bytes()
    assert not (tmp_path / "res.json.partial").exists()
    # the rank-vector sidecars too: resumed == uninterrupted, byte for byte
    sidecar = rank_vectors_path(full)
    assert sidecar == tmp_path / "full.ranks.npz"
    assert rank_vectors_path(resumed).read_bytes() == sidecar.read_bytes() == rank_vectors_path(again).read_bytes()


def test_ctrl_c_saves_checkpoint_and_resume_does_not_double_count(loaded, prompts_file, tmp_path, monkeypatch):
    prompts = load_prompts(prompts_file, loaded.tokenizer)
    ckpt = tmp_path / "c.partial"
    uninterrupted = calibrate(loaded, prompts, CalibrationSettings(steps=5, batch_size=2), progress=False)
    full, full_ranks, full_sequence = uninterrupted.table, uninterrupted.ranks, uninterrupted.sequence
    assert full_ranks.shape == (7 * 4, 3) and (full_sequence == np.repeat(np.arange(7), 4)).all()

    real, calls = runner.label_ranks, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "label_ranks", flaky)
    with pytest.raises(CalibrationInterrupted) as exc:
        calibrate(
            loaded,
            prompts,
            CalibrationSettings(steps=5, batch_size=2, checkpoint_every=100),
            checkpoint=ckpt,
            progress=False,
        )
    assert exc.value.checkpoint == ckpt and exc.value.prompts_done == 4
    monkeypatch.setattr(runner, "label_ranks", real)
    res = calibrate(
        loaded, prompts, CalibrationSettings(steps=5, batch_size=2), checkpoint=ckpt, resume=True, progress=False
    )
    assert res.complete and not ckpt.exists()
    assert res.table.to_dict() == full.to_dict()
    np.testing.assert_array_equal(res.ranks, full_ranks)
    np.testing.assert_array_equal(res.sequence, full_sequence)


def test_resume_refuses_other_inputs(loaded, prompts_file, tmp_path):
    prompts = load_prompts(prompts_file, loaded.tokenizer)
    ckpt = tmp_path / "c.partial"
    calibrate(
        loaded, prompts, CalibrationSettings(steps=5, batch_size=2, max_prompts=2), checkpoint=ckpt, progress=False
    )
    assert ckpt.exists()
    with pytest.raises(UserError, match=r"c\.partial: checkpoint was made with other inputs.*topk"):
        calibrate(
            loaded,
            prompts,
            CalibrationSettings(steps=5, topk=7, batch_size=2),
            checkpoint=ckpt,
            resume=True,
            progress=False,
        )
    doc = json.loads(ckpt.read_text())
    assert doc["rank_vectors"]["rows"] == 2 * 4
    del doc["rank_vectors"]
    ckpt.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"c\.partial: checkpoint of an older treeopt \(no rank vectors\)"):
        calibrate(
            loaded, prompts, CalibrationSettings(steps=5, batch_size=2), checkpoint=ckpt, resume=True, progress=False
        )
    ckpt.write_text("{not json")
    with pytest.raises(UserError, match=r"c\.partial: not valid JSON \(line 1"):
        calibrate(
            loaded, prompts, CalibrationSettings(steps=5, batch_size=2), checkpoint=ckpt, resume=True, progress=False
        )


def test_cli_output_builds_a_tree(tiny, prompts_file, tmp_path, capsys):
    out = tmp_path / "acc.json"
    assert (
        run_cli(
            "calibrate",
            "--model",
            str(tiny),
            "--data",
            str(prompts_file),
            "--steps",
            "6",
            "--topk",
            "4",
            "-o",
            str(out),
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "calibrated 7 prompts" in text and f"wrote {out}" in text
    table = load_accuracy(out)
    assert table.width == 4 and table.num_heads == 3 and table.joint is not None
    assert table.provenance["model"] == str(tiny)
    assert run_cli("build", "--accuracy", str(out), "--nodes", "5", "--format", "python") == 0
    assert "[0]" in capsys.readouterr().out


def test_rank_vector_sidecar_reproduces_the_table(tiny, prompts_file, tmp_path):
    out = tmp_path / "acc.json"
    result = run_calibration(
        ModelSource(str(tiny), device="cpu", dtype="float32"),
        str(prompts_file),
        output=out,
        settings=CalibrationSettings(steps=6, topk=4, batch_size=3),
        progress=False,
    )
    sidecar = tmp_path / "acc.ranks.npz"
    assert sidecar.is_file()
    with np.load(sidecar) as z:
        assert int(z["width"]) == 4
        assert json.loads(str(z["fingerprint"])) == result.fingerprint
        assert json.loads(str(z["fingerprint"]))["model"] == str(tiny)
    ranks, sequence = load_rank_vectors(out)
    assert ranks.shape == (7 * 5, 3) and ranks.dtype == np.int16
    assert ranks.min() == -1 and ranks.max() == 4  # no label / miss (rank >= topk)
    np.testing.assert_array_equal(sequence, np.repeat(np.arange(7), 5))
    table = load_accuracy(out)
    rebuilt = AccuracyTable.from_ranks(ranks, table.width)
    np.testing.assert_array_equal(rebuilt.hits, table.hits)  # per head, per rank
    np.testing.assert_array_equal(rebuilt.positions, table.positions)
    assert rebuilt.joint == table.joint


def test_cli_module_entry_point_bad_input_is_one_line(tiny, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "treeopt",
            "calibrate",
            "--model",
            str(tiny),
            "--data",
            str(empty),
            "-o",
            str(tmp_path / "a.json"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"treeopt: error: {empty}: no prompts"
    assert not (tmp_path / "a.json").exists()


# ---------------------------------------------------------------------------------------------
# data sources


def test_jsonl_fields_and_order(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "a", "text": "no"},
        {"instruction": "b"},
        {"text": "c", "turns": ["no"]},
        {"turns": ["d", "second turn"]},
        {"prompt": ""},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert read_prompt_texts(path) == ["a", "b", "c", "d"]
    # Medusa's / Alpaca's evaluation sets: one JSON list
    medusa = tmp_path / "alpaca_eval.json"
    medusa.write_text(json.dumps([{"instruction": "a", "output": "x"}, "b", {"turns": ["c"]}]))
    assert read_json_prompts(medusa) == ["a", "b", "c"]
    medusa.write_text(json.dumps({"instruction": "a"}))
    with pytest.raises(UserError, match=r"alpaca_eval\.json: expected a JSON list of prompts"):
        read_json_prompts(medusa)
    medusa.write_text(json.dumps([{"instruction": "a"}, {"question": "b"}]))
    with pytest.raises(UserError, match=r"alpaca_eval\.json: item 1: none of the fields"):
        read_json_prompts(medusa)


def test_text_and_directory_chunking(loaded, tmp_path):
    tok = loaded.tokenizer
    text = "abcdefghij" * 5  # 50 tokens with the character tokenizer
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.py").write_text(text)
    (tmp_path / "d" / "a.txt").write_text("xyz")
    (tmp_path / "d" / "bad.py").write_bytes(b"x = '\xff'\n")
    (tmp_path / "d" / "ignored.bin").write_text("nope")
    single = load_prompts(tmp_path / "d" / "b.py", tok, prompt_tokens=16)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # 50 = 16 + 16 + 16 + 2: the 2-token tail is shorter than half a chunk and dropped
    assert [len(p) for p in single.token_ids] == [16, 16, 16]
    assert list(sum(single.token_ids, ())) == ids[:48]
    d = load_prompts(tmp_path / "d", tok, prompt_tokens=16)
    assert d.token_ids[0] == tuple(tok("xyz", add_special_tokens=False)["input_ids"])  # sorted: a.txt
    assert d.token_ids[1:] == single.token_ids and d.skipped == ("bad.py",)
    assert load_prompts(tmp_path / "d", tok, prompt_tokens=16, max_prompts=2).token_ids == d.token_ids[:2]
    assert chunk_ids([5, 6, 7, 8, 9], 4, prefix=[1]) == [(1, 5, 6, 7), (1, 8, 9)]
    assert chunk_ids([5, 6, 7, 8, 9, 10, 11], 6, prefix=[1]) == [(1, 5, 6, 7, 8, 9), (1, 10, 11)]
    assert chunk_ids([5, 6, 7, 8, 9, 10], 6, prefix=[1]) == [(1, 5, 6, 7, 8, 9)]  # 2 < 6 // 2
    assert chunk_ids([5], 4, prefix=[1]) == [(1, 5)]  # a file's only piece is kept


def test_bad_data_sources(loaded, tmp_path):
    tok = loaded.tokenizer
    cases = {
        "empty.jsonl": (b"", r"empty\.jsonl: no prompts"),
        "empty.txt": (b"", r"empty\.txt: no prompts"),
        "latin1.txt": (b"caf\xe9\n", r"latin1\.txt: not a UTF-8 text file \(byte 3\)"),
        "latin1.jsonl": (b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n', r"latin1\.jsonl:2: not valid UTF-8"),
        "broken.jsonl": (b'{"prompt": "a"}\n{"prompt": \n', r"broken\.jsonl:2: not valid JSON"),
        "nofield.jsonl": (b'{"prompt": "a"}\n{"question": "b"}\n', r"nofield\.jsonl:2: none of the fields"),
        "list.jsonl": (b'["a"]\n', r"list\.jsonl:1: expected a JSON object"),
        "number.jsonl": (b'{"text": 3}\n', r"number\.jsonl:1: field 'text' is int"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError, match=message):
            load_prompts(tmp_path / name, tok)
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(UserError, match="emptydir: no prompts"):
        load_prompts(tmp_path / "emptydir", tok)
    with pytest.raises(UserError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl", tok)


def test_bad_options(loaded, tiny, prompts_file, capsys):
    prompts = load_prompts(prompts_file, loaded.tokenizer)
    for kwargs, message in [
        ({"topk": 65}, "--topk: must be between 1 and the vocabulary size 64"),
        ({"steps": 3}, r"--steps: must be at least 4"),
        ({"batch_size": 0}, "--batch-size"),
        ({"labels": "sampled"}, "--labels"),
    ]:
        with pytest.raises(UserError, match=message):
            calibrate(loaded, prompts, CalibrationSettings(**kwargs), progress=False)
    short = load_prompts_from(loaded, ["ab", "abc"])
    with pytest.raises(UserError, match="too short"):
        calibrate(loaded, short, CalibrationSettings(labels="data"), progress=False)
    assert run_cli("calibrate", "--import", "x.pt", "--model", str(tiny), "-o", "a.json") == 2
    assert "--import: cannot be combined with --model" in capsys.readouterr().err
    assert run_cli("calibrate", "--model", str(tiny), "--threads", "0", "-o", "a.json") == 2
    assert "--threads: must be at least 1" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Medusa import


def medusa_results(ranks_per_head, width=20):
    """What Medusa's heads_accuracy.py saves: per head, (positions x width) booleans."""
    out = []
    for ranks in ranks_per_head:
        t = torch.zeros(len(ranks), width, dtype=torch.bool)
        for i, r in enumerate(ranks):
            if 0 <= r < width:
                t[i, r] = True
        out.append(t)
    return out


def test_import_medusa_calibration(tmp_path, capsys):
    rng = np.random.default_rng(0)
    # Medusa's layout: head k has fewer rows than head 0; ranks >= 20 are misses
    ranks = [rng.geometric(0.4, size=n) - 1 + rng.integers(0, 2, size=n) * 15 for n in (50, 45, 40)]
    path = tmp_path / "vicuna_heads_accuracy.pt"
    torch.save(medusa_results(ranks), path)
    table = import_medusa_accuracy(path)
    assert table.positions.tolist() == [50, 45, 40] and table.width == 20
    for k, r in enumerate(ranks):
        assert table.hits[k].tolist() == [float((r == i).sum()) for i in range(20)]
    assert table.joint is None
    # the authors' own reader: sum over positions (here divided by each head's own count)
    for k, t in enumerate(medusa_results(ranks)):
        np.testing.assert_allclose(table.accuracy[k], (t.sum(0) / len(t)).numpy())

    aligned = np.stack([r[:40] for r in ranks], 1)
    torch.save(medusa_results(aligned.T), path)
    table = import_medusa_accuracy(path)
    capped = np.where(aligned < 20, aligned, -1)
    assert table.joint == brute_joint(capped, 20)

    out = tmp_path / "acc.json"
    assert run_cli("calibrate", "--import", str(path), "-o", str(out)) == 0
    assert load_accuracy(out).to_dict()["heads"] == table.to_dict()["heads"]
    assert "imported" in capsys.readouterr().out


def test_import_bad_files(tmp_path):
    cases = {
        "notlist.pt": {"a": torch.zeros(2, 2)},
        "empty.pt": [],
        "oned.pt": [torch.zeros(5, dtype=torch.bool)],
        "widths.pt": [torch.zeros(5, 20, dtype=torch.bool), torch.zeros(4, 10, dtype=torch.bool)],
        "values.pt": [torch.full((3, 4), 2.0)],
    }
    messages = {
        "notlist.pt": "expected a non-empty list over heads",
        "empty.pt": "empty list",
        "oned.pt": r"head 0: expected a 2-D",
        "widths.pt": "head 1 has 10 rank columns",
        "values.pt": "values must be True/False",
    }
    for name, obj in cases.items():
        torch.save(obj, tmp_path / name)
        with pytest.raises(UserError, match=messages[name]):
            import_medusa_accuracy(tmp_path / name)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(UserError, match=r"junk\.pt: not a readable torch file"):
        import_medusa_accuracy(tmp_path / "junk.pt")
    with pytest.raises(UserError, match="does not exist"):
        import_medusa_accuracy(tmp_path / "missing.pt")


# ---------------------------------------------------------------------------------------------
# the demo model


def test_demo_quality_floor():
    """The bundled demo model and heads, greedy labels on held-out demo prompts: head 1 (the
    first head, 0-based index 0) is right at rank 0 at least 30% of the time, within the top 10
    at least 65%."""
    assert DEMO_MODEL_DIR.joinpath("config.json").is_file() and DEMO_PROMPTS.is_file()
    result = run_calibration(
        ModelSource("demo", device="cpu", dtype="float32"),
        "demo",
        settings=CalibrationSettings(steps=32, topk=10, batch_size=8, max_prompts=24),
        checkpoint=None,
        progress=False,
    )
    t = result.table
    assert t.provenance["prompts"] == 24 and t.positions[0] == 24 * 31
    top1 = t.accuracy[0, 0]
    top10 = t.accuracy[0].sum()
    assert top1 >= 0.30, (top1, top10)
    assert top10 >= 0.65, (top1, top10)
    # later heads are harder
    assert t.accuracy[-1].sum() < top10


def test_walked_rank_vectors_reproduce_the_decoder_exactly():
    """The demo model on 8 held-out prompts: calibrate with S + K greedy steps, then walk the
    rank vectors with steps starting in the first S - 1 rows. The greedy tree decoder run for
    max_new_tokens = S on the same token ids produces exactly that mean tokens per step (A_T(t)
    is a function of the rank vector at the step's start), for every prefix of the proposal."""
    from calibration.data import load_prompts
    from calibration.decoder import TreeDecoder
    from treeopt.acceptance import simulated_tau_curve
    from treeopt.build import joint_tree

    lm = load_model("demo", device="cpu", dtype="float32")
    S, K = 16, lm.heads.num_heads
    prompts = load_prompts(
        DEMO_PROMPTS.with_name("demo_prompts_validation.jsonl"), lm.tokenizer, prompt_tokens=512, max_prompts=8
    )
    result = calibrate(lm, prompts, CalibrationSettings(steps=S + K, topk=10, batch_size=8), progress=False)
    tree = joint_tree(result.table, 24)
    curve = simulated_tau_curve(tree, result.ranks, result.sequence, start_rows=S - 1)
    ids, mask, _ = pad_left([list(p) for p in prompts.token_ids], 0, lm.device)
    for n in (1, 6, 24):
        res = TreeDecoder(lm.model, lm.heads, tree.prefix(n), topk=10, timing=False).generate(
            ids, mask, max_new_tokens=S
        )
        measured = res.accepted[res.accepted > 0]
        assert measured.mean() == pytest.approx(curve[n], rel=1e-12), n
    assert curve[24] > curve[1] > 1.2  # the trees do accept something
