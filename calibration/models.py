"""Load a base model with its drafter (Medusa heads, Hydra heads or an MLP speculator): the
bundled demo, or a user's local checkpoint."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from calibration.demo_files import DEMO_MODEL_DIR
from calibration.drafters import (
    DRAFTER_SUBDIRS,
    Drafter,
    MedusaDrafter,
    find_drafter_dir,
    load_drafter,
)
from calibration.model_calls import attention_refusal, with_supported_attention
from calibration.model_checks import check_config, check_loading_info, quiet_load_report
from treeopt.dtypes import TORCH_NAMES, normalize_dtype
from treeopt.errors import UserError, first_line
from treeopt.layout import default_heads_dir

#: below this many base-model parameters a CPU run uses one torch thread unless told otherwise:
#: per-operator overhead bounds such models (docs/performance-model.md#measured-on-the-development-machine)
SMALL_MODEL_PARAMS = 100_000_000
#: the canonical dtype names (`treeopt.dtypes`) a model can run in, as torch dtypes
TORCH_DTYPES = {name: getattr(torch, TORCH_NAMES[name]) for name in ("fp32", "bf16", "fp16")}


@dataclass
class LoadedModel:
    model: torch.nn.Module  # a transformers causal LM, eval mode
    heads: Drafter  # the drafter: MedusaDrafter, HydraHeads or MLPSpeculator
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    # random weights drawn with this seed (calibration.random_model); None: a checkpoint's
    random_seed: int | None = None


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device: unknown device '{name}' (use cpu, cuda, cuda:N, mps or auto)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device: '{name}' asked for but CUDA is not available here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device: '{name}' asked for but MPS is not available here")
    return device


#: CPU flags (/proc/cpuinfo) of a CPU that multiplies bfloat16 natively
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 natively: one of `BF16_CPU_FLAGS` among the words of
    `cpuinfo` (default: /proc/cpuinfo; False where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    return bool(set(BF16_CPU_FLAGS) & set(cpuinfo.split()))


def resolve_dtype(name: str, device: torch.device, *, cpuinfo: str | None = None) -> torch.dtype:
    """The torch dtype for `--dtype` (any spelling `treeopt.dtypes` accepts, or auto). The one
    rule of auto, for every command: bfloat16 on a CPU that multiplies it natively
    (`cpu_has_fast_bf16` of `cpuinfo`), else float32; bfloat16 on CUDA, float16 where the GPU
    lacks bf16; float16 on MPS."""
    # why bf16 on such a CPU: there, as on a GPU, a step is bound by streaming the weights, so
    # a few more verified tokens are nearly free and trees pay (docs/statistics.md#the-demos-regime);
    # why fp32 on any other CPU: bf16 GEMMs are converted to float32 there and slower than
    # float32 itself, and fp16 matmuls are emulated on CPUs
    # (docs/performance-model.md#measured-on-the-development-machine)
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "mps":
            return torch.float16
        return torch.bfloat16 if cpu_has_fast_bf16(cpuinfo) else torch.float32
    return TORCH_DTYPES[normalize_dtype(name, what="--dtype", choices=tuple(TORCH_DTYPES))]


def load_model(
    model: str = "demo",
    heads: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    num_heads: int | None = None,
    drafter: str | None = None,
    device_map: str | dict | None = None,
    offload_dir: str | None = None,
) -> LoadedModel:
    """Load `model` ("demo" or a local directory) with transformers and its drafter.

    The drafter comes from `heads` (a drafter directory: Medusa heads, Hydra heads or an MLP
    speculator, its kind read from its config.json, `calibration.drafters.load_drafter`) or,
    when omitted, from the model's own: for `drafter` None or "medusa" the Medusa heads
    (`treeopt.layout.default_heads_dir`: a heads sub-directory, or the model directory itself
    for a Medusa-1.0 full checkpoint), else the sub-directory `calibration.drafters.
    DRAFTER_SUBDIRS` names. `drafter` overrides the detected kind. num_heads: heads (stages)
    used of those the checkpoint holds.
    `device_map` ("auto" or a module -> device dict, as transformers takes it; needs
    accelerate, the ``[scale]`` extra) spreads a model larger than one device over this
    machine's devices; the drafter goes to the device of the last hidden state. `offload_dir`:
    where accelerate keeps the weights a device map puts on "disk".
    """
    hf_logging.disable_progress_bar()
    model_dir = _model_dir(model)
    heads_dir = _drafter_dir(model_dir, heads, drafter)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    base, tokenizer = _load_base(model_dir, torch_dtype, device_map, offload_dir)
    if device_map is None:
        base = base.to(torch_device)
    else:
        torch_device = last_hidden_device(base)
    base = base.eval()
    draft = load_drafter(
        heads_dir,
        kind=drafter,
        device=torch_device,
        dtype=torch_dtype,
        num_heads=num_heads,
        lm_head_weight=base.get_output_embeddings().weight,
        input_embeddings=base.get_input_embeddings().weight,
        base_config=base.config,
    )
    hidden, vocab = base.config.hidden_size, base.get_output_embeddings().weight.shape[0]
    # a draft model has a hidden size of its own: only its vocabulary must match
    if draft.kind != "draft-model" and draft.hidden_size != hidden:
        raise UserError(f"--heads: {heads_dir} has hidden size {draft.hidden_size}, the model {hidden}")
    if draft.vocab_size != vocab:
        raise UserError(f"--heads: {heads_dir} has vocabulary {draft.vocab_size}, the model {vocab}")
    return LoadedModel(base, draft, tokenizer, "demo" if model == "demo" else str(model_dir), torch_device, torch_dtype)


def _model_dir(model: str) -> Path:
    """The directory of `model` ("demo": the bundled one), checked to hold a config.json."""
    if model == "demo":
        if not (DEMO_MODEL_DIR / "config.json").is_file():
            raise UserError(f"demo model missing at {DEMO_MODEL_DIR}: train it with `treeopt demo train`")
        return DEMO_MODEL_DIR
    model_dir = Path(model)
    if not (model_dir / "config.json").is_file():
        raise UserError(f"--model: {model} is not a model directory (no config.json)")
    check_config(model_dir)
    return model_dir


def _drafter_dir(model_dir: Path, heads: str | None, drafter: str | None) -> Path:
    """The drafter's directory: `heads` when given, else the model's own (`load_model`)."""
    if heads:
        heads_dir = Path(heads)
    elif drafter in (None, "medusa"):
        heads_dir = default_heads_dir(model_dir)
    else:
        heads_dir = find_drafter_dir(model_dir, drafter) if drafter in DRAFTER_SUBDIRS else None
    if heads_dir is None:
        what = "Medusa heads" if drafter in (None, "medusa") else f"{drafter} drafter"
        raise UserError(f"--heads: no {what} found in {model_dir}; pass --heads DIR")
    return heads_dir


def _load_base(model_dir: Path, torch_dtype: torch.dtype, device_map, offload_dir: str | None):
    """The base model (on the CPU unless a device map places it) and its tokenizer."""
    sharded = {} if device_map is None else {"device_map": device_map}
    if offload_dir is not None:
        sharded["offload_folder"] = offload_dir
    try:
        with warnings.catch_warnings():
            # why: torch's weights-only unpickler warns about a pickle protocol before it loads or
            # refuses a pytorch_model.bin; the refusal is told on its own in one line
            # (docs/formats.md#output-safety), the warning only adds lines
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            with quiet_load_report():
                base, info = with_supported_attention(
                    lambda **attn: AutoModelForCausalLM.from_pretrained(
                        str(model_dir), dtype=torch_dtype, output_loading_info=True, **attn, **sharded
                    )
                )
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except ImportError as err:  # transformers needs accelerate for a device map
        raise UserError(f"--device-map: {first_line(err)} (pip install 'treeopt[scale]')") from None
    except Exception as err:  # noqa: BLE001 - a damaged model file surfaces as any of torch's or safetensors' errors
        raise UserError(f"--model: cannot load {model_dir}: {first_line(err)}") from None
    check_loading_info(model_dir, info)
    return base, tokenizer


@dataclass(frozen=True)
class ModelSource:
    """A model and its drafter to load, and where they run: `load_model`'s arguments."""

    model: str = "demo"  # "demo" or a model directory
    heads: str | None = None  # the drafter's directory (None: the model's own)
    drafter: str | None = None  # its kind (None: read from its config.json)
    num_heads: int | None = None  # heads used of those the drafter holds (None: its config's)
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | dict | None = None  # spread over this machine's devices (load_model)

    def load(self) -> LoadedModel:
        return load_model(
            self.model,
            self.heads,
            device=self.device,
            dtype=self.dtype,
            num_heads=self.num_heads,
            drafter=self.drafter,
            device_map=self.device_map,
        )


def last_hidden_device(model) -> torch.device:
    """Where a model spread by a device map (``hf_device_map``) computes its last hidden
    state: the device of the module that reads it, the output embeddings (accelerate's
    execution device when the weights live elsewhere, e.g. offloaded)."""
    head = model.get_output_embeddings()
    hook = getattr(head, "_hf_hook", None)
    where = getattr(hook, "execution_device", None)
    if where is None:
        where = head.weight.device
    return torch.device(where if not isinstance(where, int) else f"cuda:{where}")


def tiny_model_for_tests(
    path,
    *,
    vocab: int = 64,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 2,
    num_medusa_heads: int = 3,
    medusa_layers: int = 1,
    seed: int = 0,
) -> Path:
    """Write a random tiny Llama with random Medusa heads (in `path/heads`) and a byte-ish
    tokenizer to `path`, for tests that need a real model and no downloads."""
    hf_logging.disable_progress_bar()

    path = Path(path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config)
    # Larger init than default so random logits are peaked enough for trees to accept tokens.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.3)
    model.save_pretrained(str(path))

    alphabet = " etaoinsrhldcumfpgwybvkxjqz\n.,:()=_0123456789'\"[]#+-*/ETAOINSRHLDCUMFPGWYBVKXJQZ"
    chars = list(dict.fromkeys(alphabet))[: vocab - 3]
    tok = Tokenizer(
        models.WordLevel(
            {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}, unk_token="<pad>"
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )
    fast.save_pretrained(str(path))

    medusa = MedusaDrafter(hidden, vocab, num_medusa_heads, medusa_layers)
    with torch.no_grad():
        for p in medusa.parameters():
            p.normal_(0, 0.3)
    medusa.save_pretrained(path / "heads", base_model_name_or_path=str(path), dtype=torch.float32)
    return path


def check_decodable(model: str) -> None:
    """Refuse, before anything loads, a model the reference tree decoder cannot run: an
    architecture whose code is not in transformers (it would need trust_remote_code, which
    treeopt never runs), or one whose layers do not all attend to the whole sequence
    (`attention_refusal`). The roofline may still price it (`treeopt roofline speedup`)."""
    if model == "demo":
        return
    file = _model_dir(model) / "config.json"
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise UserError(f"--model: cannot read {file}: {first_line(err)}") from None
    if not isinstance(doc, dict):
        raise UserError(f"--model: {file} is not a transformers config.json (not an object)")
    arch = (doc.get("architectures") or [""])[0]
    if arch and not hasattr(transformers, arch):
        raise UserError(
            f"--model {model}: architecture '{arch}' is not in transformers {transformers.__version__} (its code ships "
            "with the checkpoint and needs trust_remote_code, which treeopt does not run): the reference decoder "
            "cannot load it; the roofline still prices it (treeopt roofline speedup / report)"
        )
    try:
        config = AutoConfig.for_model(**doc)
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"--model: {file}: {first_line(err)}") from None
    why = attention_refusal(config)
    if why:
        raise UserError(
            f"--model {model}: {why}; the roofline still prices it (treeopt roofline speedup / report), "
            "treeopt run cannot measure it"
        )
