"""`treeopt decode`: run the reference tree decoder on prompts and show what it did."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import click
import numpy as np
import torch

from calibration.captured_drafting import DRAFTING_MODES, captured_refusal
from calibration.data import load_prompts
from calibration.decoder import TreeDecoder, cut_tree
from calibration.greedy import greedy_decode
from calibration.model_calls import synchronizer
from calibration.models import load_model
from calibration.random_model import random_token_ids
from calibration.speculative import SpeculativeDecoder, decoder_for
from calibration.static_steps import uses_static
from calibration.threads import torch_threads
from treeopt.app.random_weights import check_random_bench, load_random, random_model
from treeopt.cli.options import DRAFTER_OPTION, TOPK, AtLeast, FiniteAtLeast, dtype_option, random_weights_option
from treeopt.drafter_cost import MAX_HEADS
from treeopt.errors import UserError
from treeopt.tree import load_tree

NON_NEGATIVE = FiniteAtLeast(0.0)


def _label(tree) -> str:
    return tree.name if tree.name.startswith("tree") else f"tree {tree.name}"


def _note(msg: str) -> None:
    click.echo(f"treeopt: {msg}", err=True)


@click.command("decode")
@click.option(
    "--model",
    "model_name",
    metavar="demo|PATH",
    default="demo",
    show_default=True,
    help="'demo' (the bundled model) or a local transformers model directory.",
)
@click.option("--heads", metavar="PATH", default=None, help="Medusa heads directory (default: MODEL/heads).")
@DRAFTER_OPTION
@click.option(
    "--num-heads",
    metavar="K",
    type=AtLeast(1, MAX_HEADS),
    default=None,
    help="Use this many of the Medusa heads the weights hold [default: the heads config's medusa_num_heads].",
)
@click.option(
    "--tree",
    "tree_spec",
    metavar="TREE",
    default="mc_sim_7b_63",
    show_default=True,
    help="Reference tree name, JSON file, or literal like '[[0], [0, 0], [1]]'. Nodes "
    "deeper than the heads or with ranks >= --topk are cut off (with a note).",
)
@click.option("--prompt", "prompts", metavar="TEXT", multiple=True, help="Prompt text (repeatable).")
@click.option(
    "--data",
    metavar="FILE",
    default=None,
    help="Prompts from a file: 'demo', JSON lines ({\"prompt\": ...}), a text file or a "
    "directory (cut into --prompt-tokens pieces).",
)
@click.option(
    "--max-prompts", metavar="N", type=AtLeast(1), default=4, show_default=True, help="With --data: first N prompts."
)
@click.option(
    "--prompt-tokens",
    metavar="N",
    type=AtLeast(1),
    default=128,
    show_default=True,
    help="With --data: prompt length in tokens.",
)
@click.option("--max-new-tokens", metavar="N", type=AtLeast(1), default=64, show_default=True)
@click.option(
    "--batch-size",
    metavar="B",
    type=AtLeast(1),
    default=1,
    show_default=True,
    help="Prompts decoded together (left padded).",
)
@click.option(
    "--temperature",
    metavar="T",
    type=NON_NEGATIVE,
    default=0.0,
    show_default=True,
    help="0: greedy (lossless); > 0: typical acceptance, sampled root/bonus tokens.",
)
@click.option(
    "--posterior-threshold",
    metavar="EPS",
    type=NON_NEGATIVE,
    default=0.09,
    show_default=True,
    help="Typical acceptance epsilon.",
)
@click.option(
    "--posterior-alpha",
    metavar="ALPHA",
    type=NON_NEGATIVE,
    default=0.3,
    show_default=True,
    help="Typical acceptance alpha.",
)
@click.option("--topk", metavar="K", type=TOPK, default=10, show_default=True, help="Candidates per head.")
@click.option(
    "--seed", metavar="N", type=AtLeast(0), default=0, show_default=True, help="Sampling seed (temperature > 0)."
)
@click.option("--device", metavar="DEV", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N, mps.")
@dtype_option()
@click.option(
    "--threads",
    type=AtLeast(1),
    default=None,
    help="torch CPU threads [default: 1 for models under 100M parameters, else torch's].",
)
@click.option(
    "--compare", is_flag=True, help="Also run plain greedy decoding: speed ratio and whether the tokens match."
)
@click.option(
    "--graphs/--no-graphs",
    default=None,
    help="Verification steps in static shapes, captured as CUDA graphs on CUDA [default: on CUDA, off elsewhere]; "
    "--no-graphs: the eager forward, to compare (docs/decoder.md#static-shape-steps).",
)
@click.option(
    "--drafting",
    type=click.Choice(DRAFTING_MODES),
    default=None,
    help="captured: greedy steps accept, keep and draft the next tree inside the static step (captured as one "
    "CUDA graph on CUDA); separate: each a phase of its own [default: captured where steps are captured as CUDA "
    "graphs and the drafter allows it] (docs/decoder.md#captured-drafting).",
)
@random_weights_option()
def decode_cmd(
    model_name,
    heads,
    drafter,
    num_heads,
    tree_spec,
    prompts,
    data,
    max_prompts,
    prompt_tokens,
    max_new_tokens,
    batch_size,
    temperature,
    posterior_threshold,
    posterior_alpha,
    topk,
    seed,
    device,
    dtype,
    threads,
    compare,
    graphs,
    drafting,
    random_weights,
):
    """Decode prompts with Medusa tree decoding; print the text and the tokens per step. With
    --random-weights: --max-prompts prompts of --prompt-tokens random token ids, printed as ids."""
    if random_weights and (prompts or data):
        raise UserError(
            f"{'--prompt' if prompts else '--data'}: with --random-weights the prompts are random token ids "
            "(--max-prompts of --prompt-tokens each)"
        )
    if bool(prompts) == bool(data) and not random_weights:
        raise UserError("give prompts with --prompt or --data (one of them)")
    if compare and temperature > 0:
        raise UserError("--compare: needs --temperature 0 (greedy decoding is the reference)")
    if drafting == "captured" and graphs is False:
        raise UserError("--drafting captured: needs static-shape steps (leave out --no-graphs)")
    numbers = (max_new_tokens, batch_size, temperature, posterior_threshold, posterior_alpha, topk, seed)
    settings = DecodeSettings(*numbers, compare, graphs, drafting)

    tree = load_tree(tree_spec)  # validated before the model loads: bad trees fail fast
    if random_weights:
        random = random_model(model_name, heads=heads, drafter=drafter, num_heads=num_heads, seed=seed)
        positions = prompt_tokens + max_new_tokens + tree.depth
        check_random_bench(random, device, dtype, batch=min(batch_size, max_prompts), positions=positions)
        loaded = load_random(random, device, dtype)
    else:
        loaded = load_model(model_name, heads, device=device, dtype=dtype, num_heads=num_heads, drafter=drafter)
    source = PromptSource(prompts, data, max_prompts, prompt_tokens, loaded.model.config.vocab_size, seed)
    with torch_threads(loaded.model, loaded.device, threads):
        _decode(loaded, tree, source, settings)


@dataclass(frozen=True)
class PromptSource:
    """Where `treeopt decode`'s prompts come from: `prompts` texts, or the file `data` cut into
    `max_prompts` prompts of `prompt_tokens` tokens; for a model without a tokenizer (random
    weights), `max_prompts` prompts of `prompt_tokens` token ids below `vocab` drawn with `seed`."""

    prompts: tuple[str, ...]
    data: str | None
    max_prompts: int
    prompt_tokens: int
    vocab: int = 0
    seed: int = 0


@dataclass(frozen=True)
class DecodeSettings:
    """How `treeopt decode` decodes (its options of the same names)."""

    max_new_tokens: int
    batch_size: int
    temperature: float
    posterior_threshold: float
    posterior_alpha: float
    topk: int
    seed: int
    compare: bool
    graphs: bool | None = None  # --graphs/--no-graphs (None: static shapes on CUDA only)
    drafting: str | None = None  # --drafting (None: captured where steps are CUDA graphs)


@dataclass
class _Decoded:
    """Every batch's `DecodeResult`, the new tokens per prompt, and with --compare plain
    greedy's seconds and tokens and whether its tokens were the same."""

    results: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    plain_s: float = 0.0
    plain_tokens: int = 0
    same: bool = True


def _decoder(loaded, tree, settings: DecodeSettings):
    """The reference decoder (`decoder_for`) with its verification steps run as --graphs says
    (docs/decoder.md#static-shape-steps); a draft model's own passes always run eagerly."""
    if getattr(loaded.heads, "kind", "") != "draft-model":
        return TreeDecoder(
            loaded.model, loaded.heads, tree, topk=settings.topk, graphs=settings.graphs, drafting=settings.drafting
        )
    if settings.drafting == "captured":
        raise UserError(f"--drafting captured: {captured_refusal(loaded.heads, 'tree')}")
    decoder = decoder_for(loaded.model, loaded.heads, tree, topk=settings.topk)
    if not uses_static(settings.graphs, loaded.device):
        decoder.td.runner, decoder.td.steps = None, "eager"  # the target's eager forward
    return decoder


def _decode(loaded, tree, source: PromptSource, settings: DecodeSettings) -> None:
    tok = loaded.tokenizer
    token_lists = _token_lists(tok, source)
    tree = _fitted_tree(loaded, tree, token_lists, source, settings)
    decoder = _decoder(loaded, tree, settings)
    speculative = isinstance(decoder, SpeculativeDecoder)
    click.echo(
        f"model {loaded.name} on {loaded.device} {str(loaded.dtype).replace('torch.', '')}, "
        f"{torch.get_num_threads()} torch thread(s); "
        f"{_label(tree)}: {tree.size} nodes, depth {tree.depth}, topk {settings.topk}; "
        f"{_mode(settings, speculative)}; {len(token_lists)} prompt(s), batch size {settings.batch_size}; "
        f"{(decoder.td if speculative else decoder).steps} steps"
    )
    decoded = _generate(loaded, decoder, token_lists, settings, speculative)
    if tok is None:
        _note("random weights: the prompts are random token ids and the output is meaningless; shown as ids")
    for i, (prompt_ids, new) in enumerate(zip(token_lists, decoded.outputs)):
        click.echo(f"\n=== sequence {i + 1}: prompt ({len(prompt_ids)} tokens) ===")
        click.echo(_text(tok, prompt_ids, skip_special_tokens=True))
        click.echo(f"=== generated ({len(new)} tokens) ===")
        click.echo(_text(tok, new, skip_special_tokens=False))
    _print_summary(decoded, settings.compare)


def _text(tok, ids, *, skip_special_tokens: bool) -> str:
    """Token ids as text, or as ids where there is no tokenizer (random weights)."""
    if tok is None:
        return " ".join(map(str, ids))
    return tok.decode(ids, skip_special_tokens=skip_special_tokens)


def _token_lists(tok, source: PromptSource) -> list[list[int]]:
    if tok is None:  # random weights (calibration.random_model)
        return random_token_ids(source.vocab, source.max_prompts, source.prompt_tokens, source.seed)
    if source.data:
        pset = load_prompts(source.data, tok, prompt_tokens=source.prompt_tokens, max_prompts=source.max_prompts)
        return [list(p) for p in pset.token_ids]
    token_lists = []
    for i, text in enumerate(source.prompts):
        ids = list(tok(text, add_special_tokens=True)["input_ids"])
        if not ids:
            raise UserError(f"--prompt #{i + 1}: tokenizes to nothing")
        token_lists.append(ids)
    return token_lists


def _fitted_tree(loaded, tree, token_lists, source: PromptSource, settings: DecodeSettings):
    """`tree` cut to the drafter's depth and --topk (with a note when that drops nodes), after
    checking that the sequences fit the model's positions."""
    k = loaded.heads.num_heads
    cut = cut_tree(tree, k, settings.topk)
    # as calibrate refuses them: positions beyond the model's are garbage, not an error, in torch
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    longest = max(len(t) for t in token_lists) + settings.max_new_tokens + cut.depth
    if limit and longest > limit:
        raise UserError(
            f"{_prompt_options(source)}/--max-new-tokens: sequences of up to "
            f"{longest} positions (prompt, new tokens and the tree's depth {cut.depth}) exceed the "
            f"model's {limit} positions"
        )
    if cut.size != tree.size:
        _note(f"{_label(tree)} cut to {k} heads and top-{settings.topk}: {tree.size} -> {cut.size} nodes")
    return cut


def _prompt_options(source: PromptSource) -> str:
    """The options that set the prompts' lengths."""
    if source.data:
        return "--data/--prompt-tokens"
    return "--prompt" if source.prompts else "--prompt-tokens"


def _mode(settings: DecodeSettings, speculative: bool) -> str:
    temp, seed = settings.temperature, settings.seed
    if temp == 0:
        return "greedy"
    if speculative:
        return f"rejection sampling (T={temp:g}, seed={seed})"
    eps, alpha = settings.posterior_threshold, settings.posterior_alpha
    return f"typical (T={temp:g}, eps={eps:g}, alpha={alpha:g}, seed={seed})"


def _padded(batch_lists, pad: int, device):
    """Left-padded ids and mask (b, L) of token lists."""
    length = max(len(t) for t in batch_lists)
    ids = torch.full((len(batch_lists), length), pad, dtype=torch.long)
    mask = torch.zeros((len(batch_lists), length), dtype=torch.long)
    for i, t in enumerate(batch_lists):
        ids[i, length - len(t) :] = torch.tensor(t)
        mask[i, length - len(t) :] = 1
    return ids.to(device), mask.to(device)


def _generate(loaded, decoder, token_lists, settings: DecodeSettings, speculative: bool) -> _Decoded:
    """Decode the prompts batch by batch (and with --compare, plain greedy beside)."""
    tok = loaded.tokenizer
    eos = tok.eos_token_id if tok is not None else None
    pad = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else (eos if eos is not None else 0)
    # a draft model verifies by rejection sampling: the target's distribution, no typical-acceptance knobs
    rule = (
        {}
        if speculative
        else {"posterior_threshold": settings.posterior_threshold, "posterior_alpha": settings.posterior_alpha}
    )
    max_new, decoded = settings.max_new_tokens, _Decoded()
    for start in range(0, len(token_lists), settings.batch_size):
        ids, mask = _padded(token_lists[start : start + settings.batch_size], pad, loaded.device)
        res = decoder.generate(
            ids,
            mask,
            max_new_tokens=max_new,
            temperature=settings.temperature,
            eos_token_id=eos,
            seed=settings.seed + start,
            **rule,
        )
        decoded.results.append(res)
        decoded.outputs += res.tokens
        if settings.compare:
            t0 = time.perf_counter()
            ref = greedy_decode(loaded.model, ids, mask, max_new_tokens=max_new, eos_token_id=eos)
            synchronizer(loaded.device)()
            decoded.plain_s += time.perf_counter() - t0
            decoded.plain_tokens += sum(len(r) for r in ref)
            decoded.same &= ref == res.tokens
    return decoded


def _print_summary(decoded: _Decoded, compare: bool) -> None:
    results = decoded.results
    accepted = np.concatenate([r.accepted[r.accepted > 0] for r in results])
    steps = sum(r.steps for r in results)
    n_tokens = sum(len(t) for t in decoded.outputs)
    click.echo("")
    if accepted.size:
        values, counts = np.unique(accepted, return_counts=True)
        hist = ", ".join(f"{v}: {c}" for v, c in zip(values, counts))
        click.echo(
            f"tokens per step: {accepted.mean():.3f} (mean over {accepted.size} sequence-steps"
            f" in {steps} steps; +1 token per sequence from the prefill)"
        )
        click.echo(f"tokens per step histogram (tokens: sequence-steps): {hist}")
    else:
        click.echo("tokens per step: - (every sequence ended at its first token)")
    draft = sum(float(r.draft_s.sum()) for r in results)
    verify = sum(float(r.verify_s.sum()) for r in results)
    update = sum(float(r.update_s.sum()) for r in results)
    prefill = sum(r.prefill_s for r in results)
    total = draft + verify + update + prefill
    step_total = draft + verify + update
    if step_total > 0:
        click.echo(
            f"time: {total:.3f} s = prefill {prefill:.3f} s + {steps} steps {step_total:.3f} s "
            f"({1e3 * step_total / max(steps, 1):.2f} ms/step: draft {100 * draft / step_total:.1f}%, "
            f"verify {100 * verify / step_total:.1f}%, update {100 * update / step_total:.1f}%); "
            f"{n_tokens / total:.1f} tokens/s"
        )
    if compare:
        plain_rate = decoded.plain_tokens / decoded.plain_s
        click.echo(
            f"plain greedy: {decoded.plain_s:.3f} s, {plain_rate:.1f} tokens/s; tree decoding "
            f"{(n_tokens / total) / plain_rate:.2f}x; identical to plain greedy: "
            f"{'yes' if decoded.same else 'NO'}"
        )
        if not decoded.same:
            sys.exit(1)
