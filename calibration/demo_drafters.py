"""The demo's dependent drafters: a Hydra head set, an MLP speculator and an EAGLE-3 draft
(`calibration.demo_eagle`) trained on the bundled demo model, so that `treeopt run --drafter
hydra|mlp-speculator|eagle3` runs end to end with no downloads (docs/decoder.md#drafters).

The recipe (`treeopt demo train-drafters`): the frozen demo model reads windows of the
stdlib's train files (the split of `calibration.demo`, encoded with the demo's own tokenizer);
each drafter is trained teacher-forced on the data: depth d sees the true tokens up to d - 1
and predicts the next (Hydra paper section 3; Wertheimer et al. 2024 section 3), with loss
weight decay^d. Hydra heads start as the authors' recipe says (projections from the base
lm_head, path embeddings from the base embeddings, frozen); the speculator's stages share
their embedding, head, norm and the projections of stages >= 2 (``tie_weights``, the layout
of IBM's published speculators), which keeps the whole demo checkpoint small.

Checkpoints go to the work folder every 50 steps, tied to the recipe: an interrupted run
continues from there with the same recipe only. The drafters are written in bf16 safetensors
under OUT/hydra and OUT/mlp_speculator.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM
from transformers.utils import logging as hf_logging

from calibration.demo import (
    _batch,
    _lr,
    after_drafter_step,
    is_held_out,
    load_training_checkpoint,
    read_source,
    stdlib_files,
)
from calibration.demo_eagle import train_eagle3
from calibration.demo_files import DEMO_MODEL_DIR
from calibration.drafters.hydra import HydraHeads
from calibration.drafters.mlp_speculator import MLPSpeculator
from treeopt.errors import UserError, first_line
from treeopt.fileio import atomic_path, read_json_input, write_json

HYDRA_DIR = "hydra"
SPECULATOR_DIR = "mlp_speculator"


@dataclass(frozen=True)
class DrafterRecipe:
    hydra_heads: int = 4
    hydra_layers: int = 1
    speculator_stages: int = 4
    steps: int = 240
    lr: float = 2e-3
    loss_decay: float = 0.8
    warmup_steps: int = 20
    batch_size: int = 8
    seq_len: int = 160
    seed: int = 0
    # the EAGLE-3 draft (calibration.demo_eagle): depths trained, draft vocabulary, windows
    eagle3_depths: int = 3
    eagle3_draft_vocab: int = 1024
    eagle3_batch_size: int = 2
    eagle3_seq_len: int = 64


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _train_tokens(tokenizer_file: Path, work_dir: Path, resume: bool) -> np.ndarray:
    """The stdlib train split encoded with the demo's tokenizer (kept in the work folder)."""
    cache = work_dir / "drafter_tokens.npy"
    if cache.exists() and resume:
        try:
            return np.load(cache, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise UserError(f"{cache}: not a tokenised corpus ({first_line(err)}); delete it or pass --fresh") from None
    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("<|endoftext|>")
    root, files = stdlib_files()
    ids: list[int] = []
    for enc in tok.encode_batch([read_source(root / f) for f in files if not is_held_out(f)]):
        ids.extend(enc.ids)
        ids.append(eos)
    tokens = np.asarray(ids, dtype=np.int32)
    with atomic_path(cache) as tmp, open(tmp, "wb") as fh:
        np.save(fh, tokens)
    return tokens


def _tie_speculator(spec: MLPSpeculator) -> None:
    """Share emb.0, head.0, ln.0 across stages and proj.1 across stages >= 2 (``tie_weights``)."""
    for i in range(1, spec.n_predict):
        spec.emb[i], spec.head[i], spec.ln[i] = spec.emb[0], spec.head[0], spec.ln[0]
        if i >= 2:
            spec.proj[i] = spec.proj[1]


def _train(
    name: str,
    drafter,
    params,
    model,
    tokens: np.ndarray,
    recipe: DrafterRecipe,
    ckpt: Path,
    resume: bool,
    seed_offset: int,
) -> list[dict]:
    """Teacher-forced training of `drafter` (the drafter interface's `teacher_forced_logits`)
    on windows of `tokens`; depth d at position t reads the path x_{t+1..t+d+1} and predicts
    x_{t+d+2}."""
    depths = drafter.num_heads
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, log = 0, []
    if ckpt.exists() and resume:
        state = load_training_checkpoint(ckpt, recipe)
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["opt"])
        step, log = state["step"], state["log"]
        _log(f"{name}: resumed at step {step}")
    weights = torch.tensor([recipe.loss_decay**d for d in range(depths)])
    drafter.train()
    t0 = time.time()
    while step < recipe.steps:
        for g in opt.param_groups:
            g["lr"] = _lr(step, recipe.steps, recipe.lr, recipe.warmup_steps)
        x = _batch(tokens, recipe.seed + seed_offset, step, recipe.batch_size, recipe.seq_len)
        positions = x.shape[1] - depths - 1
        with torch.no_grad():
            hidden = model.model(x).last_hidden_state[:, :positions]
        # path[:, d] = x_{t+1+d}; targets[:, d] = x_{t+2+d}, for every position t at once
        windows = x.unfold(1, depths + 1, 1)[:, 1 : positions + 1]  # (B, P, D + 1)
        path, targets = windows[..., :depths], windows[..., 1:]
        logits = drafter.teacher_forced_logits(hidden.reshape(-1, hidden.shape[-1]), path.reshape(-1, depths))
        losses = torch.stack([F.cross_entropy(logits[:, d], targets.reshape(-1, depths)[:, d]) for d in range(depths)])
        loss = (weights * losses).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        after_drafter_step(name, step, losses, t0, log, recipe, ckpt, drafter, opt, say=_log)
    drafter.eval()
    return log


def _train_hydra(model, tokens: np.ndarray, recipe: DrafterRecipe, out_dir: Path, work_dir: Path, resume: bool):
    """Hydra heads started as the authors' recipe says, trained, written to out_dir/hydra."""
    lm_head, embeddings = model.lm_head.weight.detach(), model.model.embed_tokens.weight.detach()
    hydra = HydraHeads(
        model.config.hidden_size, model.config.vocab_size, recipe.hydra_heads, recipe.hydra_layers, grounded=True
    )
    hydra.init_from_base(lm_head, embeddings)
    hydra.input_embed_fn.requires_grad_(False)  # the base model's embeddings (authors' recipe)
    params = [p for p in hydra.parameters() if p.requires_grad]
    summary = {
        "log": _train("hydra", hydra, params, model, tokens, recipe, work_dir / "hydra.pt", resume, 2),
        "parameters": sum(p.numel() for p in hydra.parameters()),
    }
    # its input embeddings are the base model's, frozen: the loader takes them from there
    hydra.save_pretrained(
        out_dir / HYDRA_DIR, base_model_name_or_path="demo", dtype=torch.bfloat16, input_embeddings=False
    )
    return summary


def _train_speculator(model, tokens: np.ndarray, recipe: DrafterRecipe, out_dir: Path, work_dir: Path, resume: bool):
    """An MLP speculator with tied stages, trained, written to out_dir/mlp_speculator."""
    h, vocab = model.config.hidden_size, model.config.vocab_size
    stages = recipe.speculator_stages
    spec = MLPSpeculator(
        h,
        h,
        vocab,
        stages,
        scale_input=False,
        top_k_tokens_per_head=[4, 3, 2, 2][:stages] + [1] * max(0, stages - 4),
        n_candidates=8,
    )
    with torch.no_grad():
        spec.head[0].weight.copy_(model.lm_head.weight.detach())
        spec.emb[0].weight.copy_(model.model.embed_tokens.weight.detach())
    _tie_speculator(spec)
    params = list(spec.parameters())
    summary = {
        "log": _train("mlp-speculator", spec, params, model, tokens, recipe, work_dir / "speculator.pt", resume, 3),
        "parameters": sum(p.numel() for p in spec.parameters()),
    }
    spec.save_pretrained(out_dir / SPECULATOR_DIR, tie_weights=True)
    return summary


def train_drafters(
    out_dir=DEMO_MODEL_DIR,
    recipe: DrafterRecipe = DrafterRecipe(),
    *,
    model_dir=None,
    work_dir=None,
    resume: bool = True,
    which=("hydra", "mlp-speculator", "eagle3"),
) -> dict:
    """Train the demo's Hydra heads and MLP speculator on the demo model in `model_dir`
    (default: `out_dir`) and write them to out_dir/hydra and out_dir/mlp_speculator.
    Nothing is written outside `out_dir` and `work_dir` (default out_dir/.work)."""
    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    model_dir = Path(model_dir) if model_dir is not None else out_dir
    if not (model_dir / "config.json").is_file():
        raise UserError(f"{model_dir}: no demo model there (train it with `treeopt demo train`)")
    work_dir = Path(work_dir) if work_dir is not None else out_dir / ".work"
    work_dir.mkdir(parents=True, exist_ok=True)
    stamp = work_dir / "drafter_recipe.json"
    if resume and stamp.exists() and read_json_input(stamp, "a drafter recipe stamp") != asdict(recipe):
        raise UserError(f"{work_dir}: holds drafters of another recipe or seed; pass --fresh or another --work-dir")
    write_json(stamp, asdict(recipe))
    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    model.requires_grad_(False)
    tokens = _train_tokens(model_dir / "tokenizer.json", work_dir, resume)
    _log(f"drafters: {len(tokens):,} train tokens")
    summary: dict = {"recipe": asdict(recipe)}
    t_start = time.time()
    if "hydra" in which:
        summary["hydra"] = _train_hydra(model, tokens, recipe, out_dir, work_dir, resume)
    if "mlp-speculator" in which:
        summary["mlp_speculator"] = _train_speculator(model, tokens, recipe, out_dir, work_dir, resume)
    if "eagle3" in which:
        summary["eagle3"] = train_eagle3(model, tokens, recipe, out_dir, work_dir, resume, _log)
    summary["train_seconds"] = round(time.time() - t_start)
    previous = out_dir / "drafters_training.json"
    if previous.is_file() and set(which) != {"hydra", "mlp-speculator", "eagle3"}:
        # a drafter trained alone keeps the others' logs beside its own
        kept = read_json_input(previous, "a drafters training summary")
        if isinstance(kept, dict):
            for kind in which:  # its seconds beside its log; the others' total stays theirs
                summary[kind.replace("-", "_")]["train_seconds"] = summary["train_seconds"]
            summary = {**kept, **summary, "train_seconds": kept.get("train_seconds", summary["train_seconds"])}
    write_json(previous, summary)
    _log(f"done: drafters in {out_dir}")
    return summary


__all__ = ["DrafterRecipe", "train_drafters", "HYDRA_DIR", "SPECULATOR_DIR"]
