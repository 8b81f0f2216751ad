"""The serving engines as versioned data: one entry per engine code path and release range, with
what it takes, what it drafts and verifies, and the upstream source (docs/engines.md).

`--engine vllm` (and every bare name) means the newest release treeopt knows; an older one is
asked for explicitly, `--engine vllm@0.20`, and each entry says in one line (`note`) what that
release does with the line. A name the newest release no longer serves (`RETIRED`) is refused
in one line that names the release and what to ask for instead. The rules that act on these
entries (what is drafted, what is exported) are in `treeopt/engines.py`.

Families (`family`): "static" (the engine takes `medusa_choices` as written within its
limits), "uniform" (vLLM's proposer: every node of a level has the same number of children;
`max_children = 1` is a top-1 chain) and "beam" (SGLang's three numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from treeopt.errors import UserError
from treeopt.layout import DRAFTER_KINDS

__all__ = [
    "Engine",
    "ENGINES",
    "ENGINE_NAMES",
    "RETIRED",
    "get_engine",
    "engine_for_drafter",
    "GROUNDED_ALL_DEPTHS",
    "TRTLLM_EXACT_DEPTH",
]

GROUNDED_ALL_DEPTHS = 1 << 30  # left-closed at every depth
TRTLLM_EXACT_DEPTH = 9  # a node finds its parent by the parent's key; keys of <= 8 ranks fit int32


@dataclass(frozen=True)
class Engine:
    """One engine code path in one release range and the family of trees it drafts as written.

    rank_limit: ranks must be < this (None: only the accuracy table's width bounds them).
    depth_limit: depth must be <= this besides the number of draft heads (None: heads only).
    left_closed_depth: at depths 1..left_closed_depth the children of a node are ranks 0..c-1.
    grounded: the children of a node that have children of their own are ranks 0..e-1.
    max_children: uniform family only: the most children per node (1 for top-1 chains).
    release: the releases this entry describes; note: one line on what they do with the line;
    source: the upstream file and commit or PR the rules were read from; schedule: the per-batch
    schedule form the release takes ("vllm", "trtllm" or "" for none; treeopt/schedules.py).
    """

    name: str
    title: str
    family: str  # "static", "uniform" or "beam"
    export_kind: str
    rank_limit: int | None = None
    depth_limit: int | None = None
    left_closed_depth: int = 0
    grounded: bool = False
    max_children: int | None = None
    verification: str = "tree"
    method_name: str = ""  # vLLM's --speculative-config "method", TensorRT-LLM's decoding_type
    release: str = ""
    note: str = ""
    source: str = ""
    schedule: str = ""

    def depth_bound(self, heads: int | None) -> int | None:
        """The deepest level a tree may use with `heads` draft heads."""
        bounds = [b for b in (self.depth_limit, heads) if b is not None]
        return min(bounds) if bounds else None

    def width_bound(self, width: int | None) -> int | None:
        """The ranks a tree may use (< this) with an accuracy table `width` ranks wide."""
        bounds = [b for b in (self.rank_limit, self.max_children, width) if b is not None]
        return min(bounds) if bounds else None


_VLLM_SPEC = "vllm/config/speculative.py (SpeculativeMethod, SpeculativeConfig extra='forbid')"
_VLLM_033 = f"vLLM 0.33.0 wheel: {_VLLM_SPEC}, vllm/v1/spec_decode/dynamic/utils.py"
_TRT_ARGS = "tensorrt_llm/llmapi/llm_args.py (NVIDIA/TensorRT-LLM @ fcd3f316; draft_len_schedule @ 011d0933)"
# why (docs/engines.md#tensorrt-llm-eagle-3): EagleDecodingConfig.validate_eagle_config and
# Eagle3DecodingConfig, read from the stored main-branch llm_args.py whose DecodingBaseConfig has
# the smallest-key draft_len_schedule rule (the same version the schedule rule cites, after 011d0933)
_TRT_EAGLE = (
    "tensorrt_llm/llmapi/llm_args.py (NVIDIA/TensorRT-LLM main after 011d0933: EagleDecodingConfig."
    "validate_eagle_config, check_eagle_choices, Eagle3DecodingConfig)"
)
_SGLANG = "sglang 0.5.23: python/sglang/srt/server_args.py, python/sglang/srt/speculative/eagle_utils.py"

_SGLANG_NOTE = (
    "SGLang 0.5.23 refuses topk > 1 with --attention-backend trtllm_mha, with --page-size > 1 outside "
    "flashinfer/fa3/triton and with --speculative-use-rejection-sampling; adaptive steps and the "
    "overlap scheduler need topk = 1"
)

ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        # why (docs/engines.md#medusa-reference-code): TOPK = 10 indexes the candidates by rank
        Engine(
            "medusa",
            "Medusa reference code (medusa_choices, TOPK = 10)",
            "static",
            "medusa",
            rank_limit=10,
            release="FasterDecoding/Medusa",
            source="medusa/model/utils.py (generate_medusa_buffers)",
        ),
        # why (docs/engines.md#tensorrt-llm): the C++ runtime's prefix keys are exact for ranks
        # <= 15 and depths <= 9; its Python runtime's buffers agree only with depth-1 ranks 0..k-1
        Engine(
            "trtllm",
            "TensorRT-LLM Medusa (--medusa_choices, LLM API speculative_config, legacy TensorRT backend)",
            "static",
            "trtllm",
            rank_limit=16,
            depth_limit=TRTLLM_EXACT_DEPTH,
            left_closed_depth=1,
            release="TensorRT-LLM <= 1.2 (the newest on PyPI, 1.2.1)",
            note=(
                "TensorRT-LLM <= 1.2 runs Medusa on the legacy TensorRT engine backend only (a trtllm-build engine); "
                "its main branch removed Medusa with that backend (PRs #15918, #16369)"
            ),
            source=f"cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp @ b4f2086d; {_TRT_ARGS}",
        ),
        # why (docs/engines.md#tensorrt-llm): DraftTargetDecodingConfig drafts a linear chain
        Engine(
            "trtllm-draft-model",
            "TensorRT-LLM draft model (Draft_Target decoding config, PyTorch backend, a chain)",
            "uniform",
            "trtllm-draft",
            max_children=1,
            method_name="Draft_Target",
            release="TensorRT-LLM 1.x, PyTorch backend",
            note="TensorRT-LLM drafts a separate draft model as a chain of max_draft_len tokens (Draft_Target)",
            source=_TRT_ARGS,
            schedule="trtllm",
        ),
        # why (docs/engines.md#tensorrt-llm-eagle-3): a linear tree is max_draft_len tokens
        Engine(
            "trtllm-eagle3",
            "TensorRT-LLM EAGLE-3 (Eagle3DecodingConfig, PyTorch backend, a chain of max_draft_len)",
            "uniform",
            "trtllm-eagle3",
            max_children=1,
            method_name="Eagle3",
            release="TensorRT-LLM 1.x, PyTorch backend (main)",
            note=(
                "TensorRT-LLM drafts an EAGLE-3 draft as a chain of max_draft_len tokens (one-model "
                "Eagle3DecodingConfig); its dynamic tree (use_dynamic_tree) is --engine trtllm-eagle3-dynamic"
            ),
            source=_TRT_EAGLE,
            schedule="trtllm",
        ),
        # why (docs/engines.md#tensorrt-llm-eagle-3): EAGLE-2's dynamic tree, SGLang's drafting
        # rule with max_total_draft_tokens <= dynamic_tree_max_topK * max_draft_len
        Engine(
            "trtllm-eagle3-dynamic",
            "TensorRT-LLM EAGLE-3 dynamic tree (Eagle3DecodingConfig use_dynamic_tree, PyTorch backend)",
            "beam",
            "trtllm-eagle3-dynamic",
            method_name="Eagle3",
            release="TensorRT-LLM main after 011d0933, PyTorch backend (one-model dynamic-tree worker)",
            note=(
                "TensorRT-LLM builds the tree each step from the draft's scores (dynamic_tree_max_topK nodes expanded "
                "per drafter layer, the max_total_draft_tokens best-scored drafted); one tree per server, no "
                "draft_len_schedule written for it"
            ),
            source=f"{_TRT_EAGLE}; tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py @ 470bb720",
        ),
        # why (docs/engines.md#tensorrt-llm-eagle-3): eagle_choices, deprecated for removal in 1.4
        Engine(
            "trtllm-eagle3-tree@1.3",
            "TensorRT-LLM <= 1.3 EAGLE-3 static tree (Eagle3DecodingConfig eagle_choices)",
            "static",
            "trtllm-eagle3-tree",
            method_name="Eagle3",
            release="TensorRT-LLM <= 1.3",
            note=(
                'TensorRT-LLM deprecated eagle_choices (the static tree) "and will be removed in release 1.4"; '
                "it sets max_draft_len to the tree's depth and max_total_draft_tokens to its nodes"
            ),
            source=_TRT_EAGLE,
        ),
        # why (docs/engines.md#vllm): tree attention is gone since 0.21 (PR #42121)
        Engine(
            "vllm",
            "vLLM >= 0.21 (newest 0.33): a top-1 chain (--speculative-config num_speculative_tokens)",
            "uniform",
            "vllm",
            max_children=1,
            method_name="eagle",
            release="vLLM 0.21-0.33",
            note=(
                "vLLM >= 0.21 drafts and verifies chains only (tree attention removed, PR #42121); "
                'use method "eagle3" for an EAGLE-3 drafter and add it as "model"'
            ),
            source=_VLLM_033,
            schedule="vllm",
        ),
        # why (docs/engines.md#vllm): the EAGLE proposer's speculative_token_tree up to 0.20
        Engine(
            "vllm@0.20",
            "vLLM <= 0.20 EAGLE proposer (--speculative-config speculative_token_tree)",
            "uniform",
            "vllm-tree",
            method_name="eagle",
            release="vLLM <= 0.20.2",
            note=(
                "vLLM <= 0.20 drafts speculative_token_tree only with the TREE_ATTN attention backend "
                "(--attention-backend TREE_ATTN; otherwise a chain) and verifies the flattened draft as a chain "
                "(the tree sampler, PR #22752, was never merged)"
            ),
            source="vllm/v1/spec_decode/eagle.py (num_drafts_per_level), vLLM 0.20.2",
        ),
        Engine(
            "vllm-medusa@0.32",
            "vLLM <= 0.32 Medusa proposer (top-1 chain, num_speculative_tokens)",
            "uniform",
            "vllm",
            max_children=1,
            method_name="medusa",
            release="vLLM <= 0.32",
            note='vLLM <= 0.32 serves Medusa heads as a top-1 chain (method "medusa"); 0.33 removed the method',
            source=_VLLM_SPEC,
        ),
        Engine(
            "vllm-mlp-speculator@0.10",
            "vLLM <= 0.10 MLP-speculator proposer (top-1 chain, num_speculative_tokens)",
            "uniform",
            "vllm",
            max_children=1,
            method_name="mlp_speculator",
            release="vLLM <= 0.10 (V0 engine)",
            note=(
                'vLLM <= 0.10 serves an MLP speculator as a top-1 chain (method "mlp_speculator"); the V1-only '
                'releases 0.11-0.32 fail at engine start ("Unknown speculative decoding method")'
            ),
            source=_VLLM_SPEC,
        ),
        Engine(
            "vllm-draft-model",
            "vLLM draft-model proposer (top-1 chain, num_speculative_tokens)",
            "uniform",
            "vllm",
            max_children=1,
            method_name="draft_model",
            release="vLLM 0.33",
            note='vLLM drafts a separate draft model as a top-1 chain (method "draft_model")',
            source=_VLLM_033,
            schedule="vllm",
        ),
        # why (docs/engines.md#sglang): no static tree, three flags
        Engine(
            "sglang",
            "SGLang EAGLE (--speculative-num-steps/-eagle-topk/-num-draft-tokens)",
            "beam",
            "sglang",
            method_name="EAGLE",
            release="SGLang 0.5.23",
            note=_SGLANG_NOTE,
            source=_SGLANG,
        ),
        # why (docs/engines.md#sglang): a separate draft model runs the same beam rule
        Engine(
            "sglang-standalone",
            "SGLang STANDALONE draft model (--speculative-num-steps/-eagle-topk/-num-draft-tokens)",
            "beam",
            "sglang",
            method_name="STANDALONE",
            release="SGLang 0.5.23",
            note=_SGLANG_NOTE,
            source=_SGLANG,
        ),
        Engine("treeopt", "treeopt's reference decoder (any tree within heads and topk)", "static", "python"),
        # why (docs/engines.md#hydra): grounded heads expand only the first children of a node
        Engine(
            "hydra",
            "Hydra grounded (sequentially dependent) heads",
            "static",
            "python",
            left_closed_depth=GROUNDED_ALL_DEPTHS,
            grounded=True,
            release="Hydra authors' code",
            source="Ankner et al., Hydra (2024), Section 3",
        ),
    )
}

#: Bare names whose code path the newest release no longer has: the one line that says so.
RETIRED = {
    "vllm-medusa": (
        'vLLM 0.33 (the newest) has no "medusa" method; releases <= 0.32 served Medusa heads as a top-1 chain: '
        "ask for --engine vllm-medusa@0.32"
    ),
    "vllm-mlp-speculator": (
        'vLLM 0.33 (the newest) refuses "mlp_speculator", and 0.11-0.32 fail at engine start ("Unknown '
        'speculative decoding method"); only <= 0.10 served it, as a top-1 chain: ask for --engine '
        "vllm-mlp-speculator@0.10"
    ),
}

#: Release aliases: the newest release by its number, as the bare name.
_ALIASES = {
    "vllm@0.33": "vllm",
    "vllm-draft-model@0.33": "vllm-draft-model",
    "sglang@0.5.23": "sglang",
    "sglang-standalone@0.5.23": "sglang-standalone",
    "trtllm@1.2": "trtllm",
}

ENGINE_NAMES = tuple(ENGINES) + tuple(RETIRED) + tuple(_ALIASES)


def get_engine(name: str, *, topk: int | None = None) -> Engine:
    """The engine named `name` (a bare name: the newest release; `name@version`: that one);
    `topk` bounds the ranks of treeopt's own decoder."""
    name = _ALIASES.get(name, name)
    if name in RETIRED:
        raise UserError(f"--engine {name}: {RETIRED[name]}")
    if name not in ENGINES:
        raise UserError(f"--engine: {name!r} is not one of {', '.join(ENGINE_NAMES)}")
    engine = ENGINES[name]
    if name == "treeopt" and topk is not None:
        engine = replace(engine, rank_limit=int(topk))
    return engine


# ---------------------------------------------------------------------------------------------
# Which engine line a drafter can use (docs/engines.md#drafters-and-engines): one rule, used by
# build, check, export, roofline speedup, report, select and run alike.

_NEWEST_VLLM = "vLLM 0.33 serves eagle, eagle3, draft_model, MTP, dflash, ngram and suffix"

_VLLM_FOR = {  # drafter kind -> (entry of the newest vLLM, why)
    "medusa": (None, RETIRED["vllm-medusa"]),
    "mlp-speculator": (None, RETIRED["vllm-mlp-speculator"]),
    "draft-model": ("vllm-draft-model", 'vLLM runs a separate draft model as a top-1 chain (method "draft_model")'),
    "hydra": (None, f"vLLM has no Hydra drafter ({_NEWEST_VLLM})"),
    "eagle3": ("vllm", None),  # vLLM's EAGLE proposer serves EAGLE-3 and EAGLE-1/2 drafts
    "eagle": ("vllm", None),
}
_SGLANG_SERVES = "it serves EAGLE/EAGLE3 drafters, NEXTN (MTP) layers, STANDALONE draft models and NGRAM"


def engine_for_drafter(engine_name: str, drafter_kind: str) -> tuple[str | None, str | None]:
    """The engine to emit for statistics from a `drafter_kind` drafter when `engine_name` was
    asked for, and a one-line note when it differs; (None, note) when that engine cannot serve
    the drafter at all, and treeopt emits no line for it (docs/engines.md#drafters-and-engines)."""
    kind = str(drafter_kind).replace("_", "-")
    if kind not in DRAFTER_KINDS:
        raise UserError(f"drafter: {drafter_kind!r} is not one of {', '.join(DRAFTER_KINDS)}")
    asked = _ALIASES.get(engine_name, engine_name)
    if asked not in RETIRED:
        get_engine(asked)  # the error for an unknown engine
    if asked.startswith("vllm"):
        return _vllm_for(asked, kind)
    if asked.startswith("sglang"):
        return _sglang_for(asked, kind)
    if asked.startswith("trtllm"):
        return _trtllm_for(asked, kind)
    if asked == "medusa" and kind in ("draft-model", "mlp-speculator"):
        return None, f"--engine medusa: the Medusa code runs Medusa heads; a {kind} drafter has none"
    return asked, None


def _trtllm_for(asked: str, kind: str) -> tuple[str | None, str | None]:
    serves = {"draft-model": "trtllm-draft-model", "medusa": "trtllm", "eagle3": "trtllm-eagle3"}
    if kind == "eagle3" and asked in ("trtllm-eagle3-tree@1.3", "trtllm-eagle3-dynamic"):
        return asked, None
    if kind not in serves:
        why = (
            "its PyTorch backend's EAGLE configs run EAGLE-3 drafts"
            if kind == "eagle"
            else f"TensorRT-LLM has no {kind} drafter"
        )
        return None, f"--engine {asked}: {why}; treeopt emits no TensorRT-LLM line"
    if serves[kind] == asked:
        return asked, None
    why = {
        "draft-model": "TensorRT-LLM runs a separate draft model as Draft_Target",
        "medusa": "Medusa heads run as TensorRT-LLM's Medusa decoding",
        "eagle3": "TensorRT-LLM runs an EAGLE-3 draft with Eagle3DecodingConfig",
    }[kind]
    return _differs(asked, serves[kind], why)


def _differs(asked: str, target: str | None, why: str) -> tuple[str | None, str]:
    what = f"treeopt emits --engine {target} instead" if target else "treeopt emits no line for it"
    return target, f"--engine {asked}: {why}; {what}"


def _vllm_for(asked: str, kind: str) -> tuple[str | None, str | None]:
    if asked.endswith("@0.32") and kind == "medusa" or asked.endswith("@0.10") and kind == "mlp-speculator":
        return asked, None
    if "@" in asked and kind == "medusa":
        return _differs(asked, "vllm-medusa@0.32", ENGINES["vllm-medusa@0.32"].note)
    target, why = _VLLM_FOR[kind]
    if target == asked:
        return asked, None
    if target is None:
        return None, f"--engine {asked}: {why}; treeopt emits no vLLM line"
    return _differs(asked, target, why)


def _sglang_for(asked: str, kind: str) -> tuple[str | None, str | None]:
    if kind in ("eagle3", "eagle") and asked == "sglang":
        return asked, None
    if kind == "draft-model":
        if asked == "sglang-standalone":
            return asked, None
        return _differs(
            asked, "sglang-standalone", "SGLang runs a separate draft model as --speculative-algorithm STANDALONE"
        )
    return None, f"--engine {asked}: SGLang has no {kind} drafter ({_SGLANG_SERVES}); treeopt emits no SGLang line"
