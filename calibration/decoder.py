"""The reference Medusa tree decoder: a static candidate tree, tree attention, greedy or typical
verification, over a transformers causal LM with its draft heads and a KV cache kept in one
preallocated buffer (docs/decoder.md).

One decoding step (`TreeDecoder.step`), for every sequence of the batch at once, vectorised
over the batch and the tree:

1. draft: the drafter guesses the tree from the last accepted token's hidden state
   (`calibration.tree_drafting`: Medusa heads fill Medusa's flat candidate vector, a sequential
   drafter drafts depth by depth);
2. forward: one forward of the base model verifies every candidate at once, in one of two forms
   (`calibration.verification`): the q = n + 1 tree tokens under the tree mask
   ``[cache slots the sequence may see | tree ancestor mask]`` at positions ``next position +
   depth``, or the leaves' root paths as candidate sequences, each against its own copy of the
   context (IBM's batch expansion);
3. accept: greedy (a token equal to the base argmax at its parent, under an accepted parent)
   or typical (p(x) > min(eps, alpha * exp(-H(p))) at the parent); the longest accepted
   root-to-leaf path and the bonus token after it;
4. keep: the cache keeps the step's root and accepted nodes, the sequences get their tokens,
   finished ones (eos, max_new_tokens) leave the batch.

Tokens emitted per step per sequence = accepted nodes + 1 (the bonus, which is the next root).
The first token comes from the prefill, so with the empty tree this is plain greedy decoding
(`calibration.greedy.greedy_decode`, the reference it must reproduce).

Batches: every sequence keeps its own validity mask over the cache slots and its own next
position id. A step keeps ``max(1 + accepted)`` slots for every sequence; a sequence that
accepted fewer leaves holes, masked out of its attention. Prompt padding is handled the same way.
"""

from __future__ import annotations

import numpy as np
import torch

from calibration.captured_drafting import CapturedStep, DraftEpilogue, captured_refusal, drafting_mode
from calibration.decode_loop import DecodeResult, DecodeState, PhaseClock, emit_roots, eos_set, generation_loop
from calibration.eagle_decoding import append_pairs, draft_context, prefill_pairs
from calibration.kv_cache import KVCache, new_cache
from calibration.model_calls import (
    additive_mask,
    check_full_attention,
    check_inputs,
    fast_argmax,
    force_sdpa_gqa,
    lm_head,
    model_device,
    model_forward_features,
    model_forward_hidden,
    prompt_mask,
    uses_gqa,
)
from calibration.split_attention import attention_path, split_block
from calibration.static_steps import DEFAULT_BUCKET, StepRunner, graphs_enabled, static_window, step_mode, uses_static
from calibration.tree_drafting import MedusaDrafting, SequentialDrafting
from calibration.verification import (
    GREEDY,
    AcceptanceRule,
    Accepted,
    CandidateVerifier,
    TreeVerifier,
    Verified,
)
from treeopt.errors import UserError
from treeopt.forms import VERIFICATION_FORMS
from treeopt.tree import Tree, make_tree, tree_buffers

__all__ = ["TreeDecoder", "cut_tree"]

_DRAFT_UNITS = {
    "medusa": "Medusa heads",
    "hydra": "Hydra heads",
    "mlp-speculator": "MLP speculator stages",
    "draft-model": "draft-model depths",
}


def cut_tree(tree: Tree, num_heads: int, topk: int) -> Tree:
    """The nodes of `tree` with depth <= num_heads and every rank < topk (a tree again: the
    kept set is closed under prefixes), in the same insertion order."""
    keep = [p for p in tree.paths if len(p) <= num_heads and max(p) < topk]
    return make_tree(keep, allow_empty=True, source=tree.name)


def _check_arguments(model, heads, tree: Tree, topk, verification: str) -> None:
    if verification not in VERIFICATION_FORMS:
        raise UserError(f"verification: must be one of {', '.join(VERIFICATION_FORMS)}, got {verification!r}")
    if tree.depth > heads.num_heads:
        what = _DRAFT_UNITS.get(getattr(heads, "kind", "medusa"), "draft heads")
        raise UserError(
            f"{tree.name}: depth {tree.depth} needs {tree.depth} {what}, "
            f"the drafter has {heads.num_heads} (cut the tree with cut_tree)"
        )
    vocab = model.get_output_embeddings().weight.shape[0]
    if heads.vocab_size != vocab:
        raise UserError(f"heads: vocabulary {heads.vocab_size}, the model's is {vocab}")
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= vocab:
        raise UserError(f"topk: must be an integer in 1..{vocab}, got {topk!r}")
    check_full_attention(model)


class TreeDecoder:
    """Medusa tree decoding with `model` (a transformers causal LM, eval mode) and `heads`
    (`MedusaHeads` on the same device and dtype) over the static `tree`, candidates from the
    heads' top-`topk`. See the module docstring for the algorithm.

    `timing=True` records per-step wall times of the phases (synchronising CUDA devices before
    each clock read); with False the times are zeros and nothing is synchronised.
    `verification`: "tree" (one sequence of q tokens under the tree mask) or "candidates" (the
    tree's leaves' root paths as candidate sequences,
    docs/decoder.md#candidate-sequence-verification); both accept the same tokens.
    `graphs`: how the verification forward runs (docs/decoder.md#static-shape-steps): in
    static shapes (`calibration.static_steps.StepRunner`), captured and replayed as CUDA graphs
    on CUDA, with True, and with None (the default) on CUDA only; else the eager forward over
    the filled slots only.
    `bucket`: the static attention window's granularity in slots.
    `attention`: how the verification forward attends (docs/decoder.md#split-verification-attention):
    "split" (the cached prefix without a per-query mask, the step's block under its tree mask,
    merged by log-sum-exp) or "masked" (one sdpa call under the whole mask); None: split on
    CUDA, masked elsewhere. `self.attention` is the path that runs ("masked" where the model
    does not attend through sdpa).
    `drafting`: "captured" (acceptance, the cache keep and the next draft inside the static step,
    docs/decoder.md#captured-drafting; greedy steps, tree form, drafters whose shapes are static)
    or "separate" (each a phase of its own); None: captured where steps are captured as CUDA
    graphs and the drafter allows it. `self.drafting_mode` is the mode that runs,
    `self.drafting_refusal` why captured drafting cannot (None when it can).
    """

    def __init__(
        self,
        model,
        heads,
        tree: Tree,
        *,
        topk: int = 10,
        timing: bool = True,
        verification: str = "tree",
        graphs: bool | None = None,
        bucket: int = DEFAULT_BUCKET,
        attention: str | None = None,
        drafting: str | None = None,
    ):
        _check_arguments(model, heads, tree, topk, verification)
        attention = attention_path(model, attention, model_device(model))
        buf = tree_buffers(tree, topk)  # validates ranks < topk
        self.model, self.heads, self.tree, self.topk, self.timing = model, heads, tree, topk, timing
        self.device = model_device(model)
        self.dtype = model.get_output_embeddings().weight.dtype
        self.q = tree.size + 1
        self.buffers = buf
        self.force_gqa = self.device.type == "cpu" and uses_gqa(model)
        self.verification = verification
        # an EAGLE draft reads the auxiliary layers the static step does not return: eager
        self.eagle = hasattr(heads, "read_context")
        self.steps = "eager" if self.eagle else step_mode(graphs, self.device)
        self.attention = attention
        self.split = self.attention == "split"
        self.runner = None
        if uses_static(graphs, self.device) and not self.eagle:
            capture = graphs_enabled(graphs, self.device)
            self.runner = StepRunner(model, force_gqa=self.force_gqa, graphs=capture, bucket=bucket, split=self.split)
        form = TreeVerifier if verification == "tree" else CandidateVerifier
        self.verifier = form(buf, self._forward, self.dtype, self.device)
        self._range = torch.arange(self.q, device=self.device)  # `_iota`'s source
        self.sequential = bool(getattr(heads, "sequential", False))
        self.prefix_layer = bool(getattr(heads, "prefix_layer", False))
        if self.sequential:
            ranks = np.array([0, *(p[-1] for p in tree.sorted_paths)])
            self.drafting = SequentialDrafting(heads, buf, ranks, self.device)
        else:
            topk_used = 1 + max((p[-1] for p in tree.paths), default=-1)
            tree_indices = self.verifier.to_device(buf.tree_indices)
            self.drafting = MedusaDrafting(heads, tree_indices, tree.depth, topk, topk_used)
        self.drafting_refusal = captured_refusal(heads, verification)
        self.drafting_mode = drafting_mode(
            drafting,
            refusal=self.drafting_refusal,
            static=self.runner is not None,
            captured=graphs_enabled(graphs, self.device),
        )
        self.captured = None
        if self.drafting_mode == "captured":
            self.captured = StepRunner(
                model,
                force_gqa=self.force_gqa,
                graphs=graphs_enabled(graphs, self.device),
                bucket=bucket,
                split=self.split,
                epilogue=DraftEpilogue(self.verifier, self.drafting),
            )

    # ---- the pieces of a step --------------------------------------------------------------

    def _forward(self, cache, tokens, mask, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """(base logits (b, q, V), last hidden states (b, q, h)) of tokens (b, q) appended to
        `cache` (in static shapes unless `graphs` is False); an EAGLE draft's features (b, q, F)
        in place of the hidden states."""
        if self.eagle:
            with force_sdpa_gqa(self.force_gqa), split_block(self.model, None, self.split):
                last, features = model_forward_features(
                    self.model, self.heads, tokens, attention_mask=mask, position_ids=positions, cache=cache
                )
            return lm_head(self.model, last), features
        if self.runner is not None:
            return self.runner(cache, tokens, mask, positions)
        with force_sdpa_gqa(self.force_gqa), split_block(self.model, None, self.split):
            hidden = model_forward_hidden(self.model, tokens, attention_mask=mask, position_ids=positions, cache=cache)
        return lm_head(self.model, hidden), hidden

    def _pick(self, logits, temperature, generator):
        """Argmax (temperature 0) or a sample from softmax(logits / T); logits (b, V)."""
        if temperature <= 0:
            return fast_argmax(logits)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    @torch.inference_mode()
    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask=None,
        *,
        capacity: int = 0,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> DecodeState:
        """Run the prompts (b, L) through the model (padding anywhere, where attention_mask
        is 0) into a fresh cache of at least `capacity` slots and return the state whose
        `root` is each sequence's first new token."""
        input_ids = input_ids.to(self.device)
        valid = check_inputs(input_ids, attention_mask)
        b, length = input_ids.shape
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        capacity = max(capacity, length)
        if self.runner is not None:  # room for the last static window (docs/decoder.md#static-shape-steps)
            capacity = static_window(capacity, 0, self.runner.bucket)
        cache = new_cache(self.model, capacity)
        mask = additive_mask(prompt_mask(valid), self.dtype)[:, None]
        with force_sdpa_gqa(self.force_gqa):
            if self.eagle:
                hidden, features = model_forward_features(
                    self.model, self.heads, input_ids, attention_mask=mask, position_ids=positions, cache=cache
                )
            else:
                hidden = model_forward_hidden(
                    self.model, input_ids, attention_mask=mask, position_ids=positions, cache=cache
                )
        last = length - 1 - valid.flip(-1).long().argmax(-1)  # index of each row's last real token
        rows = torch.arange(b, device=self.device)
        h_last = hidden[rows, last]  # (b, h)
        draft_cache, draft_hidden, draft_valid = None, h_last, None
        if self.eagle:
            # why: the draft keeps a cache of its own pairs, slot for slot (docs/decoder.md#eagle)
            draft_cache, draft_valid = prefill_pairs(self.heads, features, input_ids, valid, positions, capacity)
            draft_hidden = features[rows, last]
        if self.prefix_layer:
            # why: Hydra++'s prefix layer reads the whole prompt into a cache of its own
            # (docs/decoder.md#hydra)
            draft_cache = KVCache(1, max(capacity, length))
            draft_hidden = self.heads.context_states(hidden, valid, positions, cache=draft_cache)[rows, last]
        return DecodeState(
            cache=cache,
            valid=valid,
            next_pos=valid.sum(-1),
            root=self._pick(lm_head(self.model, h_last), temperature, generator),
            hidden=draft_hidden,
            rows=rows,
            draft_cache=draft_cache,
            draft_valid=draft_valid,
        )

    def draft(self, state: DecodeState, clock: PhaseClock | None = None) -> torch.Tensor:
        """The tree tokens (b, q) the drafter guesses from `state`: from the hidden state of the
        token that produced the root (its last accepted token). The drafter's forward is model
        work, timed with the verification; laying out the tree is the draft phase."""
        clock = clock or PhaseClock(False, self.device)
        with clock("verify"):
            if self.eagle:
                self.heads.set_context(draft_context(state.draft_cache, state.draft_valid, state.next_pos - 1))
            proposal = self.drafting.propose(state.hidden, state.root)
        with clock("draft"):
            return self.drafting.tree_tokens(state.root, proposal)

    @torch.inference_mode()
    def verify_forward(self, cache, tree_tokens, cache_valid, positions):
        """Exactly the model work of one decoding step: the tree forward over `tree_tokens`
        (b, q) against `cache`, the base lm_head on all q tokens, the heads the tree uses on
        one token per sequence (the root here; a step runs them at its last accepted token:
        the same cost).

        cache:       `KVCache` with C slots per sequence; the q tree tokens are APPENDED
                     (``cache.crop(-q)`` undoes it, e.g. between timing repeats).
        cache_valid: (b, C) bool, the cache slots each sequence may attend to.
        positions:   (b,) int64, each sequence's root position (its number of valid slots).
        Returns (base logits (b, q, V), head logits (D, b, 1, V)), D = the tree's depth; for a
        sequential drafter the second item is the tree it drafts from the root (b, q). Hydra++'s
        prefix layer runs too, on one token over a stand-in cache of C entries (undone after).

        Verification "candidates": the context copied to the n candidate rows of each sequence
        and one forward over the rows; nothing is appended to `cache` (`verify_appends` is 0),
        and the base logits are per row, (b, n, D + 1, V): row j is the j-th leaf's root path
        (`tree_buffers(...).retrieve_indices[j]`), padded at its end.
        """
        if self.captured is not None:
            # the whole captured step: forward, acceptance, keep and the next draft
            # (docs/decoder.md#captured-drafting); its keep stays inside the q appended slots
            logits, _, *rest = self.captured(cache, tree_tokens, *self.verifier.layout(cache_valid, positions))
            return logits, CapturedStep(*rest).draft
        verified = self.verifier.forward(cache, tree_tokens, *self.verifier.layout(cache_valid, positions))
        root_hidden = verified.root_hidden  # (b, 1, h)
        if self.prefix_layer:
            root_hidden = self._timed_prefix_layer(root_hidden, cache_valid, positions)
        if self.sequential:
            return verified.logits, self.drafting.propose(root_hidden[:, 0], tree_tokens[:, 0])
        return verified.logits, self.drafting.propose(root_hidden, tree_tokens[:, 0])

    @property
    def verify_appends(self) -> int:
        """Slots `verify_forward` appends to the cache it is given (to crop between repeats)."""
        return self.verifier.appends

    def _timed_prefix_layer(self, root_hidden, cache_valid, positions) -> torch.Tensor:
        """Hydra++'s prefix layer on the root's hidden state (b, 1, h) over a stand-in cache of
        C entries, undone after: its work in a step (docs/decoder.md#hydra)."""
        draft_cache = self._stand_in_draft_cache(cache_valid.shape[0], cache_valid.shape[1])
        out = self.heads.context_states(
            root_hidden,
            cache_valid.new_ones((cache_valid.shape[0], 1)),
            positions[:, None],
            past_valid=cache_valid,
            cache=draft_cache,
        )
        draft_cache.crop(-1)
        return out

    def _stand_in_draft_cache(self, b: int, c: int) -> KVCache:
        """A prefix-layer cache of c zero entries per sequence for timing `verify_forward`
        (the values do not change the work), kept between calls."""
        cache = getattr(self, "_timing_draft_cache", None)
        if cache is None or cache.buffer.shape[2] != b or cache.capacity < c + 1:
            attn = self.heads.prefix_embeding_layer.layers[0].self_attn
            kv_heads = attn.config.num_key_value_heads
            cache = KVCache(1, c + 1)
            cache.reserve(c + 1, torch.zeros((b, kv_heads, 0, attn.head_dim), dtype=self.dtype, device=self.device))
            cache.buffer.zero_()
            self._timing_draft_cache = cache
        cache.layers[0].length = c
        return cache

    # ---- one step --------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, state: DecodeState, clock: PhaseClock | None = None, rule: AcceptanceRule = GREEDY):
        """One decoding step for every active sequence under the acceptance `rule` (`clock`:
        where the phases' wall times go, None = not timed). Updates `state` in place and returns
        (tokens (b, D + 1) the step produced per sequence, in order, valid up to n_keep; n_keep
        (b,) = accepted nodes + 1)."""
        clock = clock or PhaseClock(False, self.device)
        if self.captured is not None and rule.greedy:
            return self._captured_step(state, clock)
        # 1. draft: the drafter guesses the tree from the last accepted token's hidden state
        #    (Medusa paper section 2.1.1).
        tokens = self.draft(state, clock)
        with clock("draft"):
            mask, positions = self.verifier.layout(state.valid, state.next_pos)
        # 2. forward: one forward of the base model scores every candidate at once: the tree
        #    under tree attention, or the candidate rows, each against its own copy of the context.
        with clock("verify"):
            verified = self.verifier.forward(state.cache, tokens, mask, positions)
        with clock("update"):
            # 3. accept: a token is accepted when the base model agrees at its parent (greedy: it
            #    is the argmax; typical: p(x) > min(eps, alpha * exp(-H(p)))) and its parent is
            #    accepted; the longest accepted root-to-leaf path, and the bonus token after it.
            accepted = self.verifier.accept(tokens, verified.logits, rule)
            # 4. keep: the accepted path's cache entries, and its last token drafts next.
            new = self.keep(state, tokens, verified, accepted)
        return new, accepted.n_keep

    def _captured_step(self, state: DecodeState, clock: PhaseClock):
        """`step` with acceptance, the cache keep and the next draft inside the static step
        (docs/decoder.md#captured-drafting); only the accepted-length bookkeeping here. The
        first step of a batch drafts outside (nothing drafted it yet), and so does the step
        after sequences left the batch."""
        if state.draft is None:
            state.draft = self.draft(state, clock)
        with clock("draft"):
            mask, positions = self.verifier.layout(state.valid, state.next_pos)
        with clock("verify"):
            start = state.cache.length
            step = CapturedStep(*self.captured(state.cache, state.draft, mask, positions)[2:])
        with clock("update"):
            keep = int(step.n_keep.max())  # the one host read of a step
            for layer in state.cache.layers:
                layer.length = start + keep
            state.valid = torch.cat([state.valid, self._iota(keep)[None] < step.n_keep[:, None]], dim=1)
            state.next_pos = state.next_pos + step.n_keep
            state.root, state.hidden, state.draft = step.bonus, step.hidden, step.draft
        return step.new, step.n_keep

    def keep(self, state: DecodeState, tokens: torch.Tensor, verified: Verified, accepted: Accepted) -> torch.Tensor:
        """Update `state` after a verification of the tree tokens (b, q): the cache keeps, per
        sequence, the root and the accepted nodes (the verifier's `keep`); a sequence that
        accepted fewer than the batch's longest keeps holes, masked out (docs/decoder.md#kv-cache,
        docs/decoder.md#batches-with-holes); the bonus becomes the root. Returns the step's tokens
        (b, D + 1): the accepted nodes, then the bonus."""
        n_keep, bonus, host = accepted.n_keep, accepted.bonus, accepted.host
        start = state.valid.shape[1]
        # only a drafter with a cache of its own reads the whole path; the others draft from
        # the last accepted token
        along_path = state.draft_cache is not None
        hidden = self.verifier.keep(state.cache, start, verified, accepted, along_path=along_path)
        if host is not None:  # the verifier accepted on the host and laid the step out there
            kept = torch.from_numpy(host.kept)
        else:
            # the verifier kept the batch's longest path: its length, read off the cache rather
            # than synchronising on n_keep.max() a second time
            kept = self._iota(state.cache.length - start)[None] < n_keep[:, None]
        if self.eagle:
            self._append_eagle_pairs(state, hidden, tokens.gather(1, accepted.path[:, : kept.shape[1]]), kept)
        state.hidden = self._drafting_hidden(state, hidden, kept, n_keep) if along_path else hidden
        state.valid = torch.cat([state.valid, kept], dim=1)
        state.next_pos = state.next_pos + n_keep
        state.root, state.draft = bonus, None
        if host is not None:
            return torch.from_numpy(host.new)
        new = torch.cat([tokens.gather(1, accepted.path[:, 1:]), bonus[:, None]], dim=1)
        new.scatter_(1, (n_keep - 1)[:, None], bonus[:, None])  # the accepted nodes, then the bonus
        return new

    def _iota(self, n: int) -> torch.Tensor:
        """torch.arange(n) on the decoder's device, as a view of a range kept between steps: a
        step indexes with several, and on a CPU each allocation costs more than its use."""
        if n > self._range.shape[0]:
            self._range = torch.arange(2 * n, device=self.device)
        return self._range[:n]

    def _append_eagle_pairs(self, state: DecodeState, path_features, path_tokens, kept) -> None:
        """An EAGLE draft's pairs of the kept tokens (b, K) into its cache, each kept token with
        the feature of the token before it (the previous root's producer for the root), at that
        feature's position; `state` still as before the step's update (docs/decoder.md#eagle)."""
        keep = kept.shape[1]
        features = torch.cat([state.hidden[:, None], path_features[:, : keep - 1]], dim=1)
        positions = state.next_pos[:, None] - 1 + self._iota(keep)[None]
        append_pairs(self.heads, state.draft_cache, state.draft_valid, features, path_tokens, kept, positions)
        state.draft_valid = torch.cat([state.draft_valid, kept], dim=1)

    def _drafting_hidden(self, state: DecodeState, path_hidden, kept, n_keep) -> torch.Tensor:
        """The hidden state the next step drafts from (b, h) for a drafter with a cache of its
        own, given the hidden states along the accepted path (b, D + 1, h), the kept slots
        (b, K) and the kept counts (b,); `state` still as before the step's update."""
        bi = self._iota(n_keep.shape[0])
        if self.eagle:
            return path_hidden[bi, n_keep - 1]  # the last accepted token drafts next
        # Hydra++: the prefix layer reads the kept tokens' hidden states into its cache, slot for
        # slot as the target's; its output at the last one drafts next (docs/decoder.md#hydra).
        keep = kept.shape[1]
        return self.heads.context_states(
            path_hidden[:, :keep],
            kept,
            state.next_pos[:, None] + self._iota(keep)[None],
            past_valid=state.valid,
            cache=state.draft_cache,
        )[bi, n_keep - 1]

    def _drop_finished(self, state: DecodeState, finished: list[bool]) -> None:
        """Finished sequences leave the batch (they cost nothing afterwards), and so do cache
        slots no remaining sequence may see (holes of dropped rows, shared padding)."""
        if not any(finished):
            return
        idx = torch.tensor([not f for f in finished], device=self.device).nonzero()[:, 0]
        state.rows = state.rows[idx]
        if idx.numel() == 0:
            return
        caches = [c for c in (state.cache, state.draft_cache) if c is not None]
        for cache in caches:
            cache.batch_select_indices(idx)
        state.valid, state.next_pos = state.valid[idx], state.next_pos[idx]
        if state.draft_valid is not None:
            state.draft_valid = state.draft_valid[idx]
        state.root, state.hidden = state.root[idx], state.hidden[idx]
        if state.draft is not None:
            state.draft = state.draft[idx]
        used = state.valid.any(0)
        if not bool(used.all()):
            cols = used.nonzero()[:, 0]
            for cache in caches:
                cache.keep_slots(0, cols[None].expand(idx.numel(), -1))
            state.valid = state.valid[:, cols]
            if state.draft_valid is not None:
                state.draft_valid = state.draft_valid[:, cols]

    # ---- the loop --------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask=None,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        eos_token_id: int | list[int] | None = None,
        seed: int = 0,
    ) -> DecodeResult:
        """Decode up to `max_new_tokens` new tokens for each prompt row of `input_ids` (b, L),
        padded where `attention_mask` (b, L) is 0 (left padding as tokenizers do; any padding
        works). temperature 0: greedy, lossless; > 0: typical acceptance with
        `posterior_threshold` (epsilon) and `posterior_alpha`, root and bonus tokens sampled
        with a torch.Generator seeded with `seed` (deterministic for a seed). A sequence ends
        at an `eos_token_id` (an id or a list of ids; included in its tokens) or after
        `max_new_tokens` tokens, and then leaves the batch."""
        eos = eos_set(eos_token_id)
        if max_new_tokens < 0:
            raise UserError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise UserError(f"temperature: must be >= 0, got {temperature}")
        b = input_ids.shape[0]
        out: list[list[int]] = [[] for _ in range(b)]
        if max_new_tokens == 0:
            none = np.zeros(0)
            return DecodeResult(out, np.zeros((0, b), np.int64), none, none, none, 0.0, np.zeros((0, b), np.int64))
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        rule = AcceptanceRule(temperature, posterior_threshold, posterior_alpha, gen)
        clock = PhaseClock(self.timing, self.device)

        with clock("prefill"):
            # Room for the prompt, the new tokens and one tree: one sequence never grows the
            # cache; ragged acceptance in a batch (holes) may, by doubling.
            capacity = input_ids.shape[1] + max_new_tokens + self.q
            state = self.prefill(input_ids, attention_mask, capacity=capacity, temperature=temperature, generator=gen)
            self._drop_finished(state, emit_roots(out, state.root, max_new_tokens, eos))
        return generation_loop(
            lambda: self.step(state, clock, rule),
            lambda: state.rows,
            lambda finished: self._drop_finished(state, finished),
            out,
            b,
            max_new_tokens,
            eos,
            clock,
        )
