"""The demo model: a small Llama with Medusa heads, trained from nothing on the Python
standard library of the running interpreter, so that treeopt runs end to end on a CPU-only
machine with no downloads.

The recipe (`treeopt demo train`): split the stdlib's .py files into train and held-out by a
fixed hash of their relative path; train a byte-level BPE tokenizer on the train files; train
a ~5M-parameter LlamaForCausalLM; freeze it and train Medusa-1 heads on top (loss weight 0.8^k
for head k, ResBlocks zero-initialised, projections initialised from lm_head). The result is
committed in 16-bit safetensors under calibration/demo_model, together with held-out prompts
for calibration and validation, so the main job never trains.

Where training writes (`train_demo`): only under its output folder OUT and its work folder
(default OUT/.work). The model and tokenizer go to OUT, the heads to OUT/heads, the prompts to
OUT/data; nothing is written inside the installed package (`treeopt.fileio.refuse_unsafe_output`:
copy OUT over calibration/demo_model by hand to replace the bundled model and the prompts
``--data demo`` reads). The work folder keeps the
tokenizer, the tokenised corpus and the checkpoints, tied to the recipe by ``recipe.json``: a
resume with another recipe or seed is refused, never mixed (docs/formats.md#output-safety).
"""

from __future__ import annotations

import json
import math
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from calibration.demo_files import DEMO_PROMPTS, DEMO_VALIDATION_PROMPTS
from calibration.heads import MedusaHeads
from treeopt.errors import UserError, first_line
from treeopt.fileio import atomic_path, read_json_input, write_json, write_text
from treeopt.resume import differing_settings

EOS = "<|endoftext|>"
HELD_OUT_EVERY = 10  # a file is held out when crc32(relative path) % 10 == 0


@dataclass(frozen=True)
class DemoRecipe:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 704
    num_layers: int = 5
    num_attention_heads: int = 4
    seq_len: int = 256
    batch_size: int = 16
    base_steps: int = 900
    base_lr: float = 3e-3
    num_medusa_heads: int = 4
    medusa_layers: int = 1
    head_steps: int = 400
    head_lr: float = 1e-3
    head_loss_decay: float = 0.8
    warmup_steps: int = 50
    seed: int = 0


def stdlib_files() -> tuple[Path, list[str]]:
    """The interpreter's stdlib .py files (no site-packages), as sorted relative paths."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    return root, files


def is_held_out(relpath: str) -> bool:
    return zlib.crc32(relpath.encode()) % HELD_OUT_EVERY == 0


def read_source(path: Path) -> str:
    # A few stdlib files are not valid UTF-8 (test data for codecs): replace, don't skip.
    return path.read_bytes().decode("utf-8", errors="replace")


def train_tokenizer(texts, vocab_size: int):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def held_out_prompts(root: Path, files: list[str], *, chars: int = 360, per_file: int = 2) -> list[str]:
    """Deterministic prompts from held-out files: `per_file` blocks of whole lines of about
    `chars` characters, evenly spaced through each file."""
    prompts = []
    for rel in files:
        if not is_held_out(rel):
            continue
        lines = read_source(root / rel).splitlines(keepends=True)
        blocks, block = [], ""
        for line in lines:
            block += line
            if len(block) >= chars:
                blocks.append(block)
                block = ""
        blocks = [b for b in blocks if len(b.strip()) > chars // 3]
        if not blocks:
            continue
        picks = np.linspace(0, len(blocks) - 1, num=min(per_file, len(blocks))).round().astype(int)
        prompts.extend(blocks[i] for i in sorted(set(picks.tolist())))
    return prompts


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batch(tokens: np.ndarray, seed: int, step: int, batch: int, seq: int) -> torch.Tensor:
    # The batch depends only on (seed, step), so a resumed run sees the same data.
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    return torch.from_numpy(np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64))


def load_training_checkpoint(path: Path, recipe) -> dict:
    """A training checkpoint of this recipe (any of the demo recipes, a dataclass). Loaded with
    weights_only: a checkpoint holds tensors and plain containers, and a crafted pickle must
    not run code."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch.load raises many types for a damaged file
        raise UserError(
            f"{path}: not a demo training checkpoint ({first_line(err)}); delete it or pass --fresh"
        ) from None
    if not isinstance(state, dict) or state.get("recipe") != asdict(recipe):
        raise UserError(f"{path}: written by another recipe or seed; delete it or pass --fresh")
    return state


#: what a run keeps in its work folder, reused by a resume of the same recipe
_WORK_FILES = ("tokenizer.json", "tokens.npz", "base.pt", "heads.pt")


def _check_work_dir(work_dir: Path, recipe: DemoRecipe, resume: bool) -> None:
    """Tie the work folder to `recipe`: its tokenizer and tokenised corpus are reused only by
    the same recipe (UserError otherwise, before any training); a fresh run claims it."""
    stamp = work_dir / "recipe.json"
    if resume and stamp.exists():
        theirs = read_json_input(stamp, "a demo recipe stamp")
        if theirs != asdict(recipe):
            differ = ", ".join(differing_settings(theirs, asdict(recipe))[:3]) or "format"
            raise UserError(
                f"{work_dir}: holds the work of another recipe or seed ({differ} differ); pass --fresh or another "
                "--work-dir"
            )
    elif resume and any((work_dir / name).exists() for name in _WORK_FILES):
        raise UserError(
            f"{work_dir}: holds the work of an unknown recipe (no recipe.json); pass --fresh or another --work-dir"
        )
    write_json(stamp, asdict(recipe))


def _prompt_files(out_dir: Path) -> tuple[Path, Path]:
    """Where the calibration and validation prompts go (module doc)."""
    return out_dir / "data" / DEMO_PROMPTS.name, out_dir / "data" / DEMO_VALIDATION_PROMPTS.name


def save_training_checkpoint(path: Path, recipe, **state) -> None:
    """Write a training checkpoint atomically, tied to `recipe` (`load_training_checkpoint`)."""
    with atomic_path(path) as tmp:
        torch.save({**state, "recipe": asdict(recipe)}, tmp)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def after_drafter_step(name: str, step: int, losses, t0: float, log: list, recipe, ckpt: Path, drafter, opt, say=_log):
    """A drafter's training step done: every 20 steps (and the last) its per-depth losses into
    `log` and said; every 50 (and the last) a checkpoint a resumed run continues from."""
    if step % 20 == 0 or step == recipe.steps:
        entry = {"step": step, "losses": [round(v, 4) for v in losses.tolist()], "seconds": round(time.time() - t0, 1)}
        log.append(entry)
        say(f"{name} {step}/{recipe.steps} losses={entry['losses']}")
    if step % 50 == 0 or step == recipe.steps:
        save_training_checkpoint(ckpt, recipe, drafter=drafter.state_dict(), opt=opt.state_dict(), step=step, log=log)


def train_demo(out_dir, recipe: DemoRecipe = DemoRecipe(), *, work_dir=None, resume: bool = True) -> dict:
    """Train the demo model into `out_dir` (base model + tokenizer, heads in out_dir/heads,
    prompts as the module doc says). Checkpoints go to `work_dir` (default out_dir/.work)
    every 50 steps; an interrupted run continues from there (`resume`), with the same recipe
    only. Nothing is written outside `out_dir` and `work_dir`."""
    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    work_dir = Path(work_dir) if work_dir is not None else out_dir / ".work"
    work_dir.mkdir(parents=True, exist_ok=True)
    _check_work_dir(work_dir, recipe, resume)
    torch.manual_seed(recipe.seed)
    t_start = time.time()

    root, files = stdlib_files()
    train_files = [f for f in files if not is_held_out(f)]
    held_files = [f for f in files if is_held_out(f)]
    _log(f"corpus: {len(files)} files under {root}: {len(train_files)} train, {len(held_files)} held out")
    tok = _tokenizer(work_dir, root, train_files, recipe.vocab_size, resume)
    eos_id = tok.token_to_id(EOS)
    train_tokens, held_tokens = _corpus(work_dir, tok, root, (train_files, held_files), resume)
    _log(f"tokens: {len(train_tokens):,} train, {len(held_tokens):,} held out")

    model = LlamaForCausalLM(_base_config(recipe, eos_id))
    model.config._attn_implementation = "sdpa"
    heads = MedusaHeads(recipe.hidden_size, recipe.vocab_size, recipe.num_medusa_heads, recipe.medusa_layers)
    log = _train_base(model, train_tokens, held_tokens, recipe, work_dir / "base.pt", resume)
    log = _train_heads(model, heads, train_tokens, recipe, work_dir / "heads.pt", resume, log)

    # Save everything in 16-bit.
    out_dir.mkdir(parents=True, exist_ok=True)
    final_loss = _held_out_loss(model, held_tokens, recipe)
    model.to(torch.bfloat16).save_pretrained(str(out_dir))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=None)
    fast.save_pretrained(str(out_dir))
    heads.save_pretrained(out_dir / "heads", base_model_name_or_path="demo", dtype=torch.bfloat16)
    _write_prompts(out_dir, held_out_prompts(root, files))
    summary = {
        "recipe": asdict(recipe),
        "python": sys.version.split()[0],
        "corpus": {
            "files": len(files),
            "train_files": len(train_files),
            "held_out_files": len(held_files),
            "train_tokens": int(len(train_tokens)),
            "held_out_tokens": int(len(held_tokens)),
        },
        "held_out_loss": round(final_loss, 4),
        "parameters": {
            "base": sum(p.numel() for p in model.parameters()),
            "heads": sum(p.numel() for p in heads.parameters()),
        },
        "train_seconds": round(time.time() - t_start),
        "log": log,
    }
    write_json(out_dir / "training.json", summary)
    _log(f"done: held-out loss {final_loss:.3f}, saved to {out_dir}")
    return summary


def _tokenizer(work_dir: Path, root: Path, train_files: list[str], vocab_size: int, resume: bool) -> Tokenizer:
    """The BPE tokenizer trained on the train files (kept in the work folder)."""
    tok_file = work_dir / "tokenizer.json"
    if tok_file.exists() and resume:
        return Tokenizer.from_file(str(tok_file))
    tok = train_tokenizer((read_source(root / f) for f in train_files), vocab_size)
    with atomic_path(tok_file) as tmp:
        tok.save(str(tmp))
    return tok


def _corpus(work_dir: Path, tok: Tokenizer, root: Path, splits, resume: bool) -> tuple[np.ndarray, np.ndarray]:
    """The train and held-out files of `splits` tokenised, each file ended by EOS (kept in the
    work folder)."""
    tokens_file = work_dir / "tokens.npz"
    if tokens_file.exists() and resume:
        try:
            with np.load(tokens_file, allow_pickle=False) as data:
                return data["train"], data["held"]
        except (OSError, ValueError, KeyError, EOFError) as err:
            raise UserError(
                f"{tokens_file}: not a tokenised corpus ({first_line(err)}); delete it or pass --fresh"
            ) from None
    eos_id = tok.token_to_id(EOS)

    def encode(file_list):
        ids = []
        for enc in tok.encode_batch([read_source(root / f) for f in file_list]):
            ids.extend(enc.ids)
            ids.append(eos_id)
        return np.asarray(ids, dtype=np.int32)

    train_files, held_files = splits
    train_tokens, held_tokens = encode(train_files), encode(held_files)
    with atomic_path(tokens_file) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, train=train_tokens, held=held_tokens)
    return train_tokens, held_tokens


def _base_config(recipe: DemoRecipe, eos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=recipe.vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_attention_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def _held_out_loss(model, held_tokens: np.ndarray, recipe: DemoRecipe, n_batches: int = 8) -> float:
    model.eval()
    losses = []
    with torch.no_grad():
        for i in range(n_batches):
            x = _batch(held_tokens, 10_000 + recipe.seed, i, recipe.batch_size, recipe.seq_len)
            losses.append(model(x[:, :-1], labels=x[:, :-1]).loss.item())
    model.train()
    return float(np.mean(losses))


def _set_lr(opt, step: int, total: int, peak: float, warmup: int) -> None:
    for g in opt.param_groups:
        g["lr"] = _lr(step, total, peak, warmup)


def _train_base(model, train_tokens, held_tokens, recipe: DemoRecipe, ckpt: Path, resume: bool) -> dict:
    """Stage 1: the base model, from the checkpoint `ckpt` when resuming; returns the log."""
    step, log = 0, {"base": [], "heads": []}
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.base_lr, betas=(0.9, 0.95), weight_decay=0.1)
    if ckpt.exists() and resume:
        state = load_training_checkpoint(ckpt, recipe)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, log = state["step"], state["log"]
        _log(f"base: resumed at step {step}")
    model.train()
    t0, tokens_seen = time.time(), 0
    while step < recipe.base_steps:
        _set_lr(opt, step, recipe.base_steps, recipe.base_lr, recipe.warmup_steps)
        x = _batch(train_tokens, recipe.seed, step, recipe.batch_size, recipe.seq_len)
        loss = model(x[:, :-1], labels=x[:, :-1]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x[:, :-1].numel()
        if step % 25 == 0 or step == recipe.base_steps:
            rate = tokens_seen / (time.time() - t0)
            entry = {"step": step, "loss": round(loss.item(), 4), "tokens_per_s": round(rate)}
            if step % 200 == 0 or step == recipe.base_steps:
                entry["held_out_loss"] = round(_held_out_loss(model, held_tokens, recipe), 4)
            log["base"].append(entry)
            _log(f"base {step}/{recipe.base_steps} " + " ".join(f"{k}={v}" for k, v in entry.items() if k != "step"))
        if step % 50 == 0 or step == recipe.base_steps:
            save_training_checkpoint(ckpt, recipe, model=model.state_dict(), opt=opt.state_dict(), step=step, log=log)
    return log


def _heads_loss(model, heads, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The heads' weighted loss on the batch `x` and each head's own loss."""
    with torch.no_grad():
        hidden = model.model(x[:, :-1]).last_hidden_state
    losses = []
    for k, head in enumerate(heads):
        # head k at position t predicts token t + k + 2
        shift = k + 2
        logits = head(hidden[:, : x.shape[1] - shift])
        losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, shift:].reshape(-1)))
    losses = torch.stack(losses)
    return (weights * losses).sum(), losses


def _train_heads(model, heads, train_tokens, recipe: DemoRecipe, ckpt: Path, resume: bool, log: dict) -> dict:
    """Stage 2: Medusa-1 heads on the frozen base, from the checkpoint `ckpt` when resuming;
    returns the log."""
    model.eval()
    model.requires_grad_(False)
    heads.init_projections_from(model.lm_head.weight)
    step = 0
    opt = torch.optim.AdamW(heads.parameters(), lr=recipe.head_lr, betas=(0.9, 0.95), weight_decay=0.0)
    if ckpt.exists() and resume:
        state = load_training_checkpoint(ckpt, recipe)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        step, log = state["step"], state["log"]
        _log(f"heads: resumed at step {step}")
    weights = torch.tensor([recipe.head_loss_decay**k for k in range(recipe.num_medusa_heads)])
    t0, tokens_seen = time.time(), 0
    while step < recipe.head_steps:
        _set_lr(opt, step, recipe.head_steps, recipe.head_lr, recipe.warmup_steps)
        x = _batch(train_tokens, recipe.seed + 1, step, recipe.batch_size, recipe.seq_len)
        loss, losses = _heads_loss(model, heads, x, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        tokens_seen += x[:, :-1].numel()
        if step % 25 == 0 or step == recipe.head_steps:
            rate = tokens_seen / (time.time() - t0)
            entry = {"step": step, "losses": [round(v, 4) for v in losses.tolist()], "tokens_per_s": round(rate)}
            log["heads"].append(entry)
            _log(f"heads {step}/{recipe.head_steps} losses={entry['losses']} tokens_per_s={entry['tokens_per_s']}")
        if step % 50 == 0 or step == recipe.head_steps:
            save_training_checkpoint(ckpt, recipe, heads=heads.state_dict(), opt=opt.state_dict(), step=step, log=log)
    return log


def _write_prompts(out_dir: Path, prompts: list[str]) -> None:
    """Even-indexed prompts calibrate, odd-indexed ones validate: disjoint, both spread over
    every held-out file (module doc: where they go)."""
    calibration_file, validation_file = _prompt_files(out_dir)
    write_text(calibration_file, "".join(json.dumps({"prompt": p}) + "\n" for p in prompts[0::2]))
    write_text(validation_file, "".join(json.dumps({"prompt": p}) + "\n" for p in prompts[1::2]))
