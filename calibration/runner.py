"""The calibration run: measure how often each Medusa head's rank-r proposal is right
(docs/statistics.md#labels and "Per-head normalisation").

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
fingerprint differs. Nothing is lost (docs/formats.md#calibration-checkpoint-treeoptcalibration-checkpointv1): a batch's
counts and the progress marker are committed as one unit with Ctrl-C held back
(`deferred_interrupts`); `run_calibration` removes the checkpoint only after the table and its
sidecar are durably in place, and ``resume=True`` on an output that is already complete for
the same inputs returns it instead of starting over. `run_calibration` holds an output lock for
the whole run, so a second calibration to the same output fails at once.

Many processes (``torchrun --nproc-per-node N -m treeopt calibrate``, `calibration.distributed`):
each process calibrates a contiguous run of whole batches on its own device with its own
checkpoint, the counts are combined with torch.distributed collectives into exactly the
one-process counts, and process 0 writes the outputs (docs/statistics.md#counts-from-many-processes).

Prompts are processed in file order in batches aligned to multiples of ``batch_size`` (so a
resumed run sees the same batches as an uninterrupted one, except the one batch that
``max_prompts`` may have cut).

Reproducibility: same inputs, seed and machine -> byte-identical output. The provenance holds
the date (a day, no time of day) of the run, or of ``SOURCE_DATE_EPOCH`` when that environment
variable is set; it is the only field that varies between runs on different days.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from calibration.calibration_outputs import (
    CalibrationResult,
    accuracy_table,
    check_outputs,
    finished_result,
    recorded_draft_scores,
    save_outputs,
)
from calibration.calibration_settings import CalibrationSettings, check_settings, run_fingerprint
from calibration.checkpoint import load_checkpoint, save_checkpoint
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
from calibration.interrupts import CalibrationInterrupted, deferred_interrupts
from calibration.labels import (
    drafter_inputs,
    greedy_continuations,
    label_ranks,
    label_rows,
    pad_token_id,
)
from calibration.models import ModelSource
from calibration.sglang_drafting import pool_records
from calibration.threads import torch_threads
from treeopt.chain import alpha_path
from treeopt.errors import UserError
from treeopt.fileio import output_lock
from treeopt.layout import default_heads_dir

#: what `calibrate` and `run_calibration` count without settings of their own
DEFAULT_SETTINGS = CalibrationSettings()


@dataclass(frozen=True)
class _Shard:
    """This process's part of a run: prompts [first, end), its checkpoint file (None: no
    checkpoints) and that checkpoint's fingerprint (`calibration.distributed`)."""

    first: int
    end: int
    checkpoint: Path | None
    fingerprint: dict
    processes: Processes


def _shard(fingerprint: dict, total: int, batch_size: int, checkpoint, processes: Processes) -> _Shard:
    """This process's prompts [first, end) of the `total` (all of them for one process)."""
    first, end = shard_bounds(total, batch_size, processes.rank, processes.world_size)
    path = rank_checkpoint_path(checkpoint, processes) if checkpoint is not None else None
    return _Shard(first, end, path, shard_fingerprint(fingerprint, processes, first, end), processes)


def _checkpoint_counts(shard: _Shard) -> CalibrationCounts | None:
    """The counts of the shard's checkpoint (None when there is none to resume from)."""
    if not shard.checkpoint.exists():
        return None
    counts = load_checkpoint(shard.checkpoint, shard.fingerprint)
    if counts.prompts_done > shard.end:
        raise UserError(
            f"{shard.checkpoint}: checkpoint already covers {counts.prompts_done} prompts, more than "
            f"the {shard.end} asked for"
        )
    return counts


def _progress_bar(shard: _Shard, counts: CalibrationCounts, progress: bool | None) -> tqdm:
    processes = shard.processes
    # many processes: process 0's bar stands for all (the shards are of equal size)
    return tqdm(
        total=shard.end - shard.first,
        initial=counts.prompts_done - shard.first,
        unit="prompt",
        file=sys.stderr,
        disable=(True if not processes.is_main else None if progress is None else not progress),
        dynamic_ncols=True,
        desc="calibrate" if not processes.many else f"calibrate (1 of {processes.world_size} processes)",
    )


def _batch_update(loaded, batch: list[list[int]], lo: int, settings: CalibrationSettings, pad: int, counts):
    """The count update (not yet committed) of the prompts `batch`, [lo, lo + len(batch))."""
    generated = settings.generated_tokens
    if generated:
        continuations = greedy_continuations(loaded.model, batch, generated, pad_id=pad)
        seqs = [p + g for p, g in zip(batch, continuations, strict=True)]
        starts = [len(p) - 1 for p in batch]
    else:
        seqs, starts = batch, [0] * len(batch)
    heads = loaded.heads
    pool = None
    if settings.draft_scores_topk is None:
        ranks = label_ranks(loaded.model, heads, seqs, starts, pad_id=pad, chunk_elements=settings.chunk_elements)
    else:
        ranks, pool = _ranks_and_pools(loaded, seqs, starts, settings, pad)
    # label_ranks' rows follow label_rows: prompt by prompt, t increasing
    row_seq, _, _ = label_rows([len(s) for s in seqs], starts, heads.num_heads)
    return counts.batch_update(
        ranks,
        lo + row_seq,
        prompts_done=lo + len(batch),
        tokens=sum(len(s) for s in seqs),
        generated=generated * len(seqs),
        pool=pool,
    )


def _ranks_and_pools(loaded, seqs, starts, settings: CalibrationSettings, pad: int):
    """The label ranks and the drafter's SGLang pools (`calibration.sglang_drafting.pool_records`)
    at the same rows, from one forward of the base model (`drafter_inputs`)."""
    heads = loaded.heads
    inputs = drafter_inputs(loaded.model, heads, seqs, pad_id=pad)
    try:
        ranks = label_ranks(
            loaded.model, heads, seqs, starts, pad_id=pad, chunk_elements=settings.chunk_elements, inputs=inputs
        )
        pool = pool_records(
            loaded.model,
            heads,
            seqs,
            starts,
            steps=heads.num_heads,
            topk=settings.draft_scores_topk,
            pad_id=pad,
            inputs=inputs,
        )
    finally:
        heads.set_context(None)  # the EAGLE draft's context of this batch (drafter_inputs)
    return ranks, pool


def _count_shard(loaded, prompts: PromptSet, settings: CalibrationSettings, shard: _Shard, counts, progress) -> None:
    """Count the shard's prompts into `counts` batch by batch, checkpointing every
    `settings.checkpoint_every` prompts; on Ctrl-C the checkpoint is saved and
    `CalibrationInterrupted` raised."""
    pad = pad_token_id(loaded.model, loaded.tokenizer)
    start_time, tokens_at_start = time.perf_counter(), counts.tokens
    every = settings.checkpoint_every
    bar = _progress_bar(shard, counts, progress)
    last_saved = counts.prompts_done
    try:
        while counts.prompts_done < shard.end:
            lo = counts.prompts_done
            hi = min(shard.end, (lo // settings.batch_size + 1) * settings.batch_size)
            batch = [list(p) for p in prompts.token_ids[lo:hi]]
            update = _batch_update(loaded, batch, lo, settings, pad, counts)
            with deferred_interrupts():  # the batch's counts and prompts_done: one unit
                counts.commit(update)
            bar.update(hi - lo)
            rate = (counts.tokens - tokens_at_start) / max(time.perf_counter() - start_time, 1e-9)
            bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
            if shard.checkpoint is not None and hi // every > last_saved // every and hi < shard.end:
                save_checkpoint(shard.checkpoint, shard.fingerprint, counts)
                last_saved = hi
    except KeyboardInterrupt:
        bar.close()
        saved = None
        if shard.checkpoint is not None and counts.prompts_done > shard.first:
            save_checkpoint(shard.checkpoint, shard.fingerprint, counts)
            saved = shard.checkpoint
        raise CalibrationInterrupted(saved, counts.prompts_done) from None
    bar.close()


def _settle(counts: CalibrationCounts, shard: _Shard, data_prompts: int, keep_checkpoint: bool):
    """The run's counts (every process's, combined) and whether the data set's `data_prompts`
    prompts are all done; the checkpoint removed when they are (unless `keep_checkpoint`), else
    updated."""
    processes = shard.processes
    if processes.many:
        # this shard's counts stay on disk until the outputs are written: a process that fails
        # in or after the exchange leaves the others' work whole
        if shard.checkpoint is not None:
            save_checkpoint(shard.checkpoint, shard.fingerprint, counts)
        counts = combine_counts(counts, shard.first, processes)
    complete = counts.prompts_done >= data_prompts
    if shard.checkpoint is not None:
        if complete and not keep_checkpoint:
            # many processes: each removes its own once every one has its combined counts
            all_agree(True, processes)
            shard.checkpoint.unlink(missing_ok=True)
        elif not processes.many:
            save_checkpoint(shard.checkpoint, shard.fingerprint, counts)
    return counts, complete


def calibrate(
    loaded,
    prompts: PromptSet,
    settings: CalibrationSettings = DEFAULT_SETTINGS,
    *,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    heads_source: str | None = None,
    progress: bool | None = None,
    keep_checkpoint: bool = False,
    finished_output: str | Path | None = None,
    refuse_other_output: bool = False,
    processes: Processes = SINGLE,
) -> CalibrationResult:
    """Calibrate `loaded` (a `calibration.models.LoadedModel`) on `prompts` with `settings`.

    Returns the accuracy table (hits/positions/joint/provenance) and the raw counts.
    `checkpoint` is the checkpoint file (None: no checkpoints); it is written atomically every
    `settings.checkpoint_every` prompts (at batch boundaries), when the run stops at
    `settings.max_prompts` short of the data, and on Ctrl-C (then `CalibrationInterrupted` is
    raised); it is removed when the whole data set is done, unless `keep_checkpoint`: then it is
    written complete and left for the caller to remove once its outputs are in place
    (`run_calibration`).
    `finished_output`: with `resume` and no checkpoint, an accuracy table already complete for
    these inputs is returned as is (``already_complete``); one from other inputs is replaced
    (the run starts over), or refused with `refuse_other_output` (`treeopt calibrate --resume`:
    a resume must not silently replace a table made from other inputs).
    `progress`: tqdm on stderr (None = only on a terminal).
    `processes`: this process's place among many (`calibration.distributed`): it calibrates
    its shard of whole batches, keeps its own checkpoint (`rank_checkpoint_path`) and the
    result holds every process's counts combined (each process gets them).
    """
    total = check_settings(settings, loaded, prompts)
    torch.manual_seed(settings.seed)
    fingerprint = run_fingerprint(loaded, prompts, settings, heads_source)
    shard = _shard(fingerprint, total, settings.batch_size, checkpoint, processes)
    if resume and shard.checkpoint is None:
        raise UserError("--resume: needs a checkpoint file (--checkpoint or -o)")
    counts = _checkpoint_counts(shard) if resume else None
    finished = None
    if resume and counts is None and finished_output is not None:
        finished = finished_result(Path(finished_output), fingerprint, total, refuse_other=refuse_other_output)
    # every process returns the finished output, or none does (the others wait in collectives)
    if all_agree(finished is not None, processes):
        return finished
    if resume and counts is None:
        print(f"treeopt: no checkpoint at {shard.checkpoint}; starting from the beginning", file=sys.stderr)
    if counts is None:
        counts = CalibrationCounts.zeros(loaded.heads.num_heads, settings.topk, settings.joint)
        counts.prompts_done = shard.first

    start_time = time.perf_counter()
    tokens_at_start, prompts_at_start = counts.tokens, counts.prompts_done
    _count_shard(loaded, prompts, settings, shard, counts, progress)
    counts, complete = _settle(counts, shard, len(prompts), keep_checkpoint)
    table = accuracy_table(loaded, prompts, settings, counts, fingerprint, processes)
    rank_vectors, sequence = counts.rank_vectors()
    return CalibrationResult(
        table,
        counts,
        complete,
        None if complete else shard.checkpoint,
        time.perf_counter() - start_time,
        prompts_at_start,
        counts.tokens - tokens_at_start,
        rank_vectors,
        sequence,
        fingerprint,
        draft_scores=recorded_draft_scores(counts, sequence, loaded.heads, settings, table),
    )


def _data_or_demo(data: str | None, model: str) -> str:
    """`data`, or the demo prompts for the demo model (module doc of `calibration.data`)."""
    if data is not None:
        return data
    if model != "demo":
        raise UserError(
            f"--data: required for --model {model} (the demo prompts are Python "
            "code; give prompts from your model's own use, e.g. a ShareGPT file)"
        )
    return "demo"


def _run_prompts(data: str, loaded, settings: CalibrationSettings, prompt_tokens: int, chat_template: bool, warn: bool):
    """The run's prompts, with the skipped files told on stderr when `warn`."""
    # One prompt beyond --max-prompts tells whether the run leaves data unused (then the
    # checkpoint stays for --resume).
    prompts = load_prompts(
        data,
        loaded.tokenizer,
        prompt_tokens=prompt_tokens,
        max_prompts=None if settings.max_prompts is None else settings.max_prompts + 1,
        chat_template=chat_template,
        with_replies=settings.labels == "data",
    )
    if prompts.skipped and warn:
        print(
            f"treeopt: warning: {data}: skipped {len(prompts.skipped)} files that are not UTF-8 "
            f"(first: {prompts.skipped[0]})",
            file=sys.stderr,
        )
    return prompts


def _heads_source(source: ModelSource, loaded) -> str | None:
    """The drafter as the fingerprint names it: its directory, "demo", or None (not found)."""
    if source.heads is not None:
        heads_source = str(source.heads)
    elif source.model == "demo":
        heads_source = "demo" if DEMO_HEADS_DIR.is_dir() else None
    else:
        found = default_heads_dir(source.model)
        heads_source = None if found is None else str(found)
    if loaded.heads.kind != "medusa":
        heads_source = f"{loaded.heads.kind}:{heads_source}"  # a resume never mixes drafters
    return heads_source


def _save_then_drop_checkpoint(output, result: CalibrationResult, checkpoint: Path | None, processes) -> None:
    """Process 0 writes the outputs; then every process removes its checkpoint of a complete run."""
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


def _save_alpha(output, loaded, prompts: PromptSet, settings: CalibrationSettings, threads, progress) -> None:
    """A draft model's chain acceptance beside the table (docs/formats.md), on the first of the
    prompts the table counts, with a progress bar on stderr as the counting has (`progress`:
    as `calibrate` takes it). Ctrl-C leaves the table complete and no sidecar: the same command
    with --resume measures only this."""
    # why: rejection sampling is governed by alpha = sum min(p, q), not by ranks
    # (docs/statistics.md#draft-model-acceptance)
    counted = len(prompts) if settings.max_prompts is None else min(settings.max_prompts, len(prompts))
    seqs = [list(p) for p in prompts.token_ids[: min(counted, ALPHA_MAX_PROMPTS)]]
    bar = tqdm(
        total=len(seqs),
        unit="prompt",
        file=sys.stderr,
        disable=None if progress is None else not progress,
        dynamic_ncols=True,
        desc="draft acceptance",
    )
    try:
        with torch_threads(loaded.model, loaded.device, threads):
            side = chain_acceptance(
                loaded.model,
                loaded.heads,
                seqs,
                pad_id=pad_token_id(loaded.model, loaded.tokenizer),
                on_batch=bar.update,
            )
    except KeyboardInterrupt:
        bar.close()
        print(
            f"treeopt: interrupted while measuring the draft model's acceptance; {output} is complete. "
            f"Write {alpha_path(output)} with the same command plus --resume.",
            file=sys.stderr,
        )
        raise
    bar.close()
    side.save(alpha_path(output))


def run_calibration(
    source: ModelSource | None = None,
    data: str | None = None,
    *,
    output: str | Path | None = None,
    settings: CalibrationSettings = DEFAULT_SETTINGS,
    prompt_tokens: int = 128,
    chat_template: bool = True,
    threads: int | None = None,
    checkpoint: str | Path | None = "auto",
    resume: bool = False,
    refuse_other_output: bool = False,
    progress: bool | None = None,
    processes: Processes | None = None,
) -> CalibrationResult:
    """Load the model and drafter of `source` (None: the demo's) and the prompts of `data`, calibrate with
    `settings`, and save the table to `output` (if given) and its rank vectors beside it,
    ``<output stem>.ranks.npz`` (`treeopt.acceptance.rank_vectors_path`, `save_rank_vectors`).

    `data`: required for any model but the demo (None: the demo prompts, for the demo only).
    `prompt_tokens`, `chat_template`: how the prompts are made (`calibration.data.load_prompts`).
    `threads`: CPU threads for torch (None: `calibration.threads.default_threads`).
    `checkpoint="auto"`: `OUTPUT.partial` when `output` is given, else no checkpoints.
    `resume`, `refuse_other_output`, `progress`: as `calibrate` takes them. `processes`: this
    process's place among many (None: from torchrun's environment, `calibration.distributed`);
    process 0 writes the outputs. `source.device_map` spreads the model over this machine's
    devices (`load_model`), with one process only.
    """
    source = ModelSource() if source is None else source
    data = _data_or_demo(data, source.model)
    if threads is not None and threads < 1:
        raise UserError(f"--threads: must be at least 1, got {threads}")
    processes = processes_from_env() if processes is None else processes
    if processes.many and source.device_map is not None:
        raise UserError(
            f"--device-map: one process spreads the model over this machine's devices; "
            f"run it without torchrun (here {processes.world_size} processes)"
        )
    source = replace(source, device=process_device(source.device, processes))
    if checkpoint == "auto":
        checkpoint = Path(str(output) + ".partial") if output is not None else None
    check_outputs(source, data, output, checkpoint, processes)
    # process 0 owns the outputs; every process locks its own checkpoint (a --checkpoint shared
    # by two calibrations would mix their counts)
    lock = output_lock(output) if output is not None and processes.is_main else contextlib.nullcontext()
    own_checkpoint = None if checkpoint is None else rank_checkpoint_path(checkpoint, processes)
    checkpoint_lock = contextlib.nullcontext() if own_checkpoint is None else output_lock(own_checkpoint)
    with lock, checkpoint_lock, process_group(processes, source.device):
        loaded = source.load()
        prompts = _run_prompts(data, loaded, settings, prompt_tokens, chat_template, processes.is_main)
        with torch_threads(loaded.model, loaded.device, threads):
            result = calibrate(
                loaded,
                prompts,
                settings,
                checkpoint=checkpoint,
                resume=resume,
                heads_source=_heads_source(source, loaded),
                progress=progress,
                keep_checkpoint=output is not None,
                finished_output=output,
                refuse_other_output=refuse_other_output,
                processes=processes,
            )
        if output is not None and not result.already_complete:
            _save_then_drop_checkpoint(output, result, checkpoint, processes)
        if (
            output is not None
            and processes.is_main
            and loaded.heads.kind == "draft-model"
            and (not result.already_complete or not alpha_path(output).is_file())
        ):
            _save_alpha(output, loaded, prompts, settings, threads, progress)
    return result
