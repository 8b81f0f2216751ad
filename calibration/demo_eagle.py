"""The demo's EAGLE-3 draft: one decoder layer trained on the frozen demo model, so that
`treeopt run --drafter eagle3` runs end to end with no downloads (docs/decoder.md#eagle).

The recipe (`treeopt demo train-drafters --only eagle3`): the draft vocabulary is the
`eagle3_draft_vocab` most frequent tokens of the train split (the authors' recipe, EAGLE-3
`traineagle3/cnets.py`: d2t from the used tokens); fc reads the inputs of the demo model's
layers 1, 2 and 4 (low, middle, high, `aux_layers_for`: the engines' default (2, L // 2, L - 3)
repeats layer 2 in a 5-layer model); the embedding is the base model's (frozen, not stored); lm_head starts as the
base lm_head's rows of the draft vocabulary. Training is the calibration's teacher forcing with
gradients ("training-time test", EAGLE-3 section 3): the layer runs over every pair of a window,
then depth by depth each position's own output is fed back with the true next token, and depth
d's loss (weight decay^d) is the cross-entropy of the draft logits at x_{t+d+2}, positions whose
label is outside the draft vocabulary left out. Written to OUT/eagle3 in the speculators layout,
bf16.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from calibration.demo import _batch, _lr, after_drafter_step, load_training_checkpoint
from calibration.drafters.eagle import EagleDrafter, save_eagle3
from calibration.drafters.eagle_layer import EagleShape

EAGLE3_DIR = "eagle3"


def aux_layers_for(num_layers: int) -> tuple[int, int, int]:
    """The inputs of layers 1, L // 2 and L - 1: low, middle and high, (1, 2, 4) for the demo's
    5 layers, where the engines' default (2, L // 2, L - 3) would read layer 2 three times."""
    return (1, num_layers // 2, num_layers - 1)


def new_draft(model, draft_vocab: int, counts: np.ndarray, depths: int) -> EagleDrafter:
    """An EAGLE-3 draft for `model` over its `draft_vocab` most frequent tokens (`counts`)."""
    cfg = model.config
    vocab = int(cfg.vocab_size)
    used = torch.from_numpy(np.sort(np.argsort(-counts, kind="stable")[:draft_vocab]).astype(np.int64))
    shape = EagleShape(
        eagle3=True,
        hidden_size=int(cfg.hidden_size),
        target_hidden_size=None,
        num_attention_heads=int(cfg.num_attention_heads),
        num_key_value_heads=int(cfg.num_key_value_heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads),
        intermediate_size=int(cfg.intermediate_size),
        rms_norm_eps=float(cfg.rms_norm_eps),
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        aux_layer_ids=aux_layers_for(int(cfg.num_hidden_layers)),
        norm_before_residual=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act=str(cfg.hidden_act),
        rope={
            "rope_parameters": dict(cfg.rope_parameters),
            "max_position_embeddings": int(cfg.max_position_embeddings),
        },
    )
    draft = EagleDrafter(
        shape,
        vocab_size=vocab,
        target_hidden_size=int(cfg.hidden_size),
        aux_layer_ids=shape.aux_layer_ids,
        max_depth=depths,
    )
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        draft.lm_head.weight.copy_(model.get_output_embeddings().weight[used])
        draft.d2t.copy_(used - torch.arange(draft_vocab))
    draft.embed_tokens.requires_grad_(False)
    return draft


def depth_losses(draft: EagleDrafter, model, x: torch.Tensor, depths: int) -> torch.Tensor:
    """(depths,) teacher-forced losses on a batch of windows x (B, T) (module doc)."""
    b, t = x.shape
    positions = t - depths - 1  # every position has a label at every depth
    with torch.no_grad():
        states = model.model(x, output_hidden_states=True).hidden_states
    features = draft.features(states, None)[:, :positions]
    cols = torch.arange(positions)
    draft.read_context(features, x[:, 1 : positions + 1], torch.ones((b, positions), dtype=torch.bool), cols[None])
    rows = torch.arange(b).repeat_interleave(positions)
    c = cols.repeat(b)
    state = draft.begin_at(features[rows, c], x[rows, c + 1], rows, c, c)
    to_draft = torch.full((draft.vocab_size,), -100, dtype=torch.long)
    to_draft[draft.draft_to_target] = torch.arange(draft.draft_vocab_size)
    losses = []
    for d in range(depths):
        _, carry = draft.depth_logits(state, d)
        logits = draft.lm_head(draft.norm(carry[0]))
        labels = x[rows, c + d + 2]
        losses.append(F.cross_entropy(logits, to_draft[labels], ignore_index=-100))
        if d + 1 < depths:
            state = draft.child_state(carry, d, labels)
    draft.set_context(None)
    return torch.stack(losses)


def train_eagle3(model, tokens: np.ndarray, recipe, out_dir, work_dir, resume: bool, log) -> dict:
    """Train the demo's EAGLE-3 draft (module doc) and write it to out_dir/eagle3."""
    depths = recipe.eagle3_depths
    counts = np.bincount(tokens, minlength=model.config.vocab_size)
    draft = new_draft(model, recipe.eagle3_draft_vocab, counts, depths)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt, step, entries = work_dir / "eagle3.pt", 0, []
    if ckpt.exists() and resume:
        state = load_training_checkpoint(ckpt, recipe)
        draft.load_state_dict(state["drafter"])
        opt.load_state_dict(state["opt"])
        step, entries = state["step"], state["log"]
        log(f"eagle3: resumed at step {step}")
    weights = torch.tensor([recipe.loss_decay**d for d in range(depths)])
    t0 = time.time()
    draft.train()
    while step < recipe.steps:
        for g in opt.param_groups:
            g["lr"] = _lr(step, recipe.steps, recipe.lr, recipe.warmup_steps)
        x = _batch(tokens, recipe.seed + 4, step, recipe.eagle3_batch_size, recipe.eagle3_seq_len)
        losses = depth_losses(draft, model, x, depths)
        opt.zero_grad(set_to_none=True)
        (weights * losses).sum().backward()
        opt.step()
        step += 1
        after_drafter_step("eagle3", step, losses, t0, entries, recipe, ckpt, draft, opt, say=log)
    draft.eval()
    save_eagle3(draft, out_dir / EAGLE3_DIR)
    trained = sum(p.numel() for p in params)
    return {"log": entries, "parameters": trained, "aux_layer_ids": list(draft.aux_layer_ids)}


__all__ = ["EAGLE3_DIR", "aux_layers_for", "depth_losses", "new_draft", "train_eagle3"]
