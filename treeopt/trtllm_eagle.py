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
  dynamic_tree_max_topK * max_draft_len`.

Every EAGLE config needs the draft (`speculative_model`, alias `speculative_model_dir`: "Draft
model must be provided for EAGLE"); the two-model path (`eagle3_one_model: false`) is
deprecated for removal in 1.4, so the one-model path is written.
"""

from __future__ import annotations

from treeopt.errors import UserError
from treeopt.tree import Tree

__all__ = ["TRTLLM_EAGLE3_PLACEHOLDER", "trtllm_eagle3_config", "trtllm_dynamic_tree_config"]

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
