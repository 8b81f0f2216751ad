"""The shape of one decoding step, as the latency model, the operators and the grid see it.

b sequences (`batch_sequences`) each verify q new tokens (`tokens_per_sequence`) over s cached
ones (`context_tokens`): prefill is q = prompt length with s = 0, plain decoding q = 1, tree
verification q = n + 1. `candidates_per_sequence` (None: tree verification) splits each
sequence's q tokens into c candidate sequences that each re-read the context
(docs/performance-model.md#verification-modes); `draft_stages` counts the sequential draft
stages the step runs (None: those its drafter runs); `tensor_parallel_gpus` the GPUs the model is
split over (docs/performance-model.md#tensor-parallelism), and `expert_parallel` whether their
routed experts are spread whole over those GPUs rather than split within each expert
(docs/performance-model.md#expert-parallelism); `tree_verify` whether the q verified
tokens branch (a tree, not a chain of q - 1 drafted tokens), which an engine may verify by a
costlier path (docs/performance-model.md#engine-terms-of-a-speculative-step). Every count may be
a numpy array: they broadcast, so a whole grid of configurations is one step shape.

One frozen value travels through `roofline.latency`, `roofline.ops` and `roofline.grid`
instead of loose arguments, so what a step is grows in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from treeopt.errors import UserError

__all__ = ["GpuSplit", "ONE_GPU", "StepShape", "LOOSE_STEP_KEYWORDS", "step_of"]

# the keyword arguments the latency model's functions also take one by one, and the field each sets
LOOSE_STEP_KEYWORDS = {
    "batch": "batch_sequences",
    "tokens": "tokens_per_sequence",
    "context": "context_tokens",
    "attention": "attention",
    "candidates": "candidates_per_sequence",
    "draft_stages": "draft_stages",
    "tensor_parallel": "tensor_parallel_gpus",
    "tree_verify": "tree_verify",
    "expert_parallel": "expert_parallel",
}


@dataclass(frozen=True)
class GpuSplit:
    """How a model is spread over GPUs: `tensor_parallel_gpus` GPUs (tensor parallelism,
    docs/performance-model.md#tensor-parallelism) and, for an MoE, whether its routed experts are
    spread whole over them (`expert_parallel`, docs/performance-model.md#expert-parallelism)."""

    tensor_parallel_gpus: int = 1
    expert_parallel: bool = False


ONE_GPU = GpuSplit()


@dataclass(frozen=True, eq=False)
class StepShape:
    """One decoding step (or a broadcasting grid of them): counts per step, arrays allowed.

    attention: "fused" (flash attention, scores on chip) or "unfused" (scores written out).
    tree_verify: bool (or a bool array): the verified tokens branch; False: a chain (or plain).
    expert_parallel: bool: the routed experts are spread whole over the tensor-parallel GPUs."""

    batch_sequences: object = 1
    tokens_per_sequence: object = 1
    context_tokens: object = 0
    attention: str = "fused"
    candidates_per_sequence: object = None
    draft_stages: object = None
    tensor_parallel_gpus: int = 1
    tree_verify: object = False
    expert_parallel: bool = False

    def __post_init__(self):
        n = self.tensor_parallel_gpus
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UserError(f"--tensor-parallel: must be an integer >= 1, got {n!r}")
        if not isinstance(self.expert_parallel, bool):
            raise UserError(f"--expert-parallel: must be true or false, got {self.expert_parallel!r}")

    @classmethod
    def of(cls, **where) -> StepShape:
        """A step from the loose keywords batch, tokens, context, attention, candidates,
        draft_stages, tensor_parallel, tree_verify and expert_parallel (LOOSE_STEP_KEYWORDS)."""
        unknown = sorted(set(where) - set(LOOSE_STEP_KEYWORDS))
        if unknown:
            raise TypeError(f"unknown step argument(s): {', '.join(unknown)}")
        return cls(**{LOOSE_STEP_KEYWORDS[k]: v for k, v in where.items()})

    def plain(self) -> StepShape:
        """The same sequences decoding one token each: no candidates, no draft stages, no tree."""
        return replace(self, tokens_per_sequence=1, candidates_per_sequence=None, draft_stages=None, tree_verify=False)

    def with_tokens(self, tokens_per_sequence, candidates_per_sequence=None) -> StepShape:
        """The same sequences verifying another number of tokens (and candidate sequences)."""
        return replace(self, tokens_per_sequence=tokens_per_sequence, candidates_per_sequence=candidates_per_sequence)


def step_of(step: StepShape | None, where: dict) -> StepShape:
    """The step a latency function prices: `step`, or one built from loose keywords (not both)."""
    if step is None:
        return StepShape.of(**where)
    if where:
        raise TypeError(f"pass either a StepShape or loose step arguments, not both ({', '.join(sorted(where))})")
    if not isinstance(step, StepShape):
        raise TypeError(f"step: expected a StepShape, got {type(step).__name__}")
    return step
