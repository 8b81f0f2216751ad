"""The two forms in which the reference decoder verifies a drafted tree, and the acceptance rule
they share (docs/decoder.md#greedy-acceptance, docs/decoder.md#typical-acceptance,
docs/decoder.md#candidate-sequence-verification).

- `TreeVerifier`: one forward over the q = n + 1 tree tokens under the tree mask; a node is
  judged by the base model's distribution at its parent;
- `CandidateVerifier` (IBM's batch expansion): every sequence becomes n rows, one per leaf, each
  the root and its path against its own copy of the context; a row's token j is judged by the
  row's distribution at j - 1. The row with the longest accepted prefix is the tree form's
  accepted path.

A verifier lays out a step's mask and positions (`layout`), runs the forward (`forward`),
chooses the accepted path and the bonus token (`accept`) and keeps the path's cache entries
(`keep`). Everything is vectorised over the batch and the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from calibration.kv_cache import KVCache
from calibration.model_calls import additive_mask, fast_argmax
from treeopt.tree import TreeBuffers

__all__ = [
    "GREEDY",
    "Accepted",
    "AcceptanceRule",
    "CandidateVerifier",
    "TreeVerifier",
    "Verified",
    "HostStep",
    "HostTree",
    "host_greedy_accept",
    "host_tree",
]


@dataclass(frozen=True)
class AcceptanceRule:
    """temperature 0: greedy verification; > 0: typical acceptance with epsilon
    `posterior_threshold` and `posterior_alpha`, bonus tokens drawn with `generator`."""

    temperature: float = 0.0
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


GREEDY = AcceptanceRule()
#: logits dtypes numpy reads (`host_greedy_accept`)
HOST_DTYPES = (torch.float32, torch.float64, torch.float16)


class _Verdicts:
    """The base model's judgement of drafted tokens from its logits (b, m, V) at m positions."""

    def __init__(self, logits: torch.Tensor, rule: AcceptanceRule):
        self.rule = rule
        self.rows = torch.arange(logits.shape[0], device=logits.device)
        if rule.greedy:
            self.pred = fast_argmax(logits)  # (b, m)
        else:
            self.probs = torch.softmax(logits.float() / rule.temperature, dim=-1)  # (b, m, V)
            entropy = -(self.probs * torch.log(self.probs + 1e-5)).sum(-1)  # (b, m)
            self.threshold = torch.clamp(rule.posterior_alpha * torch.exp(-entropy), max=rule.posterior_threshold)

    def accepts(self, tokens: torch.Tensor, parent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Whether each token (b, m) passes the rule at its parent's position (`parent` (m,)),
        and its log-probability there (typical acceptance; None when greedy)."""
        if self.rule.greedy:
            # why: greedy verification is lossless: a token is accepted when it is the base
            # model's own argmax after its parent (docs/decoder.md#greedy-acceptance).
            return tokens == self.pred[:, parent], None
        # why: typical acceptance, Medusa paper section 2.3.1: accept x when
        # p(x) > min(eps, alpha * exp(-H(p))) at the parent (H with Medusa's +1e-5).
        cand_p = self.probs[self.rows[:, None], parent[None], tokens]
        return cand_p > self.threshold[:, parent], torch.log(cand_p)

    def bonus(self, position: torch.Tensor) -> torch.Tensor:
        """The base model's own next token after `position` (b,): its argmax, or a draw."""
        if self.rule.greedy:
            return self.pred[self.rows, position]
        return torch.multinomial(self.probs[self.rows, position], 1, generator=self.rule.generator)[:, 0]


def _longest_accepted(on_path: torch.Tensor, loglik: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen path of a verification: on_path (b, L, D + 1) bool, whether each position of
    each root-to-leaf path (or candidate sequence) passed the acceptance rule (False past the
    path's end); loglik (b, L, D + 1) the log-probability of each position's token (typical
    acceptance) or None (greedy). A path is accepted up to its first rejected position.
    Returns (best (b,) the path kept, n_keep (b,) its accepted length, root included)."""
    accepted = on_path.long().cumprod(-1)
    lengths = accepted.sum(-1)  # (b, L), root included
    n_keep = lengths.max(-1).values
    if loglik is None:
        return lengths.argmax(-1), n_keep  # the first longest path, as Medusa's reference code
    # why: Medusa's reference code takes, among the longest, the most likely path.
    counted = accepted.bool()
    counted[..., 0] = False  # the root's own probability does not count
    path_ll = torch.where(counted, loglik, 0.0).sum(-1)
    path_ll = path_ll.masked_fill(lengths != n_keep[:, None], float("-inf"))
    return path_ll.argmax(-1), n_keep


class Verified(NamedTuple):
    """A verification forward: the base logits and last hidden states of the verified tokens
    (tree: (b, q, ...); candidates: (b, n, D + 1, ...)), the root's hidden state (b, 1, h), and
    the candidate rows' cache (candidates; None for the tree)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    root_hidden: torch.Tensor
    rows_cache: KVCache | None = None


class HostStep(NamedTuple):
    """What greedy acceptance on the host (`host_greedy_accept`) knows besides the path, as
    numpy arrays: new (b, D + 1) the step's tokens (the accepted nodes, then the bonus; valid up
    to n_keep); kept (b, max(n_keep)) the kept slots each sequence may see (False: a hole);
    settled: how many of the kept slots hold their entries already for every sequence (its
    path's first nodes are the tree's first nodes, 0, 1, 2, ...: `KVCache.keep_slots` would copy
    them onto themselves); moved (b, max(n_keep) - settled) the tree indices the slots after
    them take."""

    new: np.ndarray
    kept: np.ndarray
    settled: int
    moved: np.ndarray


@dataclass(frozen=True)
class Accepted:
    """A step's verification outcome per sequence: path (b, D + 1) tree indices of the chosen
    root-to-leaf path, n_keep (b,) = 1 + accepted nodes, last (b,) tree index of the last
    accepted token, bonus (b,) the token after it; row (b,) the chosen candidate row
    (candidate form; None for the tree form); longest: max(n_keep) where it is known on the
    host already (None: read it off n_keep); host: the rest of the step where it was accepted
    on the host (`HostStep`; None elsewhere)."""

    path: torch.Tensor
    n_keep: torch.Tensor
    last: torch.Tensor
    bonus: torch.Tensor
    row: torch.Tensor | None = None
    longest: int | None = None
    host: HostStep | None = None

    @property
    def keep(self) -> int:
        """The batch's longest kept length, max(n_keep)."""
        return int(self.n_keep.max()) if self.longest is None else self.longest


class HostTree(NamedTuple):
    """A tree's buffers as numpy arrays for greedy acceptance on the host, built once per tree
    (`host_tree`). L root-to-leaf rows (the retrieve rows), D the depth."""

    parent: np.ndarray  # (q,) each node's parent, the root its own
    judged: int  # nodes 0..judged-1 hold every parent: only their argmax judges a node
    ancestors: np.ndarray  # (q, q) bool: [k, j] node k is node j or one of its ancestors, not the root
    preference: np.ndarray  # (q,) deeper first, then the earlier first retrieve row: depth (L + 1) + L - row
    first_row: np.ndarray  # (q,) the first retrieve row through each node
    kept_count: np.ndarray  # (q,) depth + 1: the slots a step keeps when a node is its last accepted
    retrieve: np.ndarray  # (L, D + 1) root-to-leaf rows, padded with the root
    columns: np.ndarray  # (L, D + 2, D + 1) the step's tokens by row and kept count: columns of [tokens | bonus]
    in_place: np.ndarray  # (L,) the longest prefix of each row that is the nodes 0, 1, 2, ...
    kept: np.ndarray  # (D + 1, D + 1) bool: row n - 1 is n kept slots, then holes


def host_tree(buffers: TreeBuffers) -> HostTree:
    """`HostTree` of a tree's buffers (`treeopt.tree.tree_buffers`)."""
    ri = buffers.retrieve_indices
    (rows, width), q = ri.shape, len(buffers.depth)
    parent = np.maximum(buffers.parent, 0)
    retrieve = np.maximum(ri, 0)
    ancestors = buffers.attention_mask.T.copy()  # the tree mask's row j: node j and its ancestors
    ancestors[0] = False  # the root is the base model's own token: never judged
    first_row = (ri[:, :, None] == np.arange(q)).any(1).argmax(0)
    # the step's tokens (`TreeDecoder.keep`): the row's nodes after the root, the bonus (column
    # q of [tokens | bonus]) last and at the kept count's place
    columns = np.repeat(np.append(retrieve[:, 1:], np.full((rows, 1), q), axis=1)[:, None], width + 1, axis=1)
    columns[:, np.arange(1, width + 1), np.arange(width)] = q
    return HostTree(
        parent=parent,
        judged=int(parent.max()) + 1,
        ancestors=ancestors,
        preference=buffers.depth * (rows + 1) + rows - first_row,
        first_row=first_row,
        kept_count=buffers.depth + 1,
        retrieve=retrieve,
        columns=columns,
        in_place=np.cumprod(retrieve == np.arange(width), axis=1).sum(1),
        kept=np.tri(width, dtype=bool),
    )


def host_greedy_accept(logits: np.ndarray, tokens: np.ndarray, tree: HostTree):
    """Greedy acceptance (docs/decoder.md#greedy-acceptance) over numpy arrays: logits (b, q, V)
    of the tree tokens (b, q) of `tree`. Returns (path, n_keep, last, bonus, `HostStep`) as
    `TreeVerifier.accept` does.

    Per node rather than per retrieve row: a node is accepted when neither it nor any of its
    ancestors below the root was rejected, and the step's last accepted node is the deepest
    accepted one, on ties the one whose first retrieve row comes first: the node where the
    first longest accepted row ends (`TreeVerifier.accept`'s choice), that row the path. The
    argmax runs over the nodes that are parents, and over the last accepted node's row for the
    bonus: no other row judges anything. On a CPU each of a step's small torch operations
    costs several times its numpy twin (docs/decoder.md#timing-a-step)."""
    pred = logits[:, : tree.judged].argmax(-1)  # (b, judged)
    rejected = tokens != pred[:, tree.parent]
    last = np.where(rejected @ tree.ancestors, -1, tree.preference).argmax(-1)
    best, n_keep = tree.first_row[last], tree.kept_count[last]
    path = tree.retrieve[best]
    rows = np.arange(len(last))
    bonus = logits[rows, last].argmax(-1)
    new = np.append(tokens, bonus[:, None], axis=1)[rows[:, None], tree.columns[best, n_keep]]
    longest = n_keep.max()
    settled = min(int(tree.in_place[best].min()), int(longest))
    step = HostStep(new, tree.kept[n_keep - 1, :longest], settled, path[:, settled:longest])
    return path, n_keep, last, bonus, step


def node_states(hidden: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """hidden (b, q, h) at one tree node per sequence, nodes (b,) -> (b, h)."""
    if hidden.shape[0] == 1:  # why: one sequence: one index_select, no broadcast index (as KVCache.keep_slots)
        return hidden.index_select(1, nodes)[:, 0]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), nodes]


class _TreeTensors:
    """The tree's buffers (`treeopt.tree.tree_buffers`) as tensors on the decoder's device."""

    def __init__(self, buffers: TreeBuffers, dtype: torch.dtype, device: torch.device):
        def t(a):
            return torch.from_numpy(np.array(a, copy=True)).to(device)

        self.dtype, self.device = dtype, device
        self.q = len(buffers.depth)
        self.tree_mask_add = additive_mask(t(buffers.attention_mask), dtype)[None, None]  # (1, 1, q, q)
        # the additive mask's two values (`additive_mask`), made once: a step lays out the
        # cache's part of its mask with one `where`
        self.attend_value = torch.zeros((), dtype=dtype, device=device)
        self.hide_value = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
        self.depth = t(buffers.depth)  # (q,)
        self.parent = t(np.maximum(buffers.parent, 0))  # root -> itself
        ri = buffers.retrieve_indices
        self.retrieve = t(np.maximum(ri, 0))  # (L, D + 1)
        self.retrieve_valid = t(ri >= 0)
        self.candidates = int(ri.shape[0])  # one candidate sequence per leaf
        self.to_device = t


class TreeVerifier(_TreeTensors):
    """Tree verification: one sequence of q tokens under the tree mask (Medusa paper section
    2.1.2). `forward(cache, tokens, mask, positions)` is the model's forward to (logits,
    hidden) over tokens appended to a cache."""

    def __init__(self, buffers: TreeBuffers, forward, dtype: torch.dtype, device: torch.device):
        super().__init__(buffers, dtype, device)
        self.model_forward = forward
        self.appends = self.q  # slots `forward` appends to the cache
        # greedy acceptance on the host where the logits live there (`host_greedy_accept`)
        self.host = host_tree(buffers) if torch.device(device).type == "cpu" else None

    def layout(self, valid: torch.Tensor, next_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The 4D additive mask (b, 1, q, C + q) and the position ids (b, q) of a step: row i
        sees the cache slots its sequence may see (`valid` (b, C)) and its tree ancestors and
        itself, at position root + depth (docs/decoder.md#the-step)."""
        b, c = valid.shape
        cached = torch.where(valid[:, None, None, :], self.attend_value, self.hide_value)  # additive_mask's values
        mask = torch.cat([cached.expand(b, 1, self.q, c), self.tree_mask_add.expand(b, 1, self.q, self.q)], dim=-1)
        return mask, next_pos[:, None] + self.depth

    def forward(self, cache, tokens, mask, positions) -> Verified:
        """One forward over the tree tokens (b, q), appended to `cache`."""
        logits, hidden = self.model_forward(cache, tokens, mask, positions)
        return Verified(logits, hidden, hidden[:, :1])

    def accept(self, tokens: torch.Tensor, logits: torch.Tensor, rule: AcceptanceRule = GREEDY) -> Accepted:
        """The longest accepted root-to-leaf path of the tree tokens (b, q) under their base
        logits (b, q, V), each node judged at its parent, and the bonus token after it."""
        if rule.greedy and self.host is not None and logits.dtype in HOST_DTYPES and logits.device.type == "cpu":
            *found, step = host_greedy_accept(logits.numpy(), tokens.numpy(), self.host)
            path, n_keep, last, bonus = (torch.from_numpy(a) for a in found)
            return Accepted(path, n_keep, last, bonus, longest=step.kept.shape[1], host=step)
        verdicts = _Verdicts(logits, rule)
        match, loglik = verdicts.accepts(tokens, self.parent)
        match[:, 0] = True  # the root is the base model's own token
        on_path = match[:, self.retrieve] & self.retrieve_valid  # (b, L, D + 1)
        best, n_keep = _longest_accepted(on_path, None if loglik is None else loglik[:, self.retrieve])
        path = self.retrieve[best]  # (b, D + 1)
        last = path[verdicts.rows, n_keep - 1]
        return Accepted(path, n_keep, last, verdicts.bonus(last))

    def keep(self, cache: KVCache, start: int, verified: Verified, accepted: Accepted, along_path: bool = True):
        """The cache keeps, per sequence, the root and the accepted nodes out of the tree's
        slots start..start+q-1 (path[:, j] is the j-th kept token's tree index). Returns the
        hidden states along the path (b, D + 1, h), or with `along_path` False the last accepted
        token's (b, h)."""
        keep, host = accepted.keep, accepted.host
        if host is None:
            cache.keep_slots(start, start + accepted.path[:, :keep])
        elif host.settled == keep:
            # why: every kept entry is in its slot already (HostStep.settled): nothing to move
            # (docs/decoder.md#kv-cache)
            cache.truncate(start + keep)
        else:  # only the slots past the settled ones move
            cache.keep_slots(start + host.settled, torch.from_numpy(start + host.moved))
        if not along_path:
            return node_states(verified.hidden, accepted.last)
        rows = torch.arange(accepted.path.shape[0], device=self.device)
        return verified.hidden[rows[:, None], accepted.path]


class CandidateVerifier(_TreeTensors):
    """Candidate-sequence verification (docs/decoder.md#candidate-sequence-verification):
    the tree's leaves' root paths as rows, each against its own copy of the context; both forms
    accept the same tokens."""

    def __init__(self, buffers: TreeBuffers, forward, dtype: torch.dtype, device: torch.device):
        super().__init__(buffers, dtype, device)
        self.model_forward = forward
        self.appends = 0  # the rows are written to a cache of their own
        length = self.retrieve.shape[1]  # root + the deepest path
        self.candidate_mask_add = additive_mask(self.to_device(np.tri(length, dtype=bool)), dtype)[None, None]
        self.candidate_depth = torch.arange(length, device=device)
        # the position each row token is judged at, rows flattened: the one before it in its row
        flat = np.arange(self.candidates * length)
        self.row_parent = self.to_device(flat - (flat % length > 0))
        self._expansion: KVCache | None = None  # the candidate rows' cache, reused step to step

    def layout(self, valid: torch.Tensor, next_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The 4D additive mask (b n, 1, D + 1, C + D + 1) and position ids (b n, D + 1) of the
        rows, row i n + j the j-th leaf's path of sequence i, causal over its own tokens."""
        n, length = self.candidates, self.candidate_depth.shape[0]
        rows_valid = valid.repeat_interleave(n, dim=0)
        mask = torch.cat(
            [
                additive_mask(rows_valid, self.dtype)[:, None, None, :].expand(-1, 1, length, -1),
                self.candidate_mask_add.expand(rows_valid.shape[0], 1, length, length),
            ],
            dim=-1,
        )
        return mask, next_pos.repeat_interleave(n)[:, None] + self.candidate_depth[None]

    def forward(self, cache, tokens, mask, positions) -> Verified:
        """Batch expansion: the context of each sequence copied to its n candidate rows, one
        forward over the rows' root-to-leaf tokens; `cache` itself is not written. Logits and
        hidden states are (b, n, D + 1, ...). A path shorter than the deepest is padded at its
        end (with the root token): the causal mask keeps the padding out of the path's own
        attention, and acceptance ignores it."""
        b = tokens.shape[0]
        rows = tokens[:, self.retrieve].reshape(b * self.candidates, -1)  # (b n, D + 1)
        expanded = cache.expanded(self.candidates, rows.shape[1], self._expansion)
        self._expansion = expanded
        logits, hidden = self.model_forward(expanded, rows, mask, positions)
        hidden = hidden.view(b, self.candidates, *hidden.shape[1:])
        logits = logits.view(b, self.candidates, *logits.shape[1:])
        return Verified(logits, hidden, hidden[:, 0, :1], expanded)  # every row starts at the root

    def accept_rows(self, row_tokens: torch.Tensor, logits: torch.Tensor, rule: AcceptanceRule = GREEDY):
        """Verification of candidate sequences (b, n, D + 1) from their own rows' logits
        (b, n, D + 1, V): a row's token j is judged by the row's distribution at j - 1, with the
        tree form's rule; the rows' padding (past each leaf's depth) never counts.

        Returns (best (b,) the row of the longest accepted prefix (the first on ties, the tree
        form's choice: rows are the tree's retrieve rows in order), n_keep (b,) = 1 + accepted
        tokens, bonus (b,) token after the last accepted one in that row)."""
        b, n, length = row_tokens.shape
        verdicts = _Verdicts(logits.reshape(b, n * length, -1), rule)
        match, loglik = verdicts.accepts(row_tokens.reshape(b, -1), self.row_parent)
        match = match.view(b, n, length)
        match[..., 0] = True  # position 0: the root
        loglik = None if loglik is None else loglik.view(b, n, length)
        best, n_keep = _longest_accepted(match & self.retrieve_valid, loglik)
        return best, n_keep, verdicts.bonus(best * length + n_keep - 1)

    def accept(self, tokens: torch.Tensor, logits: torch.Tensor, rule: AcceptanceRule = GREEDY) -> Accepted:
        """`accept_rows` on the rows of the tree tokens (b, q): the chosen row is the tree
        form's accepted path."""
        best, n_keep, bonus = self.accept_rows(tokens[:, self.retrieve], logits, rule)
        path = self.retrieve[best]
        last = path[torch.arange(path.shape[0], device=self.device), n_keep - 1]
        return Accepted(path, n_keep, last, bonus, row=best)

    def keep(self, cache: KVCache, start: int, verified: Verified, accepted: Accepted, along_path: bool = True):
        """The cache takes the chosen row's new entries (its slots start..start+D); returns the
        hidden states along that row (b, D + 1, h), or with `along_path` False the last accepted
        token's (b, h)."""
        rows = torch.arange(accepted.row.shape[0], device=self.device)
        keep = int(accepted.n_keep.max())
        cache.take_rows(verified.rows_cache, rows * self.candidates + accepted.row, keep)
        if not along_path:
            return verified.hidden[rows, accepted.row, accepted.n_keep - 1]
        return verified.hidden[rows, accepted.row]
