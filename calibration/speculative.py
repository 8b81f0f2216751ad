"""Draft-model speculative decoding: a small causal LM drafts a chain or a tree, the target
verifies it in one forward, by rejection sampling (temperature > 0) or greedily (temperature 0)
(docs/decoder.md#draft-models).

Verification rules, over probabilities (b, ..., V):

- chain (`chain_rejection`): Leviathan et al. 2023, Algorithm 1 (and Chen et al. 2023): draft
  x_i ~ q_i is kept with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the
  next token is drawn from norm(max(0, p_i - q_i)); when all gamma are kept, from p_{gamma+1};
- tree (`recursive_rejection`): recursive rejection sampling (Jeon et al. 2024, "Recursive
  Speculative Decoding", section 3): a node's children are drawn WITHOUT replacement from the
  draft's q at the node; they are tried in draw order, child c kept with probability
  min(1, p(c) / q(c)); after a rejection p <- norm(max(0, p - q)) and q <- q without c,
  renormalised; the first kept child becomes the node, and where none is kept the next token is
  drawn from the last residual p;
- temperature 0: p and q are one-hot at their argmax (`probabilities`), the drafts are the
  draft's top-k, and both rules reduce to greedy verification (a token is kept when it is the
  target's argmax).

`SpeculativeDecoder` runs the loop over a batch: the target's cache and step come from
`calibration.decoder.TreeDecoder` (tree mask, positions, holes); the draft model keeps a cache
of its own and re-reads, at the start of a step, the draft tokens the target accepted in the
previous step (docs/decoder.md#draft-models).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calibration.decode_loop import DecodeResult, DecodeState, PhaseClock, emit_roots, eos_set, generation_loop
from calibration.decoder import TreeDecoder
from calibration.drafters.draft_model import draw_children, probabilities
from calibration.kv_cache import KVCache, new_cache
from calibration.model_calls import (
    additive_mask,
    check_inputs,
    force_sdpa_gqa,
    model_forward_hidden,
    prompt_mask,
    uses_gqa,
)
from calibration.verification import Accepted
from treeopt.errors import UserError
from treeopt.tree import Tree

__all__ = [
    "SpeculativeDecoder",
    "chain_rejection",
    "children_table",
    "decoder_for",
    "draw_children",
    "probabilities",
    "recursive_rejection",
]


def decoder_for(model, drafter, tree: Tree, *, topk: int = 10, timing: bool = True):
    """The reference decoder of `model` with `drafter` over `tree`: `SpeculativeDecoder` for a
    draft model (it keeps a cache of its own), else `calibration.decoder.TreeDecoder`. Both
    `generate(input_ids, attention_mask, max_new_tokens=..., eos_token_id=...)` alike."""
    if getattr(drafter, "kind", "") == "draft-model":
        return SpeculativeDecoder(model, drafter, tree, timing=timing)
    return TreeDecoder(model, drafter, tree, topk=topk, timing=timing)


# --------------------------------------------------------------------------------------------
# Verification rules (pure functions of probabilities)


def _sample(probs: torch.Tensor, generator) -> torch.Tensor:
    """One draw per row of `probs` (b, V); rows whose mass vanished in rounding fall back to
    their argmax."""
    total = probs.sum(-1, keepdim=True)
    safe = torch.where(total > 0, probs, torch.ones_like(probs))
    return torch.multinomial(safe, 1, generator=generator)[:, 0]


def _uniform(shape, like: torch.Tensor, generator) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=like.device, dtype=torch.float32)


def chain_rejection(
    draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, generator=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan et al.'s verification of a drafted chain, for every row at once.

    draft_tokens: (b, g) x_1..x_g, drawn from q_1..q_g;
    draft_probs:  (b, g, V) q_1..q_g;
    target_probs: (b, g + 1, V) p_1..p_{g+1} (p_i conditioned on x_1..x_{i-1}).
    Returns (n (b,) drafts kept, next (b,) the token after them).
    """
    b, g = draft_tokens.shape
    rows = torch.arange(b, device=draft_tokens.device)
    q_x = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    p_x = target_probs[:, :g].gather(-1, draft_tokens[..., None])[..., 0]
    # why: keep x_i with probability min(1, p/q) (docs/decoder.md#draft-models); u * q < p
    # is u < p/q without dividing by a q that may be 0 at temperature 0.
    kept = _uniform((b, g), q_x, generator) * q_x < p_x
    n = kept.long().cumprod(-1).sum(-1)
    # why: at the first rejection the next token comes from norm(max(0, p - q)); with all kept,
    # from p_{g+1} (a zero q row there) (docs/decoder.md#draft-models).
    q_ext = torch.cat([draft_probs, draft_probs.new_zeros((b, 1, draft_probs.shape[-1]))], dim=1)
    residual = (target_probs[rows, n] - q_ext[rows, n]).clamp(min=0)
    return n, _sample(residual, generator)


def children_table(tree: Tree) -> np.ndarray:
    """(q, m) int64: each node's children (tree indices in `tree_buffers` order, root 0) in
    rank order, packed (at temperature > 0 a sibling's rank only orders the draws: the j-th
    child is the j-th draw), padded with -1."""
    nodes = [(), *tree.sorted_paths]
    index = {p: i for i, p in enumerate(nodes)}
    kids: list[list[tuple[int, int]]] = [[] for _ in nodes]
    for p in nodes[1:]:
        kids[index[p[:-1]]].append((p[-1], index[p]))
    width = max((len(k) for k in kids), default=0)
    table = np.full((len(nodes), max(width, 1)), -1, np.int64)
    for i, k in enumerate(kids):
        for j, (_, child) in enumerate(sorted(k)):
            table[i, j] = child
    return table


def recursive_rejection(
    tree_tokens: torch.Tensor,
    children: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator=None,
):
    """Recursive rejection sampling over a drafted tree (module doc), every row at once.

    tree_tokens:  (b, q) tokens, root at 0;
    children:     (q, m) `children_table(tree)` on the device: node's children
                  in draw order;
    draft_probs:  (b, q, V) q at each node that has children (other rows unused);
    target_probs: (b, q, V) p at each node.
    Returns (path (b, D + 1) tree indices of the kept nodes (root first, 0 past n_keep),
    n_keep (b,) 1 + kept nodes, last (b,) index of the last kept node, next (b,) token).
    """
    b, q = tree_tokens.shape
    rows = torch.arange(b, device=tree_tokens.device)
    depth = 0
    node = torch.zeros(b, dtype=torch.int64, device=tree_tokens.device)
    alive = torch.ones(b, dtype=torch.bool, device=tree_tokens.device)
    p = target_probs[:, 0].clone()
    steps = [node]
    # why: a depth's residual depends on the rejections of the depth before, and a sibling's
    # on its elder siblings' (Jeon et al. 2024, section 3): the loops run over depths and draw
    # order, each iteration over the whole batch.
    while bool(alive.any()) and depth < q:
        qd = draft_probs[rows, node].float()
        kept_child = torch.full((b,), -1, dtype=torch.int64, device=tree_tokens.device)
        for j in range(children.shape[1]):
            child = children[node, j]
            trying = alive & (child >= 0) & (kept_child < 0)
            if not bool(trying.any()):
                break
            x = tree_tokens[rows, child.clamp(min=0)]
            p_x, q_x = p[rows, x], qd[rows, x]
            kept = trying & (_uniform((b,), p, generator) * q_x < p_x)
            kept_child = torch.where(kept, child, kept_child)
            rejected = (trying & ~kept)[:, None]
            residual = (p - qd).clamp(min=0)
            residual = residual / residual.sum(-1, keepdim=True).clamp(min=1e-30)
            q_without = qd.scatter(1, x[:, None], 0.0)
            q_without = q_without / q_without.sum(-1, keepdim=True).clamp(min=1e-30)
            p = torch.where(rejected, residual, p)
            qd = torch.where(rejected, q_without, qd)
        moved = kept_child >= 0
        node = torch.where(moved, kept_child, node)
        p = torch.where(moved[:, None], target_probs[rows, node].float(), p)
        alive = alive & moved
        steps.append(torch.where(moved, node, 0))
        depth += 1
    path = torch.stack(steps, 1)
    n_keep = 1 + (path[:, 1:] > 0).sum(-1)
    return path, n_keep, node, _sample(p, generator)


# --------------------------------------------------------------------------------------------
# The decoder


@dataclass
class SpeculativeState:
    """The decoder's state between steps for the b active sequences.

    target:        the target's `DecodeState` (cache, slot validity, positions, root).
    draft_cache:   the draft model's `KVCache`: the context up to the token before the root,
                   minus `pending`.
    draft_valid:   (b, Cd) bool, its slots each sequence may see.
    pending:       (b, P) tokens kept last step that the draft has not read yet, right-aligned
                   (they sit just before the root); `pending_valid` (b, P) marks them.
    """

    target: DecodeState
    draft_cache: KVCache
    draft_valid: torch.Tensor
    pending: torch.Tensor
    pending_valid: torch.Tensor


class SpeculativeDecoder:
    """Draft-model speculative decoding of `target` with `drafter` (a
    `calibration.drafters.draft_model.DraftModel`, same vocabulary) over the static `tree` (a
    chain ``[[0], [0, 0], ...]`` is classic speculative decoding with gamma = its depth; the
    empty tree is plain decoding). Temperature 0: greedy, lossless; > 0: rejection sampling,
    the target's distribution (module doc)."""

    def __init__(self, target, drafter, tree: Tree, *, timing: bool = True, attention: str | None = None):
        topk = 1 + max((p[-1] for p in tree.paths), default=0)
        # `attention`: the target's verification attention (`TreeDecoder`'s)
        self.td = TreeDecoder(target, drafter, tree, topk=topk, timing=timing, attention=attention)
        self.drafter, self.tree, self.timing = drafter, tree, timing
        self.device, self.q = self.td.device, self.td.q
        self.draft_model = drafter.model
        self.draft_dtype = self.draft_model.get_output_embeddings().weight.dtype
        self.force_gqa = self.device.type == "cpu" and uses_gqa(self.draft_model)
        self.is_chain = all(p == (0,) * len(p) for p in tree.paths)

        def t(a):
            return torch.from_numpy(np.array(a, copy=True)).to(self.device)

        self.children_drawn = t(children_table(tree))
        # draw order of each node among its siblings (the rank at temperature 0)
        drawn = np.zeros(self.q, np.int64)
        table = children_table(tree)
        for j in range(table.shape[1]):
            drawn[table[:, j][table[:, j] >= 0]] = j
        self.draw_index = [t(drawn[lvl.nodes.cpu().numpy()]) for lvl in self.td.drafting.levels]
        # The draft reads the tree's nodes that have children, depth by depth; each row sees
        # the context, the root and its ancestors among them (tree attention, docs/trees.md).
        fed = [lvl.nodes[lvl.expand].cpu().numpy() for lvl in self.td.drafting.levels]
        order = np.concatenate(fed) if fed else np.zeros(0, np.int64)
        mask = self.td.buffers.attention_mask.astype(bool)
        self.fed_nodes = [t(f) for f in fed]
        self.fed_masks, start = [], 0
        for f in fed:
            start += len(f)
            self.fed_masks.append(additive_mask(t(mask[np.ix_(f, order[:start])]), self.draft_dtype))
        self.fed_total = int(len(order))

    # ---- draft model passes ----------------------------------------------------------------

    def _draft_forward(self, state: SpeculativeState, tokens, positions, local_mask):
        """Logits (b, n, V) of the draft model over `tokens` (b, n) appended to its cache; the
        rows see the valid cache slots and `local_mask` (b, n, n) additive among themselves."""
        b, n = tokens.shape
        c = state.draft_valid.shape[1]
        seen = additive_mask(state.draft_valid, self.draft_dtype)[:, None, None, :].expand(b, 1, n, c)
        mask = torch.cat([seen, local_mask[:, None]], dim=-1)
        with force_sdpa_gqa(self.force_gqa):
            hidden = model_forward_hidden(
                self.draft_model, tokens, attention_mask=mask, position_ids=positions, cache=state.draft_cache
            )
        return self.draft_model.get_output_embeddings()(hidden)

    def draft(self, state: SpeculativeState, temperature: float, generator):
        """Draft the tree: (tokens (b, q), draft probabilities (b, q, V) at the nodes with
        children). One draft pass reads the pending tokens and the root, then one pass per
        depth reads the nodes of that depth that have children (a chain of gamma: gamma passes)."""
        ts = state.target
        b = ts.root.shape[0]
        first = torch.cat([state.pending, ts.root[:, None]], dim=1)
        n = first.shape[1]
        positions = ts.next_pos[:, None] - (n - 1) + torch.arange(n, device=self.device)[None]
        valid = torch.cat([state.pending_valid, torch.ones_like(ts.root, dtype=torch.bool)[:, None]], dim=1)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        local = (causal[None] & valid[:, None, :]) | torch.eye(n, dtype=torch.bool, device=self.device)[None]
        logits = self._draft_forward(state, first, positions.clamp(min=0), additive_mask(local, self.draft_dtype))
        state.draft_valid = torch.cat([state.draft_valid, valid], dim=1)
        vocab = logits.shape[-1]
        tokens = ts.root.new_zeros((b, self.q))
        tokens[:, 0] = ts.root
        q_nodes = torch.zeros((b, self.q, vocab), dtype=torch.float32, device=self.device)
        parent_probs = probabilities(logits[:, -1:], temperature)  # (b, parents = 1, V)
        q_nodes[:, 0] = parent_probs[:, 0]
        for d, level in enumerate(self.td.drafting.levels):
            slot = level.rank if temperature <= 0 else self.draw_index[d]
            picks = draw_children(
                parent_probs, level.width if temperature <= 0 else int(slot.max()) + 1, temperature, generator
            )  # (b, parents, k)
            tokens[:, level.nodes] = picks[:, level.parent_slot, slot]
            if d + 1 < len(self.td.drafting.levels):
                fed = self.fed_nodes[d]
                logits = self._tree_forward(state, tokens[:, fed], ts.next_pos[:, None] + d + 1, self.fed_masks[d])
                parent_probs = probabilities(logits, temperature)
                q_nodes[:, fed] = parent_probs
        return tokens, q_nodes

    def _tree_forward(self, state: SpeculativeState, tokens, positions, fed_mask):
        """A draft pass over tree nodes (b, n): the rows see the valid context and root
        (`draft_valid`) and, by `fed_mask` (n, tree nodes read so far, these included), their
        ancestors among the tree nodes already read and themselves."""
        b, n = tokens.shape
        c = state.draft_valid.shape[1]
        seen = additive_mask(state.draft_valid, self.draft_dtype)[:, None, None, :].expand(b, 1, n, c)
        mask = torch.cat([seen, fed_mask[None, None].expand(b, 1, -1, -1)], dim=-1)
        with force_sdpa_gqa(self.force_gqa):
            hidden = model_forward_hidden(
                self.draft_model,
                tokens,
                attention_mask=mask,
                position_ids=positions.expand(b, n),
                cache=state.draft_cache,
            )
        return self.draft_model.get_output_embeddings()(hidden)

    @torch.inference_mode()
    def step_work(self, state: SpeculativeState) -> None:
        """Exactly the model work of one greedy step (every draft pass, then the target's
        verification forward over the q tree tokens), then both caches cut back to where they
        were: what the measured sweep times (calibration.sweep)."""
        ts = state.target
        draft_before, valid_before = state.draft_cache.length, state.draft_valid
        tokens, _ = self.draft(state, 0.0, None)
        verifier = self.td.verifier
        verifier.forward(ts.cache, tokens, *verifier.layout(ts.valid, ts.next_pos))
        ts.cache.crop(-self.q)
        state.draft_cache.crop(draft_before - state.draft_cache.length)
        state.draft_valid = valid_before

    def _accept(self, tokens, q_nodes, logits, temperature: float, generator) -> Accepted:
        """The target's verdict on the tree tokens (b, q) drafted with probabilities `q_nodes`,
        from its logits (b, q, V): greedy at temperature 0, else rejection sampling over the
        chain or the tree (module doc)."""
        if temperature <= 0:
            return self.td.verifier.accept(tokens, logits)
        p_nodes = probabilities(logits, temperature)
        if not self.is_chain:
            return Accepted(*recursive_rejection(tokens, self.children_drawn, q_nodes, p_nodes, generator))
        b, g = tokens.shape[0], self.q - 1
        n, bonus = chain_rejection(tokens[:, 1:], q_nodes[:, :g], p_nodes, generator)
        path = torch.arange(self.q, device=self.device)[None].expand(b, -1)
        path = torch.where(path <= n[:, None], path, 0)
        return Accepted(path, n + 1, n, bonus)

    # ---- one step ----------------------------------------------------------------------------

    @torch.inference_mode()
    def step(
        self, state: SpeculativeState, clock: PhaseClock | None = None, *, temperature: float = 0.0, generator=None
    ):
        """One step for every active sequence: (tokens (b, D + 1) produced, valid up to n_keep;
        n_keep (b,) = kept drafts + 1)."""
        clock = clock or PhaseClock(False, self.device)
        td, ts = self.td, state.target
        with clock("draft"):
            tokens, q_nodes = self.draft(state, temperature, generator)
        with clock("verify"):
            verified = td.verifier.forward(ts.cache, tokens, *td.verifier.layout(ts.valid, ts.next_pos))
        with clock("update"):
            accepted = self._accept(tokens, q_nodes, verified.logits, temperature, generator)
            new = td.keep(ts, tokens, verified, accepted)  # the target keeps the root and the kept nodes
            n_keep, keep = accepted.n_keep, int(accepted.n_keep.max())
            # the draft forgets the tree and re-reads the kept drafts next step
            if self.fed_total:
                state.draft_cache.crop(-self.fed_total)
            width = keep - 1
            shift = torch.arange(width, device=self.device)[None] - (width - (n_keep - 1))[:, None]
            state.pending = new.gather(1, shift.clamp(min=0)) if width else new[:, :0]
            state.pending_valid = shift >= 0
        return new, n_keep

    # ---- prefill and the loop ----------------------------------------------------------------

    @torch.inference_mode()
    def prefill(
        self, input_ids, attention_mask=None, *, capacity: int = 0, temperature: float = 0.0, generator=None
    ) -> SpeculativeState:
        """Both models read the prompts (b, L); the target's first token is the root."""
        input_ids = input_ids.to(self.device)
        target = self.td.prefill(
            input_ids, attention_mask, capacity=capacity, temperature=temperature, generator=generator
        )
        valid = check_inputs(input_ids, attention_mask)
        length = input_ids.shape[1]
        mask = prompt_mask(valid)
        cache = new_cache(self.draft_model, max(capacity, length))
        with force_sdpa_gqa(self.force_gqa):
            model_forward_hidden(
                self.draft_model,
                input_ids,
                attention_mask=additive_mask(mask, self.draft_dtype)[:, None],
                position_ids=(valid.long().cumsum(-1) - 1).clamp(min=0),
                cache=cache,
            )
        none = input_ids.new_zeros((input_ids.shape[0], 0))
        return SpeculativeState(target, cache, valid, none, none.bool())

    def _drop_finished(self, state: SpeculativeState, finished: list[bool]) -> None:
        if not any(finished):
            return
        ts = state.target
        idx = torch.tensor([not f for f in finished], device=self.device).nonzero()[:, 0]
        ts.rows = ts.rows[idx]
        if idx.numel() == 0:
            return
        ts.cache.batch_select_indices(idx)
        state.draft_cache.batch_select_indices(idx)
        ts.valid, ts.next_pos, ts.root, ts.hidden = ts.valid[idx], ts.next_pos[idx], ts.root[idx], ts.hidden[idx]
        state.draft_valid, state.pending = state.draft_valid[idx], state.pending[idx]
        state.pending_valid = state.pending_valid[idx]

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask=None,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        eos_token_id=None,
        seed: int = 0,
    ) -> DecodeResult:
        """Decode up to `max_new_tokens` tokens per prompt (as `TreeDecoder.generate`; the
        draft model's passes are timed as "draft"). Temperature 0: greedy; > 0: sampled with a
        torch.Generator seeded with `seed`."""
        eos = eos_set(eos_token_id)
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens: must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise UserError(f"temperature: must be >= 0, got {temperature}")
        b = input_ids.shape[0]
        out: list[list[int]] = [[] for _ in range(b)]
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        clock = PhaseClock(self.timing, self.device)
        with clock("prefill"):
            capacity = input_ids.shape[1] + 2 * max_new_tokens + self.q
            state = self.prefill(input_ids, attention_mask, capacity=capacity, temperature=temperature, generator=gen)
            self._drop_finished(state, emit_roots(out, state.target.root, max_new_tokens, eos))
        return generation_loop(
            lambda: self.step(state, clock, temperature=temperature, generator=gen),
            lambda: state.target.rows,
            lambda finished: self._drop_finished(state, finished),
            out,
            b,
            max_new_tokens,
            eos,
            clock,
        )
