"""The calibration run: measure how often each Medusa head's rank-r proposal is right
(docs/statistics.md, "Labels" and "Per-head normalisation").

Which positions count (the label rule itself: `calibration.labels`):
- labels ``greedy`` (default, self-distillation): the base model generates ``steps`` tokens
  greedily after each prompt (KV cache, batched with left padding); the positions counted are
  those whose next token x_{t+1} is a generated token, t = P-1 .. L-2 (P the prompt length,
  L = P + steps). Head k has a label at t <= L-3-k, i.e. ``steps - 1 - k`` positions per prompt.
  Generation does not stop at EOS (as in Medusa's own script): the greedy continuation past
  EOS is still what greedy verification would accept.
- labels ``data``: the text's own tokens; every position t of the text where the label exists
  (t <= L-3-k for head k), no generation.

Each head is normalised by its own count of labelled positions (``AccuracyTable.positions``).
Rank vectors (one row per position where head 0 has a label, K columns, -1 where head k has no
label) are counted by `calibration.counts.CalibrationCounts`, joint prefix counts included.

The rank vectors themselves are kept too (``CalibrationResult.ranks`` / ``.sequence``, and the
``<output stem>.ranks.npz`` sidecar that `run_calibration` writes beside the table): they let
`treeopt.acceptance.simulate_tokens_per_step` walk the calibration sequences the way the
decoder does. Encoding: ``ranks`` (N, K) int16 (int32 if topk > 32766), one row per counted
position, rows ordered by (prompt, t) with the positions of one prompt consecutive
(t = P-1 .. L-3 for greedy labels, 0 .. L-3 for data labels); ``ranks[i, k]`` = the exact rank
of head k's label when it is < topk, ``topk`` for a miss (rank >= topk), -1 where head k has no
label (the last k positions of a sequence). ``sequence`` (N,) int32 = the prompt's index in the
data set (file order).

Checkpoints (`calibration.checkpoint`) hold the counts so far, the number of prompts done and a
fingerprint of the inputs; ``resume=True`` continues from one and refuses a checkpoint whose
fingerprint differs. Nothing is lost (docs/formats.md, "Calibration checkpoint"): a batch's
counts and the progress marker are committed as one unit with Ctrl-C held back
(`deferred_interrupts`); `run_calibration` removes the checkpoint only after the table and its
sidecar are durably in place, and ``resume=True`` on an output that is already complete for
the same inputs returns it instead of starting over. `run_calibration` holds an output lock for
the whole run, so a second calibration to the same output fails at once.

Many processes (``torchrun --nproc-per-node N -m treeopt calibrate``, `calibration.distributed`):
each process calibrates a contiguous run of whole batches on its own device with its own
checkpoint, the counts are combined with torch.distributed collectives into exactly the
one-process counts, and process 0 writes the outputs (docs/statistics.md, "Counts from many
processes").

Prompts are processed in file order in batches aligned to multiples of ``batch_size`` (so a
resumed run sees the same batches as an uninterrupted one, except the one batch that
``max_prompts`` may have cut).

Reproducibility: same inputs, seed and machine -> byte-identical output. The provenance holds
the date (a day, no time of day) of the run, or of ``SOURCE_DATE_EPOCH`` when that environment
variable is set; it is the only field that varies between runs on different days.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from tqdm import tqdm

import treeopt
from calibration.checkpoint import load_checkpoint, run_id, save_checkpoint
from calibration.counts import CalibrationCounts
from calibration.data import PromptSet, load_prompts
from calibration.demo_files import DEMO_HEADS_DIR
from calibration.distributed import (
    SINGLE,
    Processes,
    all_agree,
    combine_counts,
    process_device,
    process_group,
    processes_from_env,
    rank_checkpoint_path,
    shard_bounds,
    shard_fingerprint,
)
from calibration.drafters.draft_model import ALPHA_MAX_PROMPTS, chain_acceptance
from calibration.labels import (
    LABEL_MODES,
    greedy_continuations,
    label_ranks,
    label_rows,
    pad_token_id,
)
from calibration.models import load_model
from calibration.threads import torch_threads
from treeopt.acceptance import (
    load_rank_vectors,
    rank_vectors_fingerprint,
    rank_vectors_path,
    save_rank_vectors,
)
from treeopt.accuracy import AccuracyTable, load_accuracy
from treeopt.chain import alpha_path
from treeopt.errors import UserError
from treeopt.fileio import atomic_outputs, check_writable, output_lock, refuse_overwriting_inputs
from treeopt.layout import default_heads_dir


class CalibrationInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the counts so far are in `checkpoint` (None if nothing was done)."""

    def __init__(self, checkpoint: Path | None, prompts_done: int):
        super().__init__(f"interrupted after {prompts_done} prompts")
        self.checkpoint = checkpoint
        self.prompts_done = prompts_done


@dataclass(frozen=True)
class CalibrationResult:
    table: AccuracyTable
    counts: CalibrationCounts
    complete: bool  # every prompt of the data set was used
    checkpoint: Path | None  # the checkpoint left on disk (None once complete)
    elapsed_s: float  # wall time of this invocation (not of resumed parts)
    resumed_prompts: int = 0  # prompts already done by the checkpoint this run resumed from
    run_tokens: int = 0  # tokens (prompt + generation) processed by this invocation
    # Rank vectors of every counted position (module doc): (N, K) int16, -1 = no label,
    # topk = miss (rank >= topk), else the exact rank; rows ordered by (prompt, t)
    ranks: np.ndarray | None = None
    sequence: np.ndarray | None = None  # (N,) int32 prompt index (file order) of each row
    fingerprint: dict | None = None  # the inputs (as in the checkpoint)
    already_complete: bool = False  # resumed on an output already complete: nothing was run


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back for the block and deliver it when the block ends.

    For the few statements that must happen together (a batch's counts and the progress
    marker): an interrupt between them would save hits without the prompts that produced them,
    and a resumed run would count the batch twice (docs/formats.md, "Calibration checkpoint").
    Outside the main thread Python raises no KeyboardInterrupt, so there is nothing to hold.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt


def run_date() -> str:
    """YYYY-MM-DD of the run in UTC, or of SOURCE_DATE_EPOCH when set."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        try:
            when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise UserError(f"SOURCE_DATE_EPOCH: not a Unix time: {epoch!r}") from None
    else:
        when = _dt.datetime.now(_dt.timezone.utc)
    return when.date().isoformat()


def tool_versions() -> dict:
    """The provenance fields naming the software that made a table."""
    return {"tool_version": treeopt.__version__, "torch": torch.__version__, "transformers": transformers.__version__}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return str(device)


def _finished_output(output: Path, fingerprint: dict, total: int, *, refuse_other: bool) -> CalibrationResult | None:
    """The result of an output already complete for these inputs (None when `output` is not a
    calibration's complete output for `total` prompts). An output from other inputs is
    refused (UserError) when `refuse_other`, else the run starts over and replaces it."""
    if not output.is_file():
        return None
    theirs = rank_vectors_fingerprint(output)
    if theirs is None:  # no sidecar: not from a calibration, nothing to compare
        return None
    if theirs != fingerprint:
        diff = sorted(k for k in set(theirs) | set(fingerprint) if theirs.get(k) != fingerprint.get(k))
        detail = ", ".join(f"{k}: {theirs.get(k)!r} vs now {fingerprint.get(k)!r}" for k in diff[:3])
        if refuse_other:
            raise UserError(
                f"{output}: already calibrated from other inputs ({detail}); rerun without --resume to replace it"
            )
        print(f"treeopt: {output} was calibrated from other inputs ({detail}); calibrating anew", file=sys.stderr)
        return None
    table = load_accuracy(output)
    prompts_done = table.provenance.get("prompts")
    if prompts_done != total:
        return None
    ranks, sequence = load_rank_vectors(output, table=table)
    counts = CalibrationCounts(
        table.hits.astype(np.int64),
        table.positions.astype(np.int64),
        None if table.joint is None else dict(table.joint),
        prompts_done,
        int(table.provenance.get("tokens", 0)),
        int(table.provenance.get("steps", 0)) * prompts_done,
    )
    counts.rank_chunks, counts.sequence_chunks = [ranks], [sequence]
    print(
        f"treeopt: {output} is already complete for these inputs ({prompts_done} prompts); nothing to do",
        file=sys.stderr,
    )
    return CalibrationResult(
        table, counts, True, None, 0.0, prompts_done, 0, ranks, sequence, fingerprint, already_complete=True
    )


def calibrate(
    loaded,
    prompts: PromptSet,
    *,
    steps: int = 32,
    topk: int = 10,
    labels: str = "greedy",
    batch_size: int = 8,
    max_prompts: int | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 64,
    heads_source: str | None = None,
    seed: int = 0,
    joint: bool = True,
    progress: bool | None = None,
    chunk_elements: int | None = None,
    keep_checkpoint: bool = False,
    finished_output: str | Path | None = None,
    refuse_other_output: bool = False,
    processes: Processes = SINGLE,
) -> CalibrationResult:
    """Calibrate `loaded` (a `calibration.models.LoadedModel`) on `prompts`.

    Returns the accuracy table (hits/positions/joint/provenance) and the raw counts.
    `checkpoint` is the checkpoint file (None: no checkpoints); it is written atomically every
    `checkpoint_every` prompts (at batch boundaries), when the run stops at `max_prompts` short of
    the data, and on Ctrl-C (then `CalibrationInterrupted` is raised); it is removed when the
    whole data set is done, unless `keep_checkpoint`: then it is written complete and left for
    the caller to remove once its outputs are in place (`run_calibration`).
    `finished_output`: with `resume` and no checkpoint, an accuracy table already complete for
    these inputs is returned as is (``already_complete``); one from other inputs is replaced
    (the run starts over), or refused with `refuse_other_output` (`treeopt calibrate --resume`:
    a resume must not silently replace a table made from other inputs).
    `progress`: tqdm on stderr (None = only on a terminal).
    `processes`: this process's place among many (`calibration.distributed`): it calibrates
    its shard of whole batches, keeps its own checkpoint (`rank_checkpoint_path`) and the
    result holds every process's counts combined (each process gets them).
    """
    model, heads = loaded.model, loaded.heads
    vocab = heads.vocab_size
    if labels not in LABEL_MODES:
        raise UserError(f"--labels: must be one of {', '.join(LABEL_MODES)}, got {labels!r}")
    if labels == "greedy" and steps < heads.num_heads + 1:
        raise UserError(
            f"--steps: must be at least {heads.num_heads + 1} (heads + 1) with greedy "
            f"labels so that every head has a label, got {steps}"
        )
    if not 1 <= topk <= vocab:
        raise UserError(f"--topk: must be between 1 and the vocabulary size {vocab}, got {topk}")
    if batch_size < 1:
        raise UserError(f"--batch-size: must be at least 1, got {batch_size}")
    if checkpoint_every < 1:
        raise UserError(f"--checkpoint-every: must be at least 1, got {checkpoint_every}")
    if max_prompts is not None and max_prompts < 1:
        raise UserError(f"--max-prompts: must be at least 1, got {max_prompts}")
    gen_steps = steps if labels == "greedy" else 0
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p) for p in prompts.token_ids) + gen_steps
    if limit and longest > limit:
        raise UserError(f"--prompt-tokens/--steps: sequences of {longest} tokens exceed the model's {limit} positions")
    total = len(prompts) if max_prompts is None else min(max_prompts, len(prompts))
    if labels == "data" and max(len(p) for p in prompts.token_ids[:total]) < heads.num_heads + 2:
        raise UserError(
            f"{prompts.name}: prompts too short for data labels: the last head needs "
            f"texts of at least {heads.num_heads + 2} tokens"
        )

    torch.manual_seed(seed)
    fingerprint = {
        "model": loaded.name,
        "heads": heads_source,
        "data": prompts.name,
        "data_sha256": prompts.sha256,
        "data_format": prompts.data_format,
        "chat_template": prompts.chat_template,
        "prompt_tokens": prompts.prompt_tokens,
        "steps": steps,
        "topk": topk,
        "labels": labels,
        "batch_size": batch_size,
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "joint": joint,
        "seed": seed,
    }
    # this process's prompts [first, end): all of them for one process
    first, end = shard_bounds(total, batch_size, processes.rank, processes.world_size)
    ckpt = rank_checkpoint_path(checkpoint, processes) if checkpoint is not None else None
    ckpt_fingerprint = shard_fingerprint(fingerprint, processes, first, end)
    if resume and ckpt is None:
        raise UserError("--resume: needs a checkpoint file (--checkpoint or -o)")
    counts = CalibrationCounts.zeros(heads.num_heads, topk, joint)
    counts.prompts_done = first
    finished = None
    had_checkpoint = resume and ckpt.exists()
    if had_checkpoint:
        counts = load_checkpoint(ckpt, ckpt_fingerprint)
        if counts.prompts_done > end:
            raise UserError(
                f"{ckpt}: checkpoint already covers {counts.prompts_done} prompts, more than the {end} asked for"
            )
    elif resume and finished_output is not None:
        finished = _finished_output(Path(finished_output), fingerprint, total, refuse_other=refuse_other_output)
    # every process returns the finished output, or none does (the others wait in collectives)
    if all_agree(finished is not None, processes):
        return finished
    if resume and not had_checkpoint:
        print(f"treeopt: no checkpoint at {ckpt}; starting from the beginning", file=sys.stderr)

    pad = pad_token_id(model, loaded.tokenizer)
    start_time = time.perf_counter()
    tokens_at_start, prompts_at_start = counts.tokens, counts.prompts_done
    # many processes: process 0's bar stands for all (the shards are of equal size)
    bar = tqdm(
        total=end - first,
        initial=counts.prompts_done - first,
        unit="prompt",
        file=sys.stderr,
        disable=(True if not processes.is_main else None if progress is None else not progress),
        dynamic_ncols=True,
        desc="calibrate" if not processes.many else f"calibrate (1 of {processes.world_size} processes)",
    )
    last_saved = counts.prompts_done
    try:
        while counts.prompts_done < end:
            lo = counts.prompts_done
            hi = min(end, (lo // batch_size + 1) * batch_size)
            batch = [list(p) for p in prompts.token_ids[lo:hi]]
            if gen_steps:
                gen = greedy_continuations(model, batch, gen_steps, pad_id=pad)
                seqs = [p + g for p, g in zip(batch, gen, strict=True)]
                starts = [len(p) - 1 for p in batch]
            else:
                seqs, starts = batch, [0] * len(batch)
            ranks = label_ranks(model, heads, seqs, starts, pad_id=pad, chunk_elements=chunk_elements)
            # label_ranks' rows follow label_rows: prompt by prompt, t increasing
            row_seq, _, _ = label_rows([len(s) for s in seqs], starts, heads.num_heads)
            update = counts.batch_update(
                ranks, lo + row_seq, prompts_done=hi, tokens=sum(len(s) for s in seqs), generated=gen_steps * len(seqs)
            )
            with deferred_interrupts():  # the batch's counts and prompts_done: one unit
                counts.commit(update)
            bar.update(hi - lo)
            rate = (counts.tokens - tokens_at_start) / max(time.perf_counter() - start_time, 1e-9)
            bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
            if ckpt is not None and hi // checkpoint_every > last_saved // checkpoint_every and hi < end:
                save_checkpoint(ckpt, ckpt_fingerprint, counts)
                last_saved = hi
    except KeyboardInterrupt:
        bar.close()
        saved = None
        if ckpt is not None and counts.prompts_done > first:
            save_checkpoint(ckpt, ckpt_fingerprint, counts)
            saved = ckpt
        raise CalibrationInterrupted(saved, counts.prompts_done) from None
    bar.close()

    if processes.many:
        # this shard's counts stay on disk until the outputs are written: a process that fails
        # in or after the exchange leaves the others' work whole
        if ckpt is not None:
            save_checkpoint(ckpt, ckpt_fingerprint, counts)
        counts = combine_counts(counts, first, processes)
    complete = counts.prompts_done >= len(prompts)
    if ckpt is not None:
        if complete and not keep_checkpoint:
            # many processes: each removes its own once every one has its combined counts
            all_agree(True, processes)
            ckpt.unlink(missing_ok=True)
        elif not processes.many:
            save_checkpoint(ckpt, fingerprint, counts)

    empty = np.flatnonzero(counts.positions == 0)
    if len(empty):
        raise UserError(
            f"{prompts.name}: head {int(empty[0]) + 1} got no labelled position: the "
            f"prompts are too short (data labels need at least {heads.num_heads + 2} tokens)"
        )
    provenance = {
        "source": "treeopt calibrate",
        "model": loaded.name,
        "heads": heads_source,
        "dataset": prompts.name,
        "dataset_sha256": prompts.sha256,
        "data_format": prompts.data_format,
        "chat_template": prompts.chat_template,
        "labels": labels,
        "steps": gen_steps,
        "topk": topk,
        "batch_size": batch_size,
        "prompt_tokens": prompts.prompt_tokens,
        "prompts": counts.prompts_done,
        "positions": int(counts.positions[0]),
        "tokens": counts.tokens,
        "seed": seed,
        "run_id": run_id(fingerprint, counts),
        "rank_ties": "rank = number of logits strictly greater than the label's",
        "date": run_date(),
        **tool_versions(),
        "device": _device_name(loaded.device),
        "dtype": str(loaded.dtype).replace("torch.", ""),
        **({"processes": processes.world_size} if processes.many else {}),
    }
    table = AccuracyTable(
        hits=counts.hits.astype(np.float64),
        positions=counts.positions.astype(np.float64),
        joint=None if counts.joint is None else dict(sorted(counts.joint.items())),
        provenance=provenance,
    )
    rank_vectors, sequence = counts.rank_vectors()
    return CalibrationResult(
        table,
        counts,
        complete,
        None if complete else ckpt,
        time.perf_counter() - start_time,
        prompts_at_start,
        counts.tokens - tokens_at_start,
        rank_vectors,
        sequence,
        fingerprint,
    )


def run_calibration(
    model: str = "demo",
    heads: str | None = None,
    data: str | None = None,
    *,
    output: str | Path | None = None,
    device: str = "auto",
    dtype: str = "auto",
    prompt_tokens: int = 128,
    max_prompts: int | None = None,
    checkpoint: str | Path | None = "auto",
    threads: int | None = None,
    num_heads: int | None = None,
    drafter: str | None = None,
    chat_template: bool = True,
    device_map: str | dict | None = None,
    processes: Processes | None = None,
    **options,
) -> CalibrationResult:
    """Load model, heads and data, calibrate, and save the table to `output` (if given) and
    its rank vectors beside it, ``<output stem>.ranks.npz``
    (`treeopt.acceptance.rank_vectors_path`, `save_rank_vectors`).

    `data`: required for any model but the demo (None: the demo prompts, for the demo only).
    `checkpoint="auto"`: `OUTPUT.partial` when `output` is given, else no checkpoints.
    `threads`: CPU threads for torch (None: `calibration.threads.default_threads`). `num_heads`:
    heads used of those the weights hold, `drafter`: its kind (`load_model`). `chat_template`: put
    prompt records through the tokenizer's chat template (`calibration.data.load_prompts`).
    `device_map`: spread the model over this machine's devices (`load_model`). `processes`: this
    process's place among many (None: from torchrun's environment, `calibration.distributed`);
    process 0 writes the outputs. Other keyword arguments go to `calibrate`.
    """
    if data is None:
        if model != "demo":
            raise UserError(
                f"--data: required for --model {model} (the demo prompts are Python "
                "code; give prompts from your model's own use, e.g. a ShareGPT file)"
            )
        data = "demo"
    if threads is not None and threads < 1:
        raise UserError(f"--threads: must be at least 1, got {threads}")
    processes = processes_from_env() if processes is None else processes
    if processes.many and device_map is not None:
        raise UserError(
            f"--device-map: one process spreads the model over this machine's devices; "
            f"run it without torchrun (here {processes.world_size} processes)"
        )
    device = process_device(device, processes)
    if checkpoint == "auto":
        checkpoint = Path(str(output) + ".partial") if output is not None else None
    own_checkpoint = None if checkpoint is None else rank_checkpoint_path(checkpoint, processes)
    outputs = [] if output is None or not processes.is_main else [output, rank_vectors_path(output)]
    outputs += [own_checkpoint] if own_checkpoint is not None else []
    inputs = [p for p in (model, heads, data) if p is not None and Path(p).is_file()]
    refuse_overwriting_inputs(outputs, inputs)
    if output is not None and checkpoint is not None:
        refuse_overwriting_inputs([own_checkpoint], [output, rank_vectors_path(output)])
    check_writable(outputs)  # before the model loads and hours of calibration
    # process 0 owns the outputs; the others write only their own checkpoints
    lock = output_lock(output) if output is not None and processes.is_main else contextlib.nullcontext()
    with lock, process_group(processes, device):
        return _run_calibration_locked(
            model,
            heads,
            data,
            output=output,
            device=device,
            dtype=dtype,
            prompt_tokens=prompt_tokens,
            max_prompts=max_prompts,
            checkpoint=checkpoint,
            threads=threads,
            num_heads=num_heads,
            drafter=drafter,
            chat_template=chat_template,
            device_map=device_map,
            processes=processes,
            **options,
        )


def _run_calibration_locked(
    model,
    heads,
    data,
    *,
    output,
    device,
    dtype,
    prompt_tokens,
    max_prompts,
    checkpoint,
    threads,
    num_heads,
    drafter,
    chat_template,
    device_map,
    processes,
    **options,
) -> CalibrationResult:
    loaded = load_model(
        model, heads, device=device, dtype=dtype, num_heads=num_heads, drafter=drafter, device_map=device_map
    )
    # One prompt beyond --max-prompts tells whether the run leaves data unused (then the
    # checkpoint stays for --resume).
    prompts = load_prompts(
        data,
        loaded.tokenizer,
        prompt_tokens=prompt_tokens,
        max_prompts=None if max_prompts is None else max_prompts + 1,
        chat_template=chat_template,
        with_replies=options.get("labels", "greedy") == "data",
    )
    if prompts.skipped and processes.is_main:
        print(
            f"treeopt: warning: {data}: skipped {len(prompts.skipped)} files that are not UTF-8 "
            f"(first: {prompts.skipped[0]})",
            file=sys.stderr,
        )
    if heads is not None:
        heads_source = str(heads)
    elif model == "demo":
        heads_source = "demo" if DEMO_HEADS_DIR.is_dir() else None
    else:
        found = default_heads_dir(model)
        heads_source = None if found is None else str(found)
    if loaded.heads.kind != "medusa":
        heads_source = f"{loaded.heads.kind}:{heads_source}"  # a resume never mixes drafters
    with torch_threads(loaded.model, loaded.device, threads):
        result = calibrate(
            loaded,
            prompts,
            max_prompts=max_prompts,
            checkpoint=checkpoint,
            heads_source=heads_source,
            keep_checkpoint=output is not None,
            finished_output=output,
            processes=processes,
            **options,
        )
    if output is not None and not result.already_complete:
        failed = None
        if processes.is_main:
            try:
                save_outputs(output, result)
            except Exception as err:  # told to the other processes first, then raised
                failed = err
        # every process waits for process 0's outputs before removing its own checkpoint
        saved = all_agree(failed is None, processes)
        if failed is not None:
            raise failed
        if saved and result.complete and checkpoint is not None:
            # only now: every output is on disk, so the counts are never in neither place
            rank_checkpoint_path(checkpoint, processes).unlink(missing_ok=True)
    if (
        output is not None
        and processes.is_main
        and loaded.heads.kind == "draft-model"
        and (not result.already_complete or not alpha_path(output).is_file())
    ):
        # why: rejection sampling is governed by alpha = sum min(p, q), not by ranks
        # (docs/statistics.md, "Draft-model acceptance"); written beside the table (docs/formats.md)
        seqs = [list(p) for p in prompts.token_ids[:ALPHA_MAX_PROMPTS]]
        with torch_threads(loaded.model, loaded.device, threads):
            chain_acceptance(
                loaded.model, loaded.heads, seqs, pad_id=pad_token_id(loaded.model, loaded.tokenizer)
            ).save(alpha_path(output))
    return result


def save_outputs(output: str | Path, result: CalibrationResult) -> None:
    """Write the accuracy table `output` and its rank-vector sidecar together, durably
    (`treeopt.fileio.atomic_outputs`). The sidecar is renamed first and the table, which
    readers open first, last; both carry the run's ``run_id`` (docs/formats.md, "Output
    safety")."""
    with atomic_outputs() as out:
        save_rank_vectors(
            out.path(rank_vectors_path(output)),
            result.ranks,
            result.sequence,
            result.table.width,
            result.fingerprint,
            run_id=result.table.provenance["run_id"],
        )
        result.table.save(out.path(output))
