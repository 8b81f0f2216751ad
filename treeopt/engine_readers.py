"""Serving engines' own acceptance counts: vLLM's Prometheus `/metrics` scrapes (one, or an
earlier and a later one whose difference is the window), vLLM's per-request
`metrics.speculative_decoding` and SGLang's per-request `meta_info` (docs/formats.md#engine-acceptance-counts).

Every reader ends in one `EngineWindow`: the histogram of how many of the K drafted tokens each
verification step accepted. That histogram is all a chain's acceptance needs: the drafts whose
first j tokens were all accepted are its tail sum (docs/statistics.md#engine-reported-acceptance).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from treeopt.errors import UserError
from treeopt.fileio import parse_json_input, read_text_input

ENGINE_ACCEPTANCE_FORMAT = "treeopt.engine_acceptance/v1"
#: Fewer verification steps than this and the normal interval of tau is not to be trusted
# (the usual rule of thumb for the central limit theorem, docs/statistics.md#engine-reported-acceptance).
MIN_DRAFTS = 30

_DRAFTS = "vllm:spec_decode_num_drafts"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass(frozen=True)
class EngineWindow:
    """What an engine reported over one window of traffic, for a chain of K drafted tokens.

    accepted_length_histogram: (K + 1,) ints, [j] = verification steps that accepted exactly j
    of their K draft tokens (the bonus token not counted).
    """

    engine: str  # "vllm" | "sglang"
    source: str  # which output it was read from ("vllm /metrics", "vllm per-request", ...)
    accepted_length_histogram: tuple[int, ...]
    files: tuple[str, ...]
    num_draft_tokens: int | None = None  # proposed tokens, when the engine says (short drafts show here)
    window: dict = field(default_factory=dict)  # what bounds the window (scrape creation times, requests)
    notes: tuple[str, ...] = ()

    @property
    def num_spec_tokens(self) -> int:
        return len(self.accepted_length_histogram) - 1

    @property
    def num_drafts(self) -> int:
        return int(sum(self.accepted_length_histogram))

    @property
    def accepted_per_position(self) -> np.ndarray:
        """(K,) drafts whose first j + 1 tokens were all accepted (vLLM's per-position counter)."""
        h = np.asarray(self.accepted_length_histogram, dtype=np.int64)
        return h[::-1].cumsum()[::-1][1:]

    def to_dict(self) -> dict:
        return {
            "format": ENGINE_ACCEPTANCE_FORMAT,
            "engine": self.engine,
            "source": self.source,
            "files": list(self.files),
            "num_spec_tokens": self.num_spec_tokens,
            "num_drafts": self.num_drafts,
            "accepted_length_histogram": list(self.accepted_length_histogram),
            "num_draft_tokens": self.num_draft_tokens,
            "window": dict(self.window),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d, source: str) -> EngineWindow:
        """Parse the `engine_acceptance` provenance of a chain table; errors name `source`."""
        if not isinstance(d, dict) or d.get("format") != ENGINE_ACCEPTANCE_FORMAT:
            raise UserError(f'{source}: provenance.engine_acceptance: expected "format": "{ENGINE_ACCEPTANCE_FORMAT}"')
        hist = d.get("accepted_length_histogram")
        if not isinstance(hist, list) or len(hist) < 2 or not all(_is_count(x) for x in hist):
            raise UserError(f"{source}: provenance.engine_acceptance.accepted_length_histogram: expected K + 1 counts")
        files = d.get("files") or []
        return cls(
            engine=str(d.get("engine")),
            source=str(d.get("source")),
            accepted_length_histogram=tuple(int(x) for x in hist),
            files=tuple(str(f) for f in files),
            num_draft_tokens=d.get("num_draft_tokens"),
            window=dict(d.get("window") or {}),
            notes=tuple(str(n) for n in d.get("notes") or ()),
        )


def _is_count(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 and x == int(x)


# ---------------------------------------------------------------------------------------------
# Prometheus text exposition (https://prometheus.io/docs/instrumenting/exposition_formats/)

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _labels(text: str, where: str) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise UserError(f"{where}: cannot read the labels {{{text}}}")
        value = m.group(2).replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        out[m.group(1)] = value
        pos = m.end()
    return out


def parse_prometheus(text: str, source: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a Prometheus text exposition: name -> [(labels, value)]; `# HELP` and
    `# TYPE` lines and comments are skipped, a timestamp after the value is ignored."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise UserError(f"{source}: line {i}: not a Prometheus sample line: {line[:80]!r}")
        try:
            value = float(m.group(4))
        except ValueError:
            raise UserError(f"{source}: line {i}: sample value {m.group(4)!r} is not a number") from None
        samples.setdefault(m.group(1), []).append((_labels(m.group(3) or "", f"{source}: line {i}"), value))
    return samples


@dataclass(frozen=True)
class VllmScrape:
    """vLLM's speculative-decoding counters in one scrape, summed over its engines (data-parallel
    ranks); `created` is the earliest `_created` time, None when the server omits them."""

    file: str
    drafts: float
    draft_tokens: float | None
    accepted: float | None
    per_position: dict[int, float]
    created: float | None


def _one_value(samples, name: str, source: str, *, required: bool) -> float | None:
    rows = samples.get(name + "_total") or samples.get(name)
    if not rows:
        if required:
            raise UserError(
                f"{source}: no {name}_total counter (is speculative decoding on, and is this vLLM's /metrics?)"
            )
        return None
    models = {labels.get("model_name") for labels, _ in rows}
    if len(models) > 1:
        raise UserError(
            f"{source}: {name}_total has {len(models)} models ({', '.join(sorted(map(str, models)))}); scrape one"
        )
    return float(sum(v for _, v in rows))


def vllm_scrape(text: str, source: str) -> VllmScrape:
    """vLLM's spec-decode counters from the text of its /metrics (vllm/v1/spec_decode/metrics.py)."""
    samples = parse_prometheus(text, source)
    drafts = _one_value(samples, _DRAFTS, source, required=True)
    per_pos: dict[int, float] = {}
    for labels, value in samples.get(_PER_POS + "_total") or samples.get(_PER_POS) or []:
        pos = labels.get("position")
        if pos is None or not pos.isdigit():
            raise UserError(f"{source}: {_PER_POS}_total has a sample without a numeric position label")
        per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + value
    if not per_pos:
        raise UserError(f"{source}: no {_PER_POS}_total{{position=...}} counters: per-position acceptance is missing")
    created = [v for name in (_DRAFTS + "_created",) for _, v in samples.get(name, [])]
    for name, rows in samples.items():
        if name.startswith("vllm:spec_decode") and any(v < 0 or not math.isfinite(v) for _, v in rows):
            raise UserError(f"{source}: {name} has a negative or non-finite value")
    return VllmScrape(
        file=source,
        drafts=drafts,
        draft_tokens=_one_value(samples, _DRAFT_TOKENS, source, required=False),
        accepted=_one_value(samples, _ACCEPTED, source, required=False),
        per_position=per_pos,
        created=min(created) if created else None,
    )


def _positions(scrape: VllmScrape) -> int:
    """K from the position labels 0..K-1; a gap is one clear line."""
    K = max(scrape.per_position) + 1
    missing = sorted(set(range(K)) - set(scrape.per_position))
    if missing:
        raise UserError(
            f"{scrape.file}: {_PER_POS}_total has positions up to {K - 1} but not position "
            f"{', '.join(map(str, missing))} (missing positions)"
        )
    return K


def scrape_window(later: VllmScrape, earlier: VllmScrape | None = None) -> EngineWindow:
    """The counts between two scrapes of one server (or since it started, for one scrape): a
    counter that went down (a restart: counters reset), K that changed, too few drafts, and
    per-position counts that grow with position are each one clear line."""
    K = _positions(later)
    names = (later.file,) if earlier is None else (later.file, earlier.file)
    window: dict = {"later_created": later.created}
    if earlier is not None:
        K0 = _positions(earlier)
        if K0 != K:
            raise UserError(
                f"{earlier.file} -> {later.file}: the window has two different K ({K0} draft positions, "
                f"then {K}): the server was restarted with another num_speculative_tokens"
            )
        if earlier.created is not None and later.created is not None and earlier.created != later.created:
            raise UserError(
                f"{earlier.file} -> {later.file}: the counters were created at different times "
                f"({earlier.created:.0f}, then {later.created:.0f}): the server restarted between the scrapes "
                "(counter reset); scrape twice without a restart"
            )
        window["earlier_created"] = earlier.created
    diff = {"drafts": later.drafts - (earlier.drafts if earlier else 0.0)}
    for j in range(K):
        diff[f"position {j}"] = later.per_position[j] - (earlier.per_position[j] if earlier else 0.0)
    for name, value in diff.items():
        if value < 0:
            raise UserError(
                f"{earlier.file} -> {later.file}: {_DRAFTS if name == 'drafts' else _PER_POS}_total"
                f"{'' if name == 'drafts' else '{' + name.replace(' ', '=') + '}'} went down by {-value:g}: "
                "the counters were reset (server restart) between the scrapes, or the scrapes are in the "
                "wrong order (give the later scrape first: --import LATER --import EARLIER)"
            )
    tokens = None
    if later.draft_tokens is not None and (earlier is None or earlier.draft_tokens is not None):
        tokens = int(later.draft_tokens - (earlier.draft_tokens if earlier else 0.0))
    n = np.array([diff["drafts"]] + [diff[f"position {j}"] for j in range(K)])
    hist = _histogram_from_reach(n, " -> ".join(reversed(names)))
    notes = _short_draft_notes(tokens, int(n[0]), K)
    return _checked(
        EngineWindow("vllm", "vllm /metrics", hist, names, tokens, window, notes), " -> ".join(reversed(names))
    )


def _histogram_from_reach(n: np.ndarray, source: str) -> tuple[int, ...]:
    """(K + 1,) exact-count histogram from n[0] = drafts and n[j] = drafts accepting >= j."""
    if np.any(n != np.round(n)):
        raise UserError(f"{source}: counter differences are not whole numbers")
    grow = np.flatnonzero(np.diff(n) > 0)
    if grow.size:
        j = int(grow[0])
        what = "drafts" if j == 0 else f"position {j - 1}"
        raise UserError(
            f"{source}: position {j} has {n[j + 1]:g} accepted tokens, more than the {n[j]:g} of {what}: "
            "a chain accepts position j only after every position before it (not a chain's counters)"
        )
    hist = -np.diff(np.append(n, 0.0))
    return tuple(int(x) for x in hist)


def _short_draft_notes(tokens: int | None, drafts: int, K: int) -> tuple[str, ...]:
    if tokens is None or drafts == 0 or tokens >= K * drafts:
        return ()
    share = 1 - tokens / (K * drafts)
    return (
        f"{share:.1%} of the K x drafts slots were not proposed (drafts shorter than K, e.g. n-gram or "
        "grammar): acceptance at later positions is understated",
    )


def _checked(window: EngineWindow, source: str) -> EngineWindow:
    if window.num_drafts == 0:
        raise UserError(f"{source}: no speculative steps in the window (0 drafts): nothing to measure")
    if window.num_drafts < MIN_DRAFTS:
        raise UserError(
            f"{source}: the window is too short: {window.num_drafts} drafts, at least {MIN_DRAFTS} needed "
            "for an interval of tau; scrape over more traffic"
        )
    return window


# ---------------------------------------------------------------------------------------------
# Per-request records (JSON, a JSON list or JSON lines)


def _records(text: str, source: str) -> list:
    stripped = text.strip()
    if not stripped:
        raise UserError(f"{source}: empty file")
    if stripped[0] == "[" or "\n" not in stripped:
        doc = parse_json_input(stripped, source)
        return doc if isinstance(doc, list) else [doc]
    try:  # one indented JSON response, else JSON lines
        return [parse_json_input(stripped, source)]
    except UserError:
        pass
    return [
        parse_json_input(line, f"{source}: line {i}") for i, line in enumerate(text.splitlines(), 1) if line.strip()
    ]


def _vllm_record(rec) -> dict | None:
    if isinstance(rec, dict) and isinstance(rec.get("metrics"), dict):
        return rec["metrics"].get("speculative_decoding")
    if isinstance(rec, dict) and "acceptance_histogram" in rec:
        return rec
    return None


def _sglang_record(rec) -> dict | None:
    if isinstance(rec, dict) and isinstance(rec.get("meta_info"), dict):
        return rec["meta_info"]
    if isinstance(rec, dict) and "spec_verify_ct" in rec:
        return rec
    return None


def per_request_kind(text: str) -> str | None:
    """'vllm' or 'sglang' when the text holds per-request acceptance of that engine, else None."""
    if "speculative_decoding" in text or '"acceptance_histogram"' in text:
        return "vllm"
    if "spec_verify_ct" in text:
        return "sglang"
    return None


def _dense(hist, K: int, where: str) -> np.ndarray:
    if not isinstance(hist, list) or not all(_is_count(x) for x in hist):
        raise UserError(f"{where}: expected a list of step counts")
    if len(hist) > K + 1:
        raise UserError(f"{where}: {len(hist)} buckets, more than K + 1 = {K + 1}")
    return np.pad(np.asarray(hist, dtype=np.int64), (0, K + 1 - len(hist)))


def _one_k(ks: dict[int, int], source: str) -> int:
    if len(ks) > 1:
        first, second = sorted(ks)[:2]
        raise UserError(
            f"{source}: the requests have two different K ({first} in record {ks[first]}, {second} in record "
            f"{ks[second]}): one window must come from one num_speculative_tokens"
        )
    return next(iter(ks))


def vllm_per_request(text: str, source: str) -> EngineWindow:
    """The summed `metrics.speculative_decoding` of vLLM responses (--per-request-spec-decode-metrics
    summary|detailed); steps that drafted fewer than K tokens are left out (said in a note)."""
    recs = [(i, _vllm_record(r)) for i, r in enumerate(_records(text, source), 1)]
    recs = [(i, r) for i, r in recs if r is not None]
    if not recs:
        raise UserError(
            f"{source}: no record has metrics.speculative_decoding "
            "(start vLLM with --per-request-spec-decode-metrics summary)"
        )
    ks: dict[int, int] = {}
    for i, r in recs:
        k = r.get("num_spec_tokens")
        if not _is_count(k) or k < 1:
            raise UserError(f"{source}: record {i}: num_spec_tokens is {k!r}, expected K >= 1")
        ks.setdefault(int(k), i)
    K = _one_k(ks, source)
    total = np.zeros(K + 1, dtype=np.int64)
    left_out = 0
    for i, r in recs:
        by_length = r.get("acceptance_histogram_by_draft_length")
        where = f"{source}: record {i}"
        if isinstance(by_length, dict):
            total += _dense(by_length.get(str(K), []), K, f"{where}: acceptance_histogram_by_draft_length[{K}]")
            left_out += sum(int(np.sum(_dense(v, K, where))) for k, v in by_length.items() if k != str(K))
        else:
            total += _dense(r.get("acceptance_histogram"), K, f"{where}: acceptance_histogram")
    notes = (f"{left_out} steps drafted fewer than K = {K} tokens and are left out",) if left_out else ()
    window = {"requests": len(recs)}
    return _checked(
        EngineWindow("vllm", "vllm per-request", tuple(int(x) for x in total), (source,), None, window, notes), source
    )


def sglang_per_request(text: str, source: str) -> EngineWindow:
    """The summed `spec_accept_histogram` of SGLang responses' meta_info, K from
    spec_draft_token_num / spec_verify_ct (SGLang counts K draft tokens per verification)."""
    recs = [(i, _sglang_record(r)) for i, r in enumerate(_records(text, source), 1)]
    recs = [(i, r) for i, r in recs if r is not None and r.get("spec_verify_ct")]
    if not recs:
        raise UserError(f"{source}: no record has meta_info.spec_verify_ct > 0 (is speculative decoding on?)")
    ks: dict[int, int] = {}
    for i, m in recs:
        steps, drafted = m.get("spec_verify_ct"), m.get("spec_draft_token_num")
        if not _is_count(drafted) or drafted % steps:
            raise UserError(
                f"{source}: record {i}: spec_draft_token_num {drafted!r} is not a multiple of spec_verify_ct "
                f"{steps}: K cannot be told"
            )
        ks.setdefault(int(drafted // steps), i)
    K = _one_k(ks, source)
    total = np.zeros(K + 1, dtype=np.int64)
    for i, m in recs:
        where = f"{source}: record {i}"
        if "spec_accept_histogram" not in m:
            raise UserError(f"{where}: no spec_accept_histogram: per-position acceptance needs it (a newer SGLang)")
        h = _dense(m["spec_accept_histogram"], K, f"{where}: spec_accept_histogram")
        if int(h.sum()) != int(m["spec_verify_ct"]):
            raise UserError(
                f"{where}: spec_accept_histogram sums to {int(h.sum())} steps, spec_verify_ct is {m['spec_verify_ct']}"
            )
        total += h
    window = {"requests": len(recs)}
    tokens = int(sum(int(m["spec_draft_token_num"]) for _, m in recs))
    return _checked(
        EngineWindow("sglang", "sglang per-request", tuple(int(x) for x in total), (source,), tokens, window), source
    )


def is_prometheus(text: str) -> bool:
    return "vllm:spec_decode" in text and not text.lstrip().startswith(("{", "["))


def read_engine_window(texts: list[tuple[str, str]]) -> EngineWindow:
    """One window from engine output files, given as (name, text): one or two vLLM /metrics
    scrapes (the later first), or one per-request file of vLLM or SGLang."""
    (name, text), rest = texts[0], texts[1:]
    if is_prometheus(text):
        later = vllm_scrape(text, name)
        if len(rest) > 1:
            raise UserError(f"--import: at most two /metrics scrapes make a window, got {len(texts)}")
        earlier = None
        if rest:
            if not is_prometheus(rest[0][1]):
                raise UserError(f"{rest[0][0]}: the earlier scrape is not vLLM /metrics text")
            earlier = vllm_scrape(rest[0][1], rest[0][0])
        return scrape_window(later, earlier)
    if rest:
        raise UserError(
            f"{rest[0][0]}: a per-request file is a window by itself; a second --import pairs /metrics scrapes only"
        )
    kind = per_request_kind(text)
    if kind == "vllm":
        return vllm_per_request(text, name)
    if kind == "sglang":
        return sglang_per_request(text, name)
    raise UserError(
        f"{name}: not an engine's acceptance output (vLLM /metrics text, vLLM per-request JSON with "
        "metrics.speculative_decoding, or SGLang meta_info with spec_verify_ct)"
    )


def load_engine_window(paths) -> EngineWindow:
    """`read_engine_window` of files: one or two vLLM /metrics scrapes (the later first), or one
    per-request JSON / JSON-lines file of vLLM or SGLang."""
    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("no engine output file given")
    return read_engine_window([(p, read_text_input(p, "an engine's acceptance output")) for p in paths])
