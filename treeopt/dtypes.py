"""Element types by name: the canonical names every package uses, the spellings accepted for
them and their size in bytes (docs/performance-model.md: bytes moved scale with the element
size). numpy only; the mapping to torch dtypes lives with the torch code."""

from __future__ import annotations

from treeopt.errors import UserError

__all__ = ["DTYPE_ALIASES", "DTYPE_BYTES", "TORCH_NAMES", "dtype_bytes", "normalize_dtype", "torch_dtype_name"]

#: canonical name -> bytes per element
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
#: canonical name -> the name of the torch dtype (``getattr(torch, name)``), for the packages
#: that run torch; kept as strings so that the core imports no torch
TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn", "int8": "int8"}
#: accepted spelling (lower case, without a ``torch.`` prefix) -> canonical name; torch's and
#: Hugging Face ``torch_dtype`` names are accepted so that config files and ``str(torch dtype)``
#: normalise directly
DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "float8_e4m3fn": "fp8",
    "int8": "int8",
}


def normalize_dtype(name, *, what: str = "dtype", choices=tuple(DTYPE_BYTES)) -> str:
    """The canonical name of `name` (any accepted spelling, any case, ``torch.`` prefix allowed).

    `choices`: the canonical names the caller can use (all by default). UserError naming `what`
    (the option or file field) when `name` is not a spelling of one of them.
    """
    canonical = DTYPE_ALIASES.get(str(name).strip().lower().removeprefix("torch."))
    if canonical not in choices:
        raise UserError(f"{what}: unknown dtype '{name}' (use one of {', '.join(choices)})")
    return canonical


def dtype_bytes(name) -> int:
    """Bytes per element of a dtype given by any accepted spelling."""
    return DTYPE_BYTES[normalize_dtype(name)]


def torch_dtype_name(dtype) -> str:
    """The name files record for a torch dtype (or its name): torch's own without the prefix,
    "bfloat16" for `torch.bfloat16` (a spelling `normalize_dtype` accepts)."""
    return str(dtype).strip().removeprefix("torch.")
