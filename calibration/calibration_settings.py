"""What a calibration counts and how (`CalibrationSettings`), the refusals of settings a model
and its prompts cannot be calibrated with, and the fingerprint of a run's inputs that a
checkpoint or a finished output must share (`calibration.runner`'s module doc)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from calibration.data import PromptSet
from calibration.labels import LABEL_MODES
from treeopt.drafter_cost import EAGLE_KINDS
from treeopt.dtypes import torch_dtype_name
from treeopt.errors import UserError

__all__ = ["CalibrationSettings", "check_settings", "run_fingerprint", "steps_too_few"]


@dataclass(frozen=True)
class CalibrationSettings:
    """What a calibration counts and how (module doc; `treeopt calibrate`'s options of the same
    names). `steps`, `topk`, `labels`, `batch_size`, `seed`, `joint` and `draft_scores_topk` are
    part of the run's fingerprint: a resume must share them."""

    steps: int = 32  # tokens generated per prompt (greedy labels)
    topk: int = 10  # ranks recorded per head: the table's width
    labels: str = "greedy"  # one of calibration.labels.LABEL_MODES
    batch_size: int = 8  # prompts per batch
    max_prompts: int | None = None  # the first prompts only (None: every prompt)
    checkpoint_every: int = 64  # prompts between two checkpoints
    seed: int = 0  # torch's seed, recorded in the provenance
    joint: bool = True  # count the joint rank-vector prefixes too
    chunk_elements: int | None = None  # logits per chunk (calibration.labels.label_ranks)
    # SGLang's pool drafted with this topk at every counted position, kept beside the table
    # (treeopt.draft_scores; None: not recorded); part of the fingerprint when set
    draft_scores_topk: int | None = None

    @property
    def generated_tokens(self) -> int:
        """Tokens generated per prompt: `steps` with greedy labels, none with data labels."""
        return self.steps if self.labels == "greedy" else 0

    @classmethod
    def split(cls, options: dict) -> tuple[CalibrationSettings, dict]:
        """The settings named among keyword `options`, and the options left over."""
        names = {f.name for f in fields(cls)}
        settings = cls(**{k: v for k, v in options.items() if k in names})
        return settings, {k: v for k, v in options.items() if k not in names}


def steps_too_few(steps: int, depth: int, kind: str) -> str:
    """The refusal of greedy labels too few for a drafter of `depth` levels, in its own terms:
    every head (or draft position of a draft model) needs a label one token further on."""
    if kind == "draft-model":
        return (
            f"--steps: a draft model drafting up to {depth} tokens needs at least {depth + 1} generated tokens per "
            f"prompt, so that every draft position has a greedy label, got {steps} (raise --steps, or draft fewer "
            "tokens with --num-heads)"
        )
    return (
        f"--steps: must be at least {depth + 1} (heads + 1) with greedy labels so that every head has a label, "
        f"got {steps}"
    )


def check_settings(settings: CalibrationSettings, loaded, prompts: PromptSet) -> int:
    """UserError for settings this model and these prompts cannot be calibrated with; else
    the number of prompts the run covers."""
    num_heads, vocab = loaded.heads.num_heads, loaded.heads.vocab_size
    if settings.labels not in LABEL_MODES:
        raise UserError(f"--labels: must be one of {', '.join(LABEL_MODES)}, got {settings.labels!r}")
    if settings.labels == "greedy" and settings.steps < num_heads + 1:
        raise UserError(steps_too_few(settings.steps, num_heads, loaded.heads.kind))
    if not 1 <= settings.topk <= vocab:
        raise UserError(f"--topk: must be between 1 and the vocabulary size {vocab}, got {settings.topk}")
    for option, value in (("batch-size", settings.batch_size), ("checkpoint-every", settings.checkpoint_every)):
        if value < 1:
            raise UserError(f"--{option}: must be at least 1, got {value}")
    if settings.max_prompts is not None and settings.max_prompts < 1:
        raise UserError(f"--max-prompts: must be at least 1, got {settings.max_prompts}")
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    longest = max(len(p) for p in prompts.token_ids) + settings.generated_tokens
    if limit and longest > limit:
        raise UserError(f"--prompt-tokens/--steps: sequences of {longest} tokens exceed the model's {limit} positions")
    if settings.draft_scores_topk is not None:
        _check_draft_scores(settings, loaded.heads)
    total = len(prompts) if settings.max_prompts is None else min(settings.max_prompts, len(prompts))
    if settings.labels == "data" and max(len(p) for p in prompts.token_ids[:total]) < num_heads + 2:
        raise UserError(
            f"{prompts.name}: prompts too short for data labels: the last head needs "
            f"texts of at least {num_heads + 2} tokens"
        )
    return total


def _check_draft_scores(settings: CalibrationSettings, heads) -> None:
    """UserError for draft scores this drafter or these labels cannot record."""
    topk = settings.draft_scores_topk
    # why EAGLE only: SGLang's EAGLE worker and TensorRT-LLM's dynamic tree draft with one (docs/engines.md)
    if heads.kind not in EAGLE_KINDS:
        raise UserError(
            f"--draft-scores: engines build a dynamic tree from an EAGLE draft's own scores (--drafter "
            f"{' or '.join(EAGLE_KINDS)}); {heads.kind} drafters are not served that way"
        )
    if settings.labels != "greedy":
        raise UserError("--draft-scores: needs greedy labels (the continuation the engine's verification accepts)")
    if not 1 <= topk <= heads.vocab_size:
        raise UserError(
            f"--draft-scores: topk must be between 1 and the draft vocabulary {heads.vocab_size}, got {topk}"
        )


def run_fingerprint(loaded, prompts: PromptSet, settings: CalibrationSettings, heads_source: str | None) -> dict:
    """The inputs a checkpoint or a finished output must share with the run that uses it."""
    return {
        "model": loaded.name,
        "heads": heads_source,
        "data": prompts.name,
        "data_sha256": prompts.sha256,
        "data_format": prompts.data_format,
        "chat_template": prompts.chat_template,
        "prompt_tokens": prompts.prompt_tokens,
        "steps": settings.steps,
        "topk": settings.topk,
        "labels": settings.labels,
        "batch_size": settings.batch_size,
        "dtype": torch_dtype_name(loaded.dtype),
        "joint": settings.joint,
        "seed": settings.seed,
        # only when set: a run without draft scores keeps the fingerprint it always had
        **({} if settings.draft_scores_topk is None else {"draft_scores_topk": settings.draft_scores_topk}),
    }
