"""EAGLE-3 and EAGLE-1/2 drafts (Li et al. 2024, "EAGLE: Speculative Sampling Requires
Rethinking Feature Uncertainty"; Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration
of Large Language Models via Training-Time Test") in both published layouts
(docs/formats.md#eagle-drafts; docs/decoder.md#eagle).

A draft is one decoder layer (`calibration.drafters.eagle_layer`) with a KV cache of its own.
Its input at a position is a pair: the base model's feature there and the embedding of the
token after it. EAGLE-3's feature is ``fc`` over the base model's hidden states at three
auxiliary layers (3·target_hidden -> hidden, first depth only); later depths feed back the
draft's own pre-norm output. EAGLE-1/2's feature is the base model's last hidden state, and
``fc`` joins every pair. Logits: EAGLE-3 ``lm_head(norm(out))`` over the draft vocabulary, whose
id i is the target id ``i + d2t[i]``; EAGLE-1/2 the base model's lm_head on the output.

The drafter interface (`calibration.drafters.base`) keeps per node: the pair's h, the token,
its position, the sequence it belongs to, how many context slots it sees, and the keys and
values of its own path; the context's keys and values (the draft's cache of the pairs before
the root) are set per batch with `read_context` (calibration) or `set_context` (decoder), and
each node attends to its sequence's context slots plus its path, one batched call per depth.

Layouts: the authors' (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``/``t2d`` in
pytorch_model.bin or model.safetensors; EAGLE-1/2: ``layers.0.*``, ``fc``) and the
speculators/vLLM one (``layers.0.*``; config ``speculators_model_type``,
``transformer_layer_config``, ``draft_vocab_size``, ``target_hidden_size``,
``eagle_aux_hidden_state_layer_ids``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from calibration.drafters.base import Drafter, DraftState
from calibration.drafters.eagle_layer import EagleLayer, EagleShape, check_aux_layers, read_shape, rotary_for
from calibration.drafters.io import check_state, load_state, read_config
from treeopt.drafter_cost import EAGLE_KINDS, eagle_kind
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, write_json

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
#: the deepest depth an EAGLE draft drafts by default (SGLang's and vLLM's EAGLE-3 examples
#: draft 3-7 steps; the authors' tree is 6 deep)
DEFAULT_MAX_DEPTH = 8
KINDS = EAGLE_KINDS


def _normalise_keys(state: dict) -> dict:
    """The file's keys -> this module's: the authors' ``midlayer.`` is ``layers.0.``; a
    ``model.`` prefix (a state dict taken from a whole model) is dropped; ``t2d`` is not kept
    (it is d2t's inverse)."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("model.")
        if key.startswith("midlayer."):
            key = "layers.0." + key.removeprefix("midlayer.")
        if key != "t2d":
            out[key] = value
    return out


class EagleDrafter(nn.Module, Drafter):
    """An EAGLE-3 (``kind`` "eagle3") or EAGLE-1/2 ("eagle") draft (module doc)."""

    sequential = True

    def __init__(
        self, shape: EagleShape, *, vocab_size: int, target_hidden_size: int, aux_layer_ids=(), max_depth: int
    ):
        """`aux_layer_ids`: EAGLE-3's auxiliary layers, checked against the base model
        (`check_aux_layers`)."""
        super().__init__()
        self.kind = "eagle3" if shape.eagle3 else "eagle"
        self.shape = shape
        self.num_heads = int(max_depth)
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(target_hidden_size)  # the base model's, as every drafter states it
        self.draft_hidden_size = shape.hidden_size
        self.aux_layer_ids = tuple(aux_layer_ids) if shape.eagle3 else ()
        h = shape.hidden_size
        self.embed_tokens = nn.Embedding(vocab_size, h)
        self.layers = nn.ModuleList([EagleLayer(shape)])
        self.rotary_emb = rotary_for(shape)
        if shape.eagle3:
            self.draft_vocab_size = shape.draft_vocab_size or vocab_size
            self.fc = nn.Linear(len(self.aux_layer_ids) * target_hidden_size, h, bias=False)
            self.norm = LlamaRMSNorm(h, eps=shape.rms_norm_eps)
            self.lm_head = nn.Linear(h, self.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        else:
            self.draft_vocab_size = vocab_size
            self.fc = nn.Linear(2 * h, h, bias=True)
            self.lm_head = nn.Linear(h, vocab_size, bias=False)  # the base model's, set on loading
        self.set_context(None)

    # ---- features and logits --------------------------------------------------------------

    def features(self, hidden_states, last_hidden: torch.Tensor) -> torch.Tensor:
        """The base feature per position from one forward of the base model with
        ``output_hidden_states``: EAGLE-3 the auxiliary layers' inputs side by side
        (`check_aux_layers`), EAGLE-1/2 the last hidden state."""
        if not self.shape.eagle3:
            return last_hidden
        return torch.cat([hidden_states[i] for i in self.aux_layer_ids], dim=-1)

    @property
    def draft_to_target(self) -> torch.Tensor:
        """(draft vocabulary,) the target id of each draft id: ``i + d2t[i]``."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits (..., target vocabulary) of pre-norm outputs: the draft vocabulary's logits
        at their target ids, -inf at target ids the draft cannot propose (vLLM's
        ``compute_logits``), so a rank counts in target ids."""
        if not self.shape.eagle3:
            return self.lm_head(out)
        draft = self.lm_head(self.norm(out))
        if self.draft_vocab_size == self.vocab_size and not bool(self.d2t.any()):
            return draft
        full = draft.new_full((*draft.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.draft_to_target] = draft
        return full

    def pair_forward(self, h, tokens, positions, past_k, past_v, mask):
        """The layer on pairs (h (N, q, .), tokens (N, q)) at `positions` (N, q), seeing the
        keys/values `past_k`/`past_v` (N, kv, P, d) and each other under `mask` (N, q, P + q):
        (pre-norm outputs, new keys, new values)."""
        emb = self.embed_tokens(tokens)
        cos_sin = self.rotary_emb(emb, positions)
        if self.shape.eagle3:
            return self.layers[0]((emb, h), None, cos_sin, past_k, past_v, mask)
        x = self.fc(torch.cat([emb, h], dim=-1))
        return self.layers[0](x, x, cos_sin, past_k, past_v, mask)

    def first_state(self, feature: torch.Tensor) -> torch.Tensor:
        """The h of a pair at the first depth: EAGLE-3's fc over the auxiliary states."""
        return self.fc(feature) if self.shape.eagle3 else feature

    # ---- the draft's cache of the context ---------------------------------------------------

    def set_context(self, context) -> None:
        """`context`: (keys, values (B, kv, C, d), valid (B, C) bool, positions) of the draft's
        cache, or None (no context); positions: each root pair's (B,) for `begin` (the
        decoder), the pairs' (B, C) for `begin_at` (the calibration, which gives its own)."""
        self._context = context

    def context_pass(self, feature, next_tokens, valid, positions):
        """The draft over the pairs (feature_t, token_{t+1}) of B sequences (B, T, ...), each
        seeing the valid pairs up to itself (causal): returns (pre-norm outputs (B, T, h),
        keys, values (B, kv, T, d)). A padding pair sees itself, so no row is empty."""
        b, t = valid.shape
        causal = torch.ones((t, t), dtype=torch.bool, device=valid.device).tril()
        mask = (causal[None] & valid[:, None, :]) | torch.eye(t, dtype=torch.bool, device=valid.device)[None]
        kv, d = self.shape.num_key_value_heads, self.shape.head_dim
        empty = feature.new_zeros((b, kv, 0, d))
        return self.pair_forward(self.first_state(feature), next_tokens, positions, empty, empty, mask)

    def read_context(self, feature, next_tokens, valid, positions) -> None:
        """The context of a teacher-forced calibration: the draft's keys of every pair; a row
        then begins at column c seeing the pairs before c (`begin_at`)."""
        _, key, value = self.context_pass(feature, next_tokens, valid, positions)
        self.set_context((key, value, valid, positions))

    # ---- the drafter interface: (h, token, position, sequence, context end, path keys, values)

    def begin_at(self, feature, root, seq, ctx_end, positions) -> DraftState:
        """The root's state: the pair (feature, root) at `positions`, of context row `seq`,
        seeing its context slots before `ctx_end`."""
        kv, d = self.shape.num_key_value_heads, self.shape.head_dim
        empty = feature.new_zeros((len(root), kv, 0, d))
        return (self.first_state(feature), root, positions, seq, ctx_end, empty, empty)

    def begin(self, hidden: torch.Tensor, root: torch.Tensor) -> DraftState:
        n = len(root)
        seq = torch.arange(n, device=root.device)
        if self._context is None:
            zeros = torch.zeros(n, dtype=torch.long, device=root.device)
            return self.begin_at(hidden, root, seq, zeros, zeros)
        key, _, _, next_pos = self._context
        ends = torch.full((n,), key.shape[2], dtype=torch.long, device=root.device)
        return self.begin_at(hidden, root, seq, ends, next_pos)

    def depth_logits(self, state: DraftState, depth: int) -> tuple[torch.Tensor, DraftState]:
        h, tokens, positions, seq, ctx_end, path_k, path_v = state
        n, d = len(tokens), path_k.shape[2]
        if self._context is None:
            ctx_k = ctx_v = path_k[:, :, :0]
            seen = torch.zeros((n, 0), dtype=torch.bool, device=tokens.device)
        else:
            key, value, valid, _ = self._context
            ctx_k, ctx_v = key[seq], value[seq]
            slots = torch.arange(key.shape[2], device=tokens.device)
            seen = valid[seq] & (slots[None] < ctx_end[:, None])
        own = torch.ones((n, d + 1), dtype=torch.bool, device=tokens.device)
        mask = torch.cat([seen, own], dim=1)[:, None]  # (n, 1, C + d + 1)
        past_k, past_v = torch.cat([ctx_k, path_k], 2), torch.cat([ctx_v, path_v], 2)
        out, key, value = self.pair_forward(h[:, None], tokens[:, None], positions[:, None], past_k, past_v, mask)
        out = out[:, 0]
        carry = (out, h, positions, seq, ctx_end, torch.cat([path_k, key], 2), torch.cat([path_v, value], 2))
        return self.logits(out), carry

    def child_state(self, carry: DraftState, depth: int, tokens: torch.Tensor) -> DraftState:
        # why carry[0]: a later depth reads the draft's own output, not the first depth's fc
        # (docs/decoder.md#eagle)
        out, _, positions, seq, ctx_end, path_k, path_v = carry
        return (out, tokens, positions + 1, seq, ctx_end, path_k, path_v)

    # ---- files ------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path,
        *,
        kind: str,
        base_config,
        lm_head_weight: torch.Tensor,
        input_embeddings: torch.Tensor,
        device=None,
        dtype=None,
        max_depth: int | None = None,
    ) -> EagleDrafter:
        """The draft in `path` for the base model of `base_config` (its lm_head and input
        embeddings fill what the file does not hold); one-line refusals for a draft whose
        shapes do not fit the base model."""
        path = Path(path)
        config, config_file = read_config(path, "an EAGLE draft config", "EAGLE draft")
        shape = read_shape(config, config_file, eagle3=kind == "eagle3")
        text = base_config.get_text_config() if hasattr(base_config, "get_text_config") else base_config
        vocab, target_hidden = int(lm_head_weight.shape[0]), int(text.hidden_size)
        _check_sizes(shape, config_file, vocab, target_hidden)
        aux = check_aux_layers(shape.aux_layer_ids, int(text.num_hidden_layers), config_file) if shape.eagle3 else ()
        state = _normalise_keys(load_state(path, *WEIGHTS))
        drafter = cls(
            shape,
            vocab_size=vocab,
            target_hidden_size=target_hidden,
            aux_layer_ids=aux,
            max_depth=DEFAULT_MAX_DEPTH if max_depth is None else max_depth,
        )
        if not shape.eagle3 or "embed_tokens.weight" not in state:
            # why: vLLM shares the base model's embedding with an EAGLE-1/2 draft always, with
            # an EAGLE-3 draft when the file holds none (docs/formats.md#eagle-drafts)
            if shape.hidden_size != target_hidden:
                raise UserError(
                    f"{path}: weights lack 'embed_tokens.weight', and the base model's embedding is "
                    f"{target_hidden} wide, not the draft's {shape.hidden_size}"
                )
            state["embed_tokens.weight"] = input_embeddings.detach().to("cpu")
        if not shape.eagle3:
            state["lm_head.weight"] = lm_head_weight.detach().to("cpu")
            if "fc.bias" not in state:  # vLLM's EAGLE-1 fc has no bias
                state["fc.bias"] = torch.zeros(shape.hidden_size)
        elif "d2t" not in state:
            if drafter.draft_vocab_size != vocab:
                raise UserError(f"{path}: weights lack 'd2t' (a draft vocabulary of {drafter.draft_vocab_size} ids)")
            state["d2t"] = torch.zeros(vocab, dtype=torch.long)
        expected = {k: v for k, v in drafter.state_dict().items() if not k.startswith("rotary_emb.")}
        drafter.load_state_dict(check_state(path, expected, state), strict=False)
        if shape.eagle3:
            targets = drafter.draft_to_target
            if int(targets.min()) < 0 or int(targets.max()) >= vocab:
                bad = int(((targets < 0) | (targets >= vocab)).nonzero()[0, 0])
                raise UserError(
                    f"{path}: d2t maps draft id {bad} to target id {int(targets[bad])}, outside the model's "
                    f"vocabulary of {vocab}"
                )
        return drafter.to(device=device, dtype=dtype).eval()


def save_eagle3(drafter: EagleDrafter, path, *, dtype=torch.bfloat16, with_embedding: bool = False) -> None:
    """An EAGLE-3 draft in the speculators/vLLM layout (config.json + model.safetensors, keys
    ``layers.0.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``); the embedding only when
    `with_embedding` (else the base model's is shared, vLLM's rule)."""
    shape = drafter.shape
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {
        k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu()).contiguous()
        for k, v in drafter.state_dict().items()
        if not k.startswith("rotary_emb.") and (with_embedding or k != "embed_tokens.weight")
    }
    t2d = torch.zeros(drafter.vocab_size, dtype=torch.bool)
    t2d[drafter.draft_to_target.cpu()] = True
    state["t2d"] = t2d
    with atomic_path(path / WEIGHTS[0]) as tmp:
        save_file(state, str(tmp))
    layer = {
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": shape.rms_norm_eps,
        "hidden_act": shape.hidden_act,
        "vocab_size": drafter.vocab_size,
        **shape.rope,
    }
    write_json(
        path / "config.json",
        {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer,
            "draft_vocab_size": drafter.draft_vocab_size,
            "norm_before_residual": shape.norm_before_residual,
            "target_hidden_size": drafter.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(drafter.aux_layer_ids),
        },
    )


def _check_sizes(shape: EagleShape, config_file, vocab: int, target_hidden: int) -> None:
    """One line for a draft made for another base model, before any module is built."""
    declared = shape.target_hidden_size or shape.hidden_size
    if declared != target_hidden:
        name = "target_hidden_size" if shape.target_hidden_size else "hidden_size"
        raise UserError(f"{config_file}: {name} {declared}, but the model's hidden size is {target_hidden}")
    if not shape.eagle3 and shape.hidden_size != target_hidden:
        raise UserError(f"{config_file}: an EAGLE-1/2 draft must be as wide as the model ({target_hidden})")
    if shape.vocab_size is not None and shape.vocab_size != vocab:
        raise UserError(f"{config_file}: vocab_size {shape.vocab_size}, but the model's vocabulary is {vocab}")
    if shape.draft_vocab_size is not None and shape.draft_vocab_size > vocab:
        raise UserError(
            f"{config_file}: draft_vocab_size {shape.draft_vocab_size} is larger than the model's vocabulary {vocab}"
        )


__all__ = ["DEFAULT_MAX_DEPTH", "EagleDrafter", "KINDS", "eagle_kind", "save_eagle3"]
