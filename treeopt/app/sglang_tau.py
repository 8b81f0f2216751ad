"""`treeopt sglang-tau`: the tokens per step SGLang's dynamic EAGLE tree gives for (steps, topk,
num_draft_tokens) triples, predicted from the draft's own scores on calibration prompts
(docs/statistics.md#dynamic-trees), and optionally measured by the reference decoder drafting
SGLang's way on held-out prompts (docs/decoder.md#sglangs-dynamic-tree)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calibration.batching import label_rows, pad_left
from calibration.data import load_prompts
from calibration.labels import greedy_continuations, pad_token_id
from calibration.models import ModelSource
from calibration.sglang_decoder import SGLangTreeDecoder
from calibration.sglang_drafting import check_triple, pool_records
from treeopt.draft_scores import draft_scores_tau, load_draft_scores
from treeopt.dynamic_tree import dynamic_tau, forced_draft_tokens
from treeopt.engines import sglang_pool_size
from treeopt.errors import UserError

__all__ = ["SGLangTauRow", "TauSettings", "sglang_tau"]

#: prompts run through the model at once
CHUNK = 16


@dataclass(frozen=True)
class TauSettings:
    steps: int
    topk: int
    draft_tokens: tuple[int, ...]  # num_draft_tokens, root included
    max_prompts: int = 32
    prompt_tokens: int = 128
    new_tokens: int = 32  # generated per prompt (calibration and measurement alike)


@dataclass(frozen=True)
class SGLangTauRow:
    steps: int
    topk: int
    num_draft_tokens: int
    tau_predicted: float
    tau_predicted_se: float
    steps_walked: int
    tau_measured: float = float("nan")  # NaN without held-out prompts
    tau_measured_se: float = float("nan")


def check_settings(s: TauSettings) -> tuple[int, ...]:
    """One line for a triple SGLang cannot draft, before anything loads; the draft token counts
    SGLang uses (forced to steps + 1 for topk 1)."""
    for name, value in (("--steps", s.steps), ("--topk", s.topk), ("--max-prompts", s.max_prompts)):
        if value < 1:
            raise UserError(f"{name}: must be at least 1, got {value}")
    if s.new_tokens < 2:
        raise UserError(f"--new-tokens: must be at least 2, got {s.new_tokens}")
    pool = sglang_pool_size(s.steps, s.topk)
    counts = tuple(dict.fromkeys(forced_draft_tokens(s.steps, s.topk, n) for n in s.draft_tokens))
    for n in counts:
        if not 2 <= n <= pool + 1:
            raise UserError(f"--draft-tokens: {n} is outside 2..{pool + 1} for {s.steps} steps of topk {s.topk}")
    return counts


def _prompts(lm, data, s: TauSettings) -> list[list[int]]:
    ids = load_prompts(data, lm.tokenizer, prompt_tokens=s.prompt_tokens, max_prompts=s.max_prompts).token_ids
    return [list(p) for p in ids]


def _predicted(lm, prompts, s: TauSettings):
    """(scores, on_path, sequence ids) over every calibration prompt, chunk by chunk."""
    pad = pad_token_id(lm.model, lm.tokenizer)
    parts = []
    for lo in range(0, len(prompts), CHUNK):
        chunk = prompts[lo : lo + CHUNK]
        # why + steps: the last steps' acceptance still sees labels (docs/statistics.md#walked-tau)
        continuation = greedy_continuations(lm.model, chunk, s.new_tokens + s.steps, pad_id=pad)
        sequences = [p + c for p, c in zip(chunk, continuation, strict=True)]
        starts = [len(p) - 1 for p in chunk]
        scores, on_path = pool_records(lm.model, lm.heads, sequences, starts, steps=s.steps, topk=s.topk, pad_id=pad)
        seq, _, _ = label_rows([len(x) for x in sequences], starts, s.steps)
        parts.append((scores, on_path, seq + lo))
    return (np.concatenate([p[i] for p in parts]) for i in range(3))


def _measured(lm, prompts, s: TauSettings, n: int) -> tuple[float, float]:
    """The decoder's tokens per step over the held-out prompts and its standard error over
    sequences."""
    decoder = SGLangTreeDecoder(lm.model, lm.heads, s.steps, s.topk, n)
    pad = pad_token_id(lm.model, lm.tokenizer)
    per_sequence, tokens, steps = [], 0, 0
    for lo in range(0, len(prompts), CHUNK):
        ids, mask, _ = pad_left(prompts[lo : lo + CHUNK], pad, decoder.device)
        accepted = decoder.generate(ids, mask, max_new_tokens=s.new_tokens).accepted
        for row in accepted.T:
            per_sequence.append(row[row > 0].mean())
        tokens, steps = tokens + int(accepted.sum()), steps + int((accepted > 0).sum())
    se = float(np.std(per_sequence, ddof=1) / np.sqrt(len(per_sequence))) if len(per_sequence) > 1 else float("nan")
    return tokens / steps, se


def _recorded(path, settings: TauSettings, counts) -> list[tuple[float, float, int]]:
    """(tau, se, steps walked) per draft token count from `treeopt calibrate --draft-scores`'s
    sidecar; UserError naming the file when it cannot answer the triple."""
    recorded = load_draft_scores(path)
    return [draft_scores_tau(recorded, settings.steps, settings.topk, n, name=str(path)) for n in counts]


@torch.inference_mode()
def sglang_tau(source: ModelSource, data, settings: TauSettings, *, held_out=None, scores=None) -> list[SGLangTauRow]:
    """Rows of predicted (and, given `held_out` prompt data, measured) tokens per step, one per
    num_draft_tokens. `scores`: a draft-score sidecar of `treeopt calibrate --draft-scores`
    (`treeopt.draft_scores`) predicts in place of drafting on `data` (the model then loads only
    to measure on `held_out`)."""
    counts = check_settings(settings)
    predicted = _recorded(scores, settings, counts) if scores is not None else None
    if predicted is not None and held_out is None:
        return [SGLangTauRow(settings.steps, settings.topk, n, *p) for n, p in zip(counts, predicted, strict=True)]
    lm = source.load()
    check_triple(lm.heads, settings.steps, settings.topk)
    validation = _prompts(lm, held_out, settings) if held_out is not None else None
    if predicted is None:
        records = tuple(_predicted(lm, _prompts(lm, data, settings), settings))
        # why start_rows: the walk stops where the decoder's generation stops (docs/statistics.md#walked-tau)
        predicted = [
            dynamic_tau(*records, settings.steps, settings.topk, n, start_rows=settings.new_tokens - 1) for n in counts
        ]
    rows = []
    for n, (tau, se, walked) in zip(counts, predicted, strict=True):
        measured = _measured(lm, validation, settings, n) if validation is not None else (float("nan"),) * 2
        rows.append(SGLangTauRow(settings.steps, settings.topk, n, tau, se, walked, *measured))
    return rows
