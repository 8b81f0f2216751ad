"""What a drafter's work per decoding step is made of, as the roofline charges it
(docs/performance-model.md#drafter-cost): read from the drafter's own config.json in the
layout its authors publish (docs/formats.md), with the base model's hidden size and vocabulary
where the config leaves them out.

- Medusa (``medusa_num_heads``): K parallel heads, each L ResBlocks h x h and a projection
  h x V, all on the same hidden state (Medusa paper section 2.1.1).
- Hydra (``hydra_num_heads``): head k's first block reads [h_t, E(x_{t+1}), ...,
  E(x_{t+k+1})], (k + 2)·h wide, through a linear layer and a residual projection, both
  (k + 2)·h x h with bias; then L - 1 ResBlocks and a biased projection (Hydra paper section
  3). Ungrounded heads read h_t alone. ``prefix-mlp`` adds one decoder layer per step (Hydra++,
  section 4).
- MLP speculator (``model_type: mlp_speculator``): stage i gathers an embedding of width
  ``inner_dim``, projects the state (emb_dim x inner for stage 0, inner x inner after),
  LayerNorm and GELU, and a head inner x V (Wertheimer et al. 2024, section 3).
- EAGLE-3 / EAGLE-1/2 (docs/formats.md#eagle-drafts): each depth is one decoder layer at the
  draft's width over the depth's rows, attending to the draft's own cache of the context and
  the path; EAGLE-3's q, k, v read 2·hidden, its ``fc`` (aux·target_hidden x hidden) runs at the
  first depth only, its ``lm_head`` is hidden x draft vocabulary after a norm; EAGLE-1/2 run
  ``fc`` (2·hidden x hidden) at every depth and the base lm_head. Once per step the accepted
  tokens' pairs go through fc and the layer into the draft's cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from treeopt.errors import UserError
from treeopt.fileio import read_json_input

#: the drafter kinds, as `--drafter` spells them
DRAFTER_NAMES = ("medusa", "hydra", "mlp-speculator", "eagle3", "eagle")
#: the EAGLE kinds: one decoder layer with a cache of its own (docs/decoder.md#eagle)
EAGLE_KINDS = ("eagle3", "eagle")
#: depths an EAGLE draft is charged for by default (calibration.drafters.eagle's default)
EAGLE_DEFAULT_DEPTH = 8

#: the most draft heads anything takes: Medusa trains 5, published drafters at most 10; 64 is far
#: beyond any and keeps a cost grid's size bounded (a million heads priced a step of hours)
MAX_HEADS = 64
#: the most ResBlocks per head: Medusa's heads have 1 (Cai et al. 2024, arXiv:2401.10774, sec. 2.1.1);
#: 64 is far beyond any drafter's
MAX_HEAD_LAYERS = 64
MLP_SPECULATOR_TYPE = "mlp_speculator"
HYDRA_ARCHS = ("mlp", "prefix-mlp")


@dataclass(frozen=True)
class DraftCost:
    """A drafter's shape for the cost model.

    drafter: "medusa", "hydra" or "mlp-speculator". sequential: a depth's guesses depend on
    the path (the drafter runs once per depth on the nodes of the depth above). stages: heads
    (Medusa, Hydra) or stages (MLP speculator). layers: h x h blocks per head (Medusa ResBlocks;
    Hydra counts its widened first block as one of them; the speculator 1). hidden_size: the
    base model's h; inner_size: a stage's width (the speculator's inner_dim, h otherwise).
    grounded: Hydra heads read the path's embeddings. prefix_layer: Hydra++'s extra decoder
    layer, run once per step.
    """

    drafter: str
    sequential: bool
    stages: int
    layers: int
    hidden_size: int
    inner_size: int
    vocab_size: int
    grounded: bool = False
    prefix_layer: bool = False
    #: IBM's candidate form as the speculator's config sets it (`top_k_tokens_per_head`,
    #: `n_candidates`; docs/builders.md#ibms-candidate-form); empty / 0 when not set
    topk_per_stage: tuple[int, ...] = ()
    n_candidates: int = 0
    #: EAGLE's layer (0 for other drafters): attention heads, KV heads, head size, the base
    #: model's hidden size and the auxiliary layers fc reads (EAGLE-3; 0 for EAGLE-1/2)
    attention_heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    target_hidden: int = 0
    aux_layers: int = 0

    def __post_init__(self):
        if self.drafter not in DRAFTER_NAMES:
            raise UserError(f"drafter cost: unknown drafter {self.drafter!r} (one of {', '.join(DRAFTER_NAMES)})")
        for key in ("stages", "layers", "hidden_size", "inner_size", "vocab_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"drafter cost: {key!r} must be a positive integer, got {value!r}")

    @property
    def own_cache(self) -> bool:
        """An EAGLE draft: a decoder layer with a KV cache of its own, fed the accepted tokens
        once per step."""
        return self.drafter in EAGLE_KINDS

    @property
    def eagle_layer_params(self) -> int:
        """Weights of an EAGLE draft's decoder layer and fc (its lm_head apart)."""
        h, i = self.hidden_size, self.inner_size
        nh, nkv, d = self.attention_heads, self.kv_heads, self.head_dim
        eagle3 = self.drafter == "eagle3"
        qkv_in = 2 * h if eagle3 else h
        fc = self.aux_layers * self.target_hidden * h if eagle3 else 2 * h * h + h
        norms = (4 if eagle3 else 1) * h  # input, hidden, post-attention, final / post-attention
        return qkv_in * (nh + 2 * nkv) * d + nh * d * h + 3 * h * i + norms + fc

    def first_input_width(self, stage: int) -> int:
        """Width of the input of stage `stage` (0-based): Hydra's grounded head k reads
        (k + 2)·h; the speculator's stage 0 the base hidden state, later stages their state."""
        if self.drafter == "hydra" and self.grounded:
            return (stage + 2) * self.hidden_size
        if self.drafter == "mlp-speculator":
            return self.hidden_size if stage == 0 else self.inner_size
        return self.hidden_size

    @property
    def params(self) -> int:
        """Weights of the drafter (the prefix layer excluded: it is a base decoder layer)."""
        h, w, v = self.hidden_size, self.inner_size, self.vocab_size
        if self.own_cache:
            # EAGLE-1/2 share the base lm_head; EAGLE-3 has its own over the draft vocabulary
            return self.eagle_layer_params + (h * v if self.drafter == "eagle3" else 0)
        if self.drafter == "mlp-speculator":
            return sum(self.first_input_width(i) * w + 2 * w + w * v + v * w for i in range(self.stages))
        per_head = [(self.layers - 1) * (h * h + h) + h * v for _ in range(self.stages)]
        if self.drafter == "hydra":
            first = [(2 if self.grounded else 1) * (self.first_input_width(k) * h + h) for k in range(self.stages)]
            embed = v * h if self.grounded else 0
            return sum(per_head) + sum(first) + self.stages * v + embed
        return sum(per_head) + self.stages * (h * h + h)

    def describe(self) -> str:
        if self.own_cache:
            target = f", target hidden {self.target_hidden}" if self.target_hidden != self.hidden_size else ""
            return (
                f"{self.drafter}: one decoder layer, hidden {self.hidden_size}{target}, {self.attention_heads} heads "
                f"({self.kv_heads} KV), vocab {self.vocab_size}, {self.stages} depths, sequential, depth by depth"
            )
        unit = "stages" if self.drafter == "mlp-speculator" else "heads"
        mode = "sequential, depth by depth" if self.sequential else "parallel"
        extra = " + a prefix decoder layer" if self.prefix_layer else ""
        width = f", inner {self.inner_size}" if self.inner_size != self.hidden_size else ""
        return (
            f"{self.drafter}: {self.stages} {unit} x {self.layers} layer(s){extra}, hidden {self.hidden_size}"
            f"{width}, vocab {self.vocab_size}, {mode}"
        )


def eagle_kind(config: dict) -> str | None:
    """ "eagle3" or "eagle" when a config.json declares an EAGLE draft, else None: the one rule the
    loader and the pricing share (docs/formats.md#eagle-drafts)."""
    declared = config.get("speculators_model_type")
    if declared in EAGLE_KINDS:
        return declared
    architectures = config.get("architectures")
    names = [str(a).lower() for a in architectures] if isinstance(architectures, list) else []
    if any("eagle3" in a for a in names) or "draft_vocab_size" in config:
        return "eagle3"
    if any("eagle" in a for a in names):
        return "eagle"
    return None


def eagle_cost(
    kind: str,
    layer: dict,
    *,
    target_hidden: int,
    vocab_size: int,
    draft_vocab: int | None,
    aux_layers: int,
    depth: int = EAGLE_DEFAULT_DEPTH,
    source: str = "EAGLE draft config",
) -> DraftCost:
    """The `DraftCost` of an EAGLE draft from its layer's Llama keys (`layer`)."""
    h = _positive(layer, source, "hidden_size")
    heads = _positive(layer, source, "num_attention_heads")
    return DraftCost(
        kind,
        True,
        depth,
        1,
        h,
        _positive(layer, source, "intermediate_size"),
        (draft_vocab or vocab_size) if kind == "eagle3" else vocab_size,
        attention_heads=heads,
        kv_heads=_positive(layer, source, "num_key_value_heads", heads),
        head_dim=int(layer.get("head_dim") or h // heads),
        target_hidden=target_hidden,
        aux_layers=aux_layers if kind == "eagle3" else 0,
    )


def _eagle_cost_from_config(config: dict, kind: str, hidden_size, vocab_size, source: str) -> DraftCost:
    nested = config.get("transformer_layer_config")
    layer = nested if "speculators_model_type" in config and isinstance(nested, dict) else config
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and isinstance(config.get("eagle_config"), dict):
        ids = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    target = config.get("target_hidden_size") or hidden_size or layer.get("hidden_size")
    return eagle_cost(
        kind,
        layer,
        target_hidden=_positive({"target_hidden_size": target}, source, "target_hidden_size"),
        vocab_size=_positive(layer, source, "vocab_size", vocab_size),
        draft_vocab=config.get("draft_vocab_size"),
        aux_layers=len(ids) if isinstance(ids, list) and ids else 3,
        source=source,
    )


def drafter_kind(config: dict) -> str | None:
    """The drafter kind a config.json declares, or None."""
    eagle = eagle_kind(config)
    if eagle is not None:
        return eagle
    if "hydra_num_heads" in config:
        return "hydra"
    if config.get("model_type") == MLP_SPECULATOR_TYPE:
        return "mlp-speculator"
    if "medusa_num_heads" in config:
        return "medusa"
    return None


def _positive(config: dict, source: str, key: str, default=None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{source}: missing or invalid {key!r} (a positive integer), got {value!r}")
    return value


def draft_cost_from_config(
    config: dict, *, hidden_size: int | None = None, vocab_size: int | None = None, source: str = "drafter config"
) -> DraftCost:
    """The `DraftCost` of a drafter config.json's dict; `hidden_size` and `vocab_size` (the
    base model's) fill what the config leaves out (published Medusa configs hold neither)."""
    kind = drafter_kind(config)
    if kind is None:
        raise UserError(
            f"{source}: not a drafter config (no medusa_num_heads, hydra_num_heads or "
            f"model_type {MLP_SPECULATOR_TYPE!r})"
        )
    if kind in EAGLE_KINDS:
        return _eagle_cost_from_config(config, kind, hidden_size, vocab_size, source)
    if kind == "mlp-speculator":
        emb = _positive(config, source, "emb_dim")
        inner = config.get("inner_dim") or emb
        stages = _positive(config, source, "n_predict")
        topk = config.get("top_k_tokens_per_head") or ()
        if not isinstance(topk, (list, tuple)) or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in topk
        ):
            raise UserError(f"{source}: top_k_tokens_per_head must list positive integers, got {topk!r}")
        return DraftCost(
            "mlp-speculator",
            True,
            stages,
            1,
            emb,
            _positive({"inner_dim": inner}, source, "inner_dim"),
            _positive(config, source, "vocab_size", vocab_size),
            topk_per_stage=tuple(topk),
            n_candidates=_positive(config, source, "n_candidates", 1) if topk else 0,
        )
    arch = config.get("hydra_head_arch", "mlp")
    if kind == "hydra" and arch not in HYDRA_ARCHS:
        raise UserError(f"{source}: hydra_head_arch {arch!r} is not supported (one of {', '.join(HYDRA_ARCHS)})")
    dims = {
        "hidden_size": _positive(config, source, "hidden_size", hidden_size),
        "vocab_size": _positive(config, source, "vocab_size", vocab_size),
    }
    if kind == "medusa":
        return DraftCost(
            "medusa",
            False,
            _positive(config, source, "medusa_num_heads"),
            _positive(config, source, "medusa_num_layers", 1),
            dims["hidden_size"],
            dims["hidden_size"],
            dims["vocab_size"],
        )
    grounded = bool(config.get("grounded_heads", True))
    return DraftCost(
        "hydra",
        grounded,
        _positive(config, source, "hydra_num_heads"),
        _positive(config, source, "hydra_num_layers", 1),
        dims["hidden_size"],
        dims["hidden_size"],
        dims["vocab_size"],
        grounded=grounded,
        prefix_layer=arch == "prefix-mlp",
    )


def read_draft_cost(path, *, hidden_size: int | None = None, vocab_size: int | None = None) -> DraftCost:
    """`draft_cost_from_config` of a drafter's config.json (or the directory holding it)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"--drafter-config: {path}: no such file (a drafter's config.json or its directory)")
    config = read_json_input(file, "a drafter config")
    if not isinstance(config, dict):
        raise UserError(f"{file}: expected a JSON object (a drafter config)")
    return draft_cost_from_config(config, hidden_size=hidden_size, vocab_size=vocab_size, source=str(file))


__all__ = [
    "DRAFTER_NAMES",
    "EAGLE_KINDS",
    "eagle_kind",
    "DraftCost",
    "draft_cost_from_config",
    "drafter_kind",
    "eagle_cost",
    "read_draft_cost",
]
