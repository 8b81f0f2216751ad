"""IBM's MLP speculator (Wertheimer et al. 2024, "Accelerating Production LLMs with Combined
Token/Embedding Speculators"), in the layout of fms-extras and of vLLM's ``mlp_speculator``
model type (docs/formats.md#mlp-speculator).

Stage i (0-based) keeps a state s (s_0: the base model's last hidden state, normalised
without parameters and scaled by 1/sqrt(2) when ``scale_input``) and reads the token of the
previous stage (the root for stage 0):

    s_{i+1} = GELU(N_i(proj_i(s_i) + (w_e / w_s) · emb_i(token_i)))
    logits_i = head_i(s_{i+1})

with w_s = 0.5^(0.5 / n_predict) and w_e = sqrt((1 - w_s²) · inner_dim / 2) (paper section 3;
the state keeps half of its magnitude from s_0 by the last stage). The paper calls N_i a
LayerNorm; the network IBM ships normalises without subtracting the mean, N(x) = x /
sqrt(mean(x²) + 1e-6) · weight + bias: fms' `LayerNormParameterized` with its default
`use_mean=False`, which fms-extras' `MLPSpeculator` builds and vLLM's `MLPSpeculatorLayerNorm`
reimplements (docs/formats.md#mlp-speculator).

Files: config.json (``model_type: "mlp_speculator"``, ``emb_dim``, ``inner_dim`` (0: emb_dim),
``vocab_size``, ``n_predict``, ``top_k_tokens_per_head``, ``n_candidates``, ``tie_weights``,
``scale_input``) and model.safetensors or pytorch_model.bin with keys ``emb.{i}.weight``,
``proj.{i}.weight``, ``head.{i}.weight``, ``ln.{i}.{weight,bias}`` (optionally prefixed
``speculator.``). With ``tie_weights`` every stage shares emb.0, head.0 and ln.0, and stages
i >= 2 share proj.1.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from calibration.drafters.base import Drafter, DraftState
from calibration.drafters.io import check_state, config_int, load_state, read_config
from treeopt.errors import UserError
from treeopt.fileio import atomic_path, write_json

MODEL_TYPE = "mlp_speculator"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
#: fms-extras' LayerNormParameterized default
LN_EPS = 1e-6


class SpeculatorNorm(nn.Module):
    """fms' `LayerNormParameterized` as IBM's speculator builds it: x / sqrt(mean(x²) + eps),
    no mean subtracted, then `weight` and `bias` when `affine` (the stages' norms; the input
    norm of ``scale_input`` has none)."""

    def __init__(self, dim: int, *, affine: bool = True, eps: float = LN_EPS):
        super().__init__()
        self.eps = eps
        if affine:
            self.weight = nn.Parameter(torch.ones(dim))
            self.bias = nn.Parameter(torch.zeros(dim))
        else:
            self.weight = self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x if self.weight is None else self.weight * x + self.bias


class MLPSpeculator(nn.Module, Drafter):
    kind = "mlp-speculator"
    sequential = True

    def __init__(
        self,
        emb_dim: int,
        inner_dim: int,
        vocab_size: int,
        n_predict: int,
        *,
        scale_input: bool = False,
        top_k_tokens_per_head=None,
        n_candidates: int | None = None,
    ):
        super().__init__()
        inner_dim = inner_dim or emb_dim
        self.hidden_size, self.inner_dim, self.vocab_size = emb_dim, inner_dim, vocab_size
        self.num_heads = self.n_predict = n_predict
        self.num_layers = 1  # one projection per stage
        self.scale_input = scale_input
        self.top_k_tokens_per_head = list(top_k_tokens_per_head or [1] * n_predict)
        self.n_candidates = n_candidates or 1
        self.emb = nn.ModuleList(nn.Embedding(vocab_size, inner_dim) for _ in range(n_predict))
        self.proj = nn.ModuleList(
            nn.Linear(emb_dim if i == 0 else inner_dim, inner_dim, bias=False) for i in range(n_predict)
        )
        self.head = nn.ModuleList(nn.Linear(inner_dim, vocab_size, bias=False) for _ in range(n_predict))
        self.ln = nn.ModuleList(SpeculatorNorm(inner_dim) for _ in range(n_predict))
        self.input_norm = SpeculatorNorm(emb_dim, affine=False)
        # why: paper section 3: the weights keep half the state's magnitude from s_0 by the
        # last stage, in expectation
        self.state_weight = 0.5 ** (0.5 / n_predict)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) * inner_dim / 2)

    # ---- the drafter interface: a node's state is (s, its own token) ------------------------

    def begin(self, hidden: torch.Tensor, root: torch.Tensor) -> DraftState:
        if self.scale_input:
            hidden = self.input_norm(hidden) / math.sqrt(2)
        return (hidden, root)

    def depth_logits(self, state: DraftState, depth: int) -> tuple[torch.Tensor, DraftState]:
        s, token = state
        # the weighted sum w_s·proj(s) + w_e·emb divided by w_s, as fms-extras adds it: the norm
        # takes out the scale but for its eps, and the published network is the one to match
        a = self.proj[depth](s) + self.emb[depth](token) * (self.emb_weight / self.state_weight)
        s = nn.functional.gelu(self.ln[depth](a))
        return self.head[depth](s), (s,)

    def child_state(self, carry: DraftState, depth: int, tokens: torch.Tensor) -> DraftState:
        return (carry[0], tokens)

    # ---- files ------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path, *, device=None, dtype=None, num_heads: int | None = None) -> MLPSpeculator:
        path = Path(path)
        config, config_file = read_config(path, "an MLP speculator config")
        if config.get("model_type") != MODEL_TYPE:
            raise UserError(f"{config_file}: model_type {config.get('model_type')!r}, expected {MODEL_TYPE!r}")
        emb_dim = config_int(config, config_file, "emb_dim", minimum=1)
        inner_dim = config_int(config, config_file, "inner_dim", minimum=0, default=0)
        vocab = config_int(config, config_file, "vocab_size", minimum=1)
        n_predict = config_int(config, config_file, "n_predict", minimum=1)
        topk = config.get("top_k_tokens_per_head")
        if topk is not None and (
            not isinstance(topk, list) or len(topk) != n_predict or not all(isinstance(k, int) and k >= 1 for k in topk)
        ):
            raise UserError(
                f"{config_file}: top_k_tokens_per_head must list {n_predict} positive integers, got {topk!r}"
            )
        n_candidates = config.get("n_candidates")
        if n_candidates is not None:
            n_candidates = config_int(config, config_file, "n_candidates", minimum=1)
        stages = n_predict if num_heads is None else num_heads
        if not 1 <= stages <= n_predict:
            raise UserError(f"--num-heads: {path} holds {n_predict} stages, asked for {num_heads}")
        state = {k.removeprefix("speculator."): v for k, v in load_state(path, *WEIGHTS).items()}
        if config.get("tie_weights"):
            state = _untie(state, n_predict)
        model = cls(
            emb_dim,
            inner_dim,
            vocab,
            n_predict,
            scale_input=bool(config.get("scale_input")),
            top_k_tokens_per_head=topk,
            n_candidates=n_candidates,
        )
        model.load_state_dict(check_state(path, model.state_dict(), state))
        if stages < n_predict:
            model.truncate(stages)
        return model.to(device=device, dtype=dtype).eval()

    def truncate(self, stages: int) -> None:
        """Keep the first `stages` stages (the weights of w_s, w_e stay those of n_predict)."""
        for name in ("emb", "proj", "head", "ln"):
            setattr(self, name, nn.ModuleList(list(getattr(self, name))[:stages]))
        self.num_heads = stages
        self.top_k_tokens_per_head = self.top_k_tokens_per_head[:stages]

    def save_pretrained(self, path, *, dtype=torch.bfloat16, tie_weights: bool = False) -> None:
        """config.json + model.safetensors; with `tie_weights` only the shared weights are
        written (emb.0, head.0, ln.0, proj.0, proj.1), as IBM's tied checkpoints hold them."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        if tie_weights:
            state = {k: v for k, v in state.items() if _is_tied_source(k)}
        with atomic_path(path / WEIGHTS[0]) as tmp:
            save_file(state, str(tmp))
        write_json(
            path / "config.json",
            {
                "architectures": ["MLPSpeculatorPreTrainedModel"],
                "model_type": MODEL_TYPE,
                "emb_dim": self.hidden_size,
                "inner_dim": self.inner_dim,
                "vocab_size": self.vocab_size,
                "n_predict": self.n_predict,
                "top_k_tokens_per_head": self.top_k_tokens_per_head,
                "n_candidates": self.n_candidates,
                "tie_weights": tie_weights,
                "scale_input": self.scale_input,
            },
        )


def _is_tied_source(key: str) -> bool:
    """Whether a key is kept by a tied checkpoint (`_untie` fills the others from it)."""
    name, index = key.split(".")[:2]
    return index == "0" or (name == "proj" and index == "1")


def _untie(state: dict, n_predict: int) -> dict:
    """Fill the stages of a tied checkpoint from the weights they share."""
    state = dict(state)
    for i in range(1, n_predict):
        for key, source in (
            (f"emb.{i}.weight", "emb.0.weight"),
            (f"head.{i}.weight", "head.0.weight"),
            (f"ln.{i}.weight", "ln.0.weight"),
            (f"ln.{i}.bias", "ln.0.bias"),
            (f"proj.{i}.weight", "proj.1.weight"),
        ):
            if key not in state and source in state:
                state[key] = state[source]
    return state
