"""SGLang's own checks of a speculative server's flags, transcribed (docs/engines.md#sglang-server-checks).

SGLang does not install on a CPU machine without CUDA in the suite's time, so its argument
checks are transcribed, as of release v0.5.23, from `_handle_eagle_family` in
python/sglang/srt/arg_groups/speculative_hook.py (the version whose page-size rule names
`_PAGE_TREE_SPEC_BACKENDS`; an earlier one, sgl-project/sglang d9ccf6a7, allows only flashinfer
and fa3 there and has no rejection-sampling check) and `adaptive_unsupported_reason` in
python/sglang/srt/speculative/adaptive_spec_params.py (sgl-project/sglang 13d3f642):

- topk > 1 with the `trtllm_mha` attention backend: refused ("trtllm_mha backend only supports
  topk = 1 for speculative decoding");
- `--speculative-use-rejection-sampling`: EAGLE/EAGLE3 only, and topk must be 1;
- topk > 1 with `--page-size` > 1: only the flashinfer, fa3 and triton backends;
- topk = 1: `--speculative-num-draft-tokens` is reset to steps + 1 (a warning, not a refusal);
- `--speculative-adaptive` with topk > 1: adaptive steps are switched off with a warning and the
  static triple runs.
"""

from __future__ import annotations

__all__ = ["PAGE_TREE_BACKENDS", "sglang_refusal", "sglang_warnings"]

#: the attention backends that draft a tree (topk > 1) over pages of more than one token
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")


def sglang_refusal(
    algorithm: str,
    topk: int,
    *,
    attention_backend: str | None = None,
    page_size: int = 1,
    rejection_sampling: bool = False,
) -> str | None:
    """The error SGLang raises at start for these flags, None when it starts. `attention_backend`
    None: not given (SGLang picks one per GPU and model; give the one the server runs to check
    the backend rules)."""
    if attention_backend == "trtllm_mha" and topk > 1:
        return "trtllm_mha backend only supports topk = 1 for speculative decoding"
    if rejection_sampling:
        if algorithm not in ("EAGLE", "EAGLE3"):
            return f"--speculative-use-rejection-sampling is only supported for EAGLE / EAGLE3 / NEXTN, not {algorithm}"
        if topk != 1:
            return "--speculative-use-rejection-sampling requires --speculative-eagle-topk=1"
    if topk > 1 and page_size > 1 and attention_backend is not None and attention_backend not in PAGE_TREE_BACKENDS:
        return (
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on {', '.join(PAGE_TREE_BACKENDS)}; "
            f"got attention_backend={attention_backend!r}"
        )
    return None


def sglang_warnings(steps: int, topk: int, num_draft_tokens: int, *, adaptive: bool = False) -> list[str]:
    """What SGLang changes with a warning instead of refusing: the draft tokens of a chain, and
    adaptive steps with topk > 1."""
    out = []
    if topk == 1 and num_draft_tokens != steps + 1:
        out.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when topk == 1")
    if adaptive and topk != 1:
        out.append(f"speculative_adaptive disabled: speculative_eagle_topk={topk} (only topk=1 is supported)")
    return out
