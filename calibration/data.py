"""Calibration prompts: where they come from and how they become token ids.

`--data` accepts
- ``demo``: the bundled held-out prompts (`calibration.demo_files.DEMO_PROMPTS`, JSON lines);
- a JSON-lines file (``.jsonl``, ``.jsonlines``, ``.ndjson``): one JSON object per line, the
  prompt is the first present of the fields ``prompt``, ``instruction``, ``text``, ``turns``
  (for ``turns``, a list of strings as in MT-bench, the first turn). Blank lines are skipped;
  a line that is not a JSON object, or has none of the fields, is an error naming file:line;
- a JSON file (``.json``) holding a list of such objects (or of strings), the layout of
  Medusa's and Alpaca's evaluation sets;
- a text or code file: its tokens are cut into consecutive prompts of ``prompt_tokens`` tokens;
- a directory: every text file below it with a known suffix (``TEXT_SUFFIXES``), in sorted
  path order, each cut into prompts like a single file. Files that are not valid UTF-8 are
  skipped there (and listed in `PromptSet.skipped`); a single text file given explicitly that
  is not UTF-8 is an error.

Chunking rule: a file's tokens are cut at multiples of ``prompt_tokens``; the last piece is
kept when it is the file's only piece or has at least ``prompt_tokens // 2`` tokens. JSON-lines
prompts longer than ``prompt_tokens`` keep their first ``prompt_tokens`` tokens. The tokenizer's
leading special tokens (a BOS, for Llama tokenizers) are prepended to every prompt and counted
in its length. Everything is deterministic: same files, same tokenizer -> same prompts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from calibration.demo_files import DEMO_PROMPTS
from treeopt.errors import UserError
from treeopt.fileio import read_json_input, read_text_input

PROMPT_FIELDS = ("prompt", "instruction", "text", "turns")
JSONL_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson")
TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go",
                 ".java", ".js", ".ts", ".sh", ".toml", ".yaml", ".yml", ".json", ".html", ".css",
                 ".tex")


@dataclass(frozen=True)
class PromptSet:
    """Tokenised calibration prompts, in a fixed order.

    ``token_ids[i]`` is prompt i (special tokens included); ``name`` is "demo" or the path as
    given; ``sha256`` identifies the data (of the file's bytes; for a directory, of the sorted
    list of relative paths with each file's sha256); ``kind`` is "jsonl" or "text";
    ``skipped`` lists files of a directory that were skipped as not UTF-8; ``prompt_tokens`` is
    the chunk size / prompt length cap the prompts were made with.
    """

    token_ids: tuple[tuple[int, ...], ...]
    name: str
    sha256: str
    kind: str
    skipped: tuple[str, ...] = ()
    prompt_tokens: int = 128

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.token_ids)


def _prompt_from_record(record, where: str) -> str:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object, found {type(record).__name__}")
    field = next((f for f in PROMPT_FIELDS if f in record), None)
    if field is None:
        raise UserError(f"{where}: none of the fields {', '.join(PROMPT_FIELDS)}")
    value = record[field]
    if field == "turns" and isinstance(value, list):
        value = value[0] if value else ""
    if not isinstance(value, str):
        raise UserError(f"{where}: field '{field}' is {type(value).__name__}, expected a string")
    return value


def read_jsonl_prompts(path: str | Path) -> list[str]:
    """The prompt strings of a JSON-lines file, in file order (empty prompts dropped)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror or err})") from None
    prompts = []
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path}:{lineno}: not valid UTF-8") from None
        text = text.strip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        if isinstance(record, str):  # a bare string is not a JSON-lines record
            raise UserError(f"{path}:{lineno}: expected a JSON object, found str")
        value = _prompt_from_record(record, f"{path}:{lineno}")
        if value:
            prompts.append(value)
    return prompts


def read_json_prompts(path: str | Path) -> list[str]:
    """The prompts of a JSON file holding a list of records (objects with a prompt field, as in
    Medusa's and Alpaca's evaluation sets, or plain strings)."""
    path = Path(path)
    doc = read_json_input(path, "a JSON list of prompts")
    if not isinstance(doc, list):
        raise UserError(f"{path}: expected a JSON list of prompts (objects with one of the fields "
                        f"{', '.join(PROMPT_FIELDS)}), found {type(doc).__name__}")
    return [v for i, r in enumerate(doc) if (v := _prompt_from_record(r, f"{path}: item {i}"))]


def _special_prefix(tokenizer) -> list[int]:
    """Token ids the tokenizer puts in front of any text (e.g. [BOS]); [] if none."""
    with_special = tokenizer("x", add_special_tokens=True)["input_ids"]
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    n = len(with_special) - len(plain)
    if n > 0 and with_special[n:] == plain:
        return list(with_special[:n])
    return []


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def chunk_ids(ids: list[int], prompt_tokens: int, prefix: list[int] = ()) -> list[tuple[int, ...]]:
    """Cut `ids` into prompts of `prompt_tokens` tokens (prefix included), per the module rule."""
    body = max(1, prompt_tokens - len(prefix))
    pieces = [ids[i:i + body] for i in range(0, len(ids), body)]
    if len(pieces) > 1 and len(prefix) + len(pieces[-1]) < prompt_tokens // 2:
        pieces.pop()
    return [tuple(prefix) + tuple(p) for p in pieces if p]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_prompts(data: str | Path, tokenizer, *, prompt_tokens: int = 128,
                 max_prompts: int | None = None) -> PromptSet:
    """Load and tokenise the calibration prompts named by `data` (see the module docstring).

    `max_prompts` keeps the first prompts only (after chunking). Raises `UserError` for a
    missing, unreadable, malformed or empty source.
    """
    if prompt_tokens < 1:
        raise UserError(f"--prompt-tokens: must be at least 1, got {prompt_tokens}")
    if max_prompts is not None and max_prompts < 1:
        raise UserError(f"--max-prompts: must be at least 1, got {max_prompts}")
    name = str(data)
    if name == "demo":
        path = DEMO_PROMPTS
        if not path.is_file():
            raise UserError(f"demo prompts missing at {path}")
    else:
        path = Path(data)
        if not path.exists():
            raise UserError(f"--data: {path} does not exist")
    prefix = _special_prefix(tokenizer)
    skipped: list[str] = []

    if path.is_dir():
        kind = "text"
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        digest = hashlib.sha256()
        prompts: list[tuple[int, ...]] = []
        for file in files:
            rel = file.relative_to(path).as_posix()
            try:
                raw = file.read_bytes()
            except OSError as err:
                raise UserError(f"{file}: cannot read ({err.strerror or err})") from None
            digest.update(f"{rel}\0{hashlib.sha256(raw).hexdigest()}\n".encode())
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped.append(rel)
                continue
            # Past `max_prompts`, keep hashing (the fingerprint covers the whole directory)
            # but stop tokenising.
            if max_prompts is None or len(prompts) < max_prompts:
                prompts += chunk_ids(_encode(tokenizer, text), prompt_tokens, prefix)
        sha = digest.hexdigest()
    elif path.suffix.lower() in JSONL_SUFFIXES + (".json",):
        kind = "jsonl"
        prompts = []
        texts = read_json_prompts(path) if path.suffix.lower() == ".json" else read_jsonl_prompts(path)
        for text in texts:
            if max_prompts is not None and len(prompts) >= max_prompts:
                break
            ids = _encode(tokenizer, text)[: max(1, prompt_tokens - len(prefix))]
            if ids:
                prompts.append(tuple(prefix) + tuple(ids))
        sha = _sha256_file(path)
    else:
        kind = "text"
        prompts = chunk_ids(_encode(tokenizer, read_text_input(path, "a text file")), prompt_tokens,
                            prefix)
        sha = _sha256_file(path)

    if max_prompts is not None:
        prompts = prompts[:max_prompts]
    if not prompts:
        raise UserError(f"{path}: no prompts" + (f" ({len(skipped)} files skipped as not UTF-8)"
                                                  if skipped else ""))
    return PromptSet(tuple(prompts), name, sha, kind, tuple(skipped), prompt_tokens)
