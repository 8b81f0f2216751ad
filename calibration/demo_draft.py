"""A draft model for the demo (docs/decoder.md#draft-models): a 1-layer Llama of hidden 128
with the demo's tokenizer, trained by the demo's recipe (`calibration.demo`: the same corpus,
held-out split, batches and learning-rate schedule) on the target's own next-token
distribution (distillation: Leviathan et al. 2023 use off-the-shelf small models; a draft
trained on the target's outputs agrees with it more often at the same size). Checkpoints
every 50 steps in `work_dir`; an interrupted run resumes there with the same recipe only.
The result goes to `DEMO_MODEL_DIR/draft` in bf16 safetensors.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from calibration.demo import (
    _batch,
    _lr,
    is_held_out,
    load_training_checkpoint,
    read_source,
    save_training_checkpoint,
    stdlib_files,
)
from calibration.demo_files import DEMO_MODEL_DIR
from treeopt.fileio import write_json


@dataclass(frozen=True)
class DraftRecipe:
    hidden_size: int = 128
    intermediate_size: int = 352
    num_layers: int = 1
    num_attention_heads: int = 2
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 300
    lr: float = 3e-3
    warmup_steps: int = 30
    seed: int = 0


def _log(msg: str) -> None:
    print(f"[demo draft] {msg}", file=sys.stderr, flush=True)


def _train_tokens(tok: Tokenizer, eos_id: int, max_files: int | None) -> np.ndarray:
    """The stdlib's train files (the first `max_files`) tokenised, each ended by EOS."""
    root, files = stdlib_files()
    train_files = [f for f in files if not is_held_out(f)][:max_files]
    ids = []
    for enc in tok.encode_batch([read_source(root / f) for f in train_files]):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return np.asarray(ids, dtype=np.int32)


def _draft_config(recipe: DraftRecipe, vocab_size: int, eos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_attention_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def train_demo_draft(
    target_dir=DEMO_MODEL_DIR,
    recipe: DraftRecipe = DraftRecipe(),
    *,
    out_dir=None,
    work_dir=None,
    resume: bool = True,
    max_files: int | None = None,
) -> dict:
    """Train the draft for the model in `target_dir` into `out_dir` (default target_dir/draft)."""
    hf_logging.disable_progress_bar()
    target_dir = Path(target_dir)
    out_dir = Path(out_dir) if out_dir is not None else target_dir / "draft"
    work_dir = Path(work_dir) if work_dir is not None else target_dir / ".work-draft"
    work_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    target.requires_grad_(False)
    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    eos_id = int(target.config.eos_token_id)
    tokens = _train_tokens(tok, eos_id, max_files)
    model = LlamaForCausalLM(_draft_config(recipe, target.config.vocab_size, eos_id))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt, step, log = work_dir / "draft.pt", 0, []
    if ckpt.exists() and resume:
        state = load_training_checkpoint(ckpt, recipe)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, log = state["step"], state["log"]
    model.train()
    t0 = time.time()
    while step < recipe.steps:
        for g in opt.param_groups:
            g["lr"] = _lr(step, recipe.steps, recipe.lr, recipe.warmup_steps)
        x = _batch(tokens, recipe.seed, step, recipe.batch_size, recipe.seq_len)[:, :-1]
        with torch.no_grad():
            teacher = torch.log_softmax(target(x).logits, -1)
        student = torch.log_softmax(model(x).logits, -1)
        # why: matching the target's whole next-token distribution raises sum min(p, q), the
        # acceptance (docs/statistics.md#draft-model-acceptance)
        loss = torch.nn.functional.kl_div(
            student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean"
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0 or step == recipe.steps:
            log.append({"step": step, "kl": round(loss.item(), 4)})
            _log(f"{step}/{recipe.steps} kl={loss.item():.4f} ({time.time() - t0:.0f} s)")
        if step % 50 == 0 or step == recipe.steps:
            save_training_checkpoint(ckpt, recipe, model=model.state_dict(), opt=opt.state_dict(), step=step, log=log)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(out_dir))
    info = {"recipe": asdict(recipe), "log": log, "target": str(target_dir), "params": model.num_parameters()}
    write_json(out_dir / "training.json", info)
    return info
