"""TensorRT-LLM's EAGLE-3 decoding configs (docs/engines.md#tensorrt-llm-eagle-3), as its
`Eagle3DecodingConfig` validates them (tensorrt_llm/llmapi/llm_args.py, NVIDIA/TensorRT-LLM main
after 011d0933: `EagleDecodingConfig.validate_eagle_config`, `check_eagle_choices`,
`validate_speculative_model`; `DecodingBaseConfig` is a StrictBaseModel, so an unknown key is
refused):

- a chain: `max_draft_len` tokens, `max_total_draft_tokens` left out (TensorRT-LLM sets it to
  `max_draft_len`: a linear tree);
- a static tree (`eagle_choices`, deprecated "and will be removed in release 1.4"): every
  choice's parent listed, `max_draft_len` reset to the depth and `max_total_draft_tokens` to the
  number of choices; not with `use_dynamic_tree`;
- the dynamic tree (EAGLE-2's, `use_dynamic_tree`): `max_draft_len` drafter layers > 0,
  `dynamic_tree_max_topK` > 0, and `max_draft_len <= max_total_draft_tokens <=
  dynamic_tree_max_topK * max_draft_len`. Its one-model worker
  (`Eagle3OneModelDynamicTreeWorker`, tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py @
  470bb720) drafts as SGLang's EAGLE worker does: layer 1 the root's top-K children, each later
  layer the K best-scored of the K * K children of the previous layer's K nodes (score: the
  product of the draft's probabilities), every child kept in a history of K + K * K *
  (max_draft_len - 1) nodes, and the `max_total_draft_tokens` best of that history drafted. So
  (max_draft_len, dynamic_tree_max_topK, max_total_draft_tokens) is SGLang's (steps, topk,
  num_draft_tokens - 1) within the narrower bound above (docs/engines.md#tensorrt-llm-eagle-3).

Every EAGLE config needs the draft (`speculative_model`, alias `speculative_model_dir`: "Draft
model must be provided for EAGLE"); the two-model path (`eagle3_one_model: false`) is
deprecated for removal in 1.4, so the one-model path is written.
"""

from __future__ import annotations

from treeopt.errors import UserError
from treeopt.tree import Tree

__all__ = [
    "TRTLLM_EAGLE3_PLACEHOLDER",
    "trtllm_eagle3_config",
    "trtllm_dynamic_tree_config",
    "trtllm_dynamic_fits",
    "trtllm_dynamic_export",
    "trtllm_dynamic_text",
]

#: the draft's directory when the accuracy table does not name it
TRTLLM_EAGLE3_PLACEHOLDER = "<EAGLE-3 draft>"


def _is_chain(tree: Tree) -> bool:
    return tree.size == tree.depth and all(r == 0 for p in tree.paths for r in p)


def _model(drafter: tuple[str, str] | None) -> str:
    return drafter[1] if drafter is not None else TRTLLM_EAGLE3_PLACEHOLDER


def trtllm_eagle3_config(tree: Tree, drafter: tuple[str, str] | None) -> dict:
    """`Eagle3DecodingConfig` for `tree`: a chain as `max_draft_len`, any other tree as static
    `eagle_choices` with `max_draft_len` its depth. `drafter`: (kind, directory) of the draft."""
    config: dict = {"decoding_type": "Eagle3"}
    if _is_chain(tree):
        config["max_draft_len"] = int(tree.size)
    else:
        config["max_draft_len"] = int(tree.depth)
        config["eagle_choices"] = tree.to_choices()
    config["speculative_model_dir"] = _model(drafter)
    config["eagle3_one_model"] = True
    return config


def trtllm_dynamic_fits(nodes: int, steps: int, topk: int) -> bool:
    """Whether TensorRT-LLM's validator takes `nodes` drafted tokens (max_total_draft_tokens)
    for `steps` drafter layers (max_draft_len) of `topk` (dynamic_tree_max_topK); topk 1 is the
    chain of `steps` tokens."""
    return steps >= 1 and topk >= 1 and steps <= nodes <= topk * steps


def trtllm_dynamic_export(triple: tuple[int, int, int], drafter: tuple[str, str] | None) -> dict:
    """`Eagle3DecodingConfig` for SGLang's (steps, topk, num_draft_tokens) triple (the root
    counted in num_draft_tokens, as SGLang does): the dynamic tree of max_draft_len steps,
    dynamic_tree_max_topK topk and num_draft_tokens - 1 drafted tokens; topk 1 drafts the chain of
    `steps` tokens and is written as the chain (the linear-tree worker; docs/engines.md#tensorrt-llm-eagle-3)."""
    steps, topk, tokens = (int(x) for x in triple)
    if topk == 1:
        return {
            "decoding_type": "Eagle3",
            "max_draft_len": steps,
            "speculative_model_dir": _model(drafter),
            "eagle3_one_model": True,
        }
    return trtllm_dynamic_tree_config(steps, topk, tokens - 1, drafter)


def trtllm_dynamic_text(triple: tuple[int, int, int]) -> str:
    """The triple in TensorRT-LLM's names, for check's lines."""
    steps, topk, tokens = (int(x) for x in triple)
    return f"max_draft_len {steps}, dynamic_tree_max_topK {topk}, max_total_draft_tokens {tokens - 1}"


def trtllm_dynamic_tree_config(
    max_draft_len: int, top_k: int, max_total_draft_tokens: int, drafter: tuple[str, str] | None = None
) -> dict:
    """`Eagle3DecodingConfig` for TensorRT-LLM's dynamic tree: `max_draft_len` drafter layers,
    `top_k` nodes expanded per layer, `max_total_draft_tokens` drafted in all; UserError, in
    TensorRT-LLM's terms, for a combination its validator refuses."""
    depth, k, total = int(max_draft_len), int(top_k), int(max_total_draft_tokens)
    if depth <= 0 or k <= 0:
        raise UserError(
            f"TensorRT-LLM dynamic tree: max_draft_len ({depth}) and dynamic_tree_max_topK ({k}) must be > 0"
        )
    if not depth <= total <= k * depth:
        raise UserError(
            f"TensorRT-LLM dynamic tree: max_total_draft_tokens ({total}) must be >= max_draft_len ({depth}) and "
            f"<= dynamic_tree_max_topK * max_draft_len ({k * depth})"
        )
    return {
        "decoding_type": "Eagle3",
        "max_draft_len": depth,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": k,
        "max_total_draft_tokens": total,
        "speculative_model_dir": _model(drafter),
        "eagle3_one_model": True,
    }
