"""What a new user meets calibrating a draft model: a progress bar for the acceptance pass as
for the counting, the acceptance measured on the prompts the table counts, a Ctrl-C in that
pass finished by --resume to the same bytes, and no transformers deprecation warning from the
way the KV cache is passed."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

import calibration.runner as runner
from calibration.data import load_prompts
from calibration.drafters.draft_model import DraftModel, chain_acceptance
from calibration.labels import greedy_continuations
from calibration.model_calls import cache_kwargs, model_forward_hidden
from calibration.models import ModelSource, load_model, tiny_model_for_tests
from calibration.runner import CalibrationSettings, run_calibration
from treeopt.chain import alpha_path, load_chain_acceptance
from treeopt.errors import UserError

PROMPTS = 5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny base model, a tiny draft model of its vocabulary (another seed), and prompts."""
    root = tmp_path_factory.mktemp("draft")
    base = tiny_model_for_tests(root / "base", num_medusa_heads=2)
    draft = tiny_model_for_tests(root / "draft", num_medusa_heads=2, seed=1)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"def f{i}(x): return x + {i} * x"}) + "\n" for i in range(PROMPTS)))
    return base, draft, data


def _calibrate(models, output, **options):
    base, draft, data = models
    source = ModelSource(str(base), str(draft), "draft-model", device="cpu", dtype="float32")
    settings = CalibrationSettings(steps=17, max_prompts=options.pop("max_prompts", None))
    return run_calibration(source, str(data), output=output, settings=settings, threads=1, **options)


def test_the_acceptance_pass_shows_progress_over_the_prompts_counted(models, tmp_path, capsys):
    """--max-prompts 3 of 5: the bar of the acceptance pass ends at 3/3 on stderr, and the
    sidecar is the acceptance of those 3 prompts, computed here directly."""
    _calibrate(models, tmp_path / "acc.json", max_prompts=3, progress=True)
    err = capsys.readouterr().err
    bar = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("draft acceptance")]
    assert bar and "3/3" in bar[-1], err
    lm = load_model(str(models[0]), str(models[1]), device="cpu", dtype="float32", drafter="draft-model")
    ids = load_prompts(str(models[2]), lm.tokenizer, prompt_tokens=128).token_ids[:3]
    expected = chain_acceptance(lm.model, lm.heads, [list(p) for p in ids], pad_id=0)
    got = load_chain_acceptance(alpha_path(tmp_path / "acc.json"))
    assert got.rows == expected.rows
    assert got.alpha_per_depth == pytest.approx(expected.alpha_per_depth, abs=1e-12)


def test_no_bar_when_quiet(models, tmp_path, capsys):
    _calibrate(models, tmp_path / "acc.json", progress=False)
    assert "draft acceptance" not in capsys.readouterr().err


def test_ctrl_c_in_the_acceptance_pass_is_finished_by_resume_to_the_same_bytes(models, tmp_path, monkeypatch, capsys):
    _calibrate(models, tmp_path / "whole" / "acc.json", progress=False)
    expected = alpha_path(tmp_path / "whole" / "acc.json").read_bytes()

    measure = runner.chain_acceptance

    def interrupted(*args, on_batch=None, **kwargs):
        def ctrl_c(done):  # after the first batch of prompts
            raise KeyboardInterrupt

        return measure(*args, on_batch=ctrl_c, **kwargs)

    out = tmp_path / "cut" / "acc.json"
    with monkeypatch.context() as m:
        m.setattr(runner, "chain_acceptance", interrupted)
        with pytest.raises(KeyboardInterrupt):
            _calibrate(models, out, progress=False)
    err = capsys.readouterr().err
    assert out.is_file() and not alpha_path(out).exists()
    assert f"{out} is complete" in err and "--resume" in err
    result = _calibrate(models, out, resume=True, progress=False)
    assert result.already_complete  # the counts were not run again
    assert alpha_path(out).read_bytes() == expected


def _forward_warnings(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if "past_key_values" in str(w.message) or "cache" in str(w.message)]


def test_cached_forwards_pass_the_cache_as_transformers_names_it(models):
    """No deprecation warning from greedy continuations (calibration's labels), the decoder's
    cached forward or a draft model's calibration, on the transformers installed."""
    lm = load_model(str(models[0]), device="cpu", dtype="float32")
    ids = torch.tensor([[3, 4, 5, 6]])
    assert _forward_warnings(lambda: greedy_continuations(lm.model, [[3, 4, 5], [6, 7]], 4)) == []
    cache = DynamicCache()
    mask = torch.ones_like(ids)
    positions = torch.arange(4)[None]
    forward = lambda: model_forward_hidden(lm.model, ids, attention_mask=mask, position_ids=positions, cache=cache)  # noqa: E731
    assert _forward_warnings(forward) == []
    assert cache.get_seq_length() == 4  # the cache was used, not dropped


def test_cache_keyword_follows_the_forward_signature():
    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=False):
            return past_key_values

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=False):
            return cache

    sentinel = object()
    assert cache_kwargs(Old(), sentinel) == {"past_key_values": sentinel}
    assert cache_kwargs(New(), sentinel) == {"cache": sentinel}
    assert New()(None, **cache_kwargs(New(), sentinel)) is sentinel


def test_draft_model_directory_errors_name_the_file(tmp_path):
    """A draft model's truncated weights: the file named, before transformers reads it."""
    draft = tiny_model_for_tests(tmp_path / "d", num_medusa_heads=1)
    weights = draft / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(UserError) as err:
        DraftModel.from_pretrained(draft)
    assert str(err.value).startswith(f"{weights}: cannot read (")


class _RunsCode:
    """Unpickling it calls os.mkdir("pwned") in the working folder."""

    def __reduce__(self):
        return (os.mkdir, ("pwned",))


def test_pickled_draft_model_is_one_line_in_a_real_process(models, tmp_path):
    """A draft model whose only weights are a plain pickle that runs code: torch's
    weights-only loader would warn about the pickle protocol on stderr before refusing it;
    the user sees one line, exit status 2, the code not run and nothing written."""
    draft = tmp_path / "d"
    shutil.copytree(models[1], draft, ignore=shutil.ignore_patterns("heads"))
    (draft / "model.safetensors").unlink()
    (draft / "pytorch_model.bin").write_bytes(pickle.dumps({"lm_head.weight": _RunsCode()}, protocol=4))
    args = ["calibrate", "--model", str(models[0]), "--heads", "d", "--drafter", "draft-model"]
    args += ["--data", str(models[2]), "--device", "cpu", "-o", "a.json"]
    done = subprocess.run(
        [sys.executable, "-m", "treeopt", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"treeopt: error: {Path('d') / 'pytorch_model.bin'}: cannot load the draft model "
        "(not a PyTorch checkpoint of tensors (a weights-only load refused it))"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_pickled_base_model_is_one_line_in_a_real_process(models, tmp_path):
    """The same plain pickle as the base model's only weights: one line, exit 2, the code not
    run and nothing written (torch's protocol warning would add two lines)."""
    base = tmp_path / "m"
    shutil.copytree(models[0], base)  # with its heads, so that the base model's loader is reached
    (base / "model.safetensors").unlink()
    (base / "pytorch_model.bin").write_bytes(pickle.dumps({"lm_head.weight": _RunsCode()}, protocol=4))
    args = ["calibrate", "--model", "m", "--data", str(models[2]), "--device", "cpu", "-o", "a.json"]
    done = subprocess.run(
        [sys.executable, "-m", "treeopt", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("treeopt: error: --model: cannot load m: not a PyTorch checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_run_on_a_truncated_base_model_is_one_line(models, tmp_path):
    """`treeopt run` reaches the same loader as `calibrate`: one line naming the model, exit 2,
    and no run folder left behind (nothing was written)."""
    base = tmp_path / "m"
    shutil.copytree(models[0], base)
    weights = base / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    args = ["run", "--model", "m", "--data", str(models[2]), "--validation-data", str(models[2])]
    args += ["--device", "cpu", "-o", "r"]
    done = subprocess.run(
        [sys.executable, "-m", "treeopt", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith("treeopt: error: ") and "m" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
