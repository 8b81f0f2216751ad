"""Calibration prompts: where they come from and how they become token ids
(docs/formats.md#prompt-data).

`--data` of every command (calibration, validation, `treeopt run --validation-data`) accepts
- ``demo``: the bundled demo prompts (`calibration.demo_files.DEMO_PROMPTS`, JSON lines), and
  ``demo-validation``: the demo's held-out prompts (`DEMO_VALIDATION_PROMPTS`);
- a JSON-lines file (``.jsonl``, ``.jsonlines``, ``.ndjson``): one JSON object per line, read by
  the first present of the fields (`PROMPT_FIELDS`): ``conversations`` (ShareGPT: a list of
  ``{"from": "human"|"gpt"|"system", "value": ...}``), ``messages`` (OpenAI: a list of
  ``{"role": "user"|"assistant"|"system", "content": ...}``), ``prompt``, ``instruction``
  (Alpaca; a non-empty ``input`` is appended after a blank line, ``output`` is the reply),
  ``text`` (running text, never put through a chat template), ``turns`` (MT-bench: the first
  turn). Blank lines are skipped; a line that is not a JSON object, or has none of the fields,
  is an error naming file:line;
- a JSON file (``.json``) holding a list of such objects (or of strings), the layout of
  Medusa's and Alpaca's evaluation sets and of ShareGPT dumps;
- a text or code file: its tokens are cut into consecutive prompts of ``prompt_tokens`` tokens;
- a directory: every text file below it with a known suffix (``TEXT_SUFFIXES``), in sorted
  path order, each cut into prompts like a single file. Files that are not valid UTF-8 are
  skipped there (and listed in `PromptSet.skipped`); a single text file given explicitly that
  is not UTF-8 is an error.

Conversations: a record yields one prompt per assistant turn that follows a user turn (the
earlier turns are its context), and one more when it ends in a turn to answer. With data labels
(``with_replies``) each prompt includes its assistant turn. When the tokenizer has a chat
template and it is not turned off, every record but a ``text`` one goes through
``tokenizer.apply_chat_template`` (with ``add_generation_prompt`` when the prompt ends in a turn
to answer), as the Medusa authors' own calibration does for chat models; the template writes
its own special tokens. Without a template a record's turns are joined by blank lines after the
tokenizer's special prefix, so a one-turn record is its text, as before.

Chunking rule: a file's tokens are cut at multiples of ``prompt_tokens``; the last piece is
kept when it is the file's only piece or has at least ``prompt_tokens // 2`` tokens. JSON-lines
prompts longer than ``prompt_tokens`` keep their first ``prompt_tokens`` tokens, except a
prompt that ends in a turn to answer and went through the chat template or has earlier turns:
it keeps its last ``prompt_tokens`` tokens, so that the turn and the assistant header stay. The
tokenizer's leading special tokens (a BOS, for Llama tokenizers) are prepended to every prompt
not made by a chat template and counted in its length. Everything is deterministic: same files,
same tokenizer -> same prompts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from calibration.demo_files import DEMO_PROMPTS, DEMO_VALIDATION_PROMPTS
from treeopt.errors import UserError
from treeopt.fileio import DuplicateKey, check_input_file, loads_strict, read_json_input, read_text_input

#: the bundled prompt sets, by the name `--data` takes for them
DEMO_SOURCES = {"demo": DEMO_PROMPTS, "demo-validation": DEMO_VALIDATION_PROMPTS}
#: fields of a prompt record, in the order they are looked for (module doc)
PROMPT_FIELDS = ("conversations", "messages", "prompt", "instruction", "text", "turns")
JSONL_SUFFIXES = (".jsonl", ".jsonlines", ".ndjson")
TEXT_SUFFIXES = (
    ".py",
    ".txt",
    ".md",
    ".rst",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".hpp",
    ".rs",
    ".go",
    ".java",
    ".js",
    ".ts",
    ".sh",
    ".toml",
    ".yaml",
    ".yml",
    ".json",
    ".html",
    ".css",
    ".tex",
)
#: ShareGPT speaker names (``from``) and OpenAI roles -> the chat-template role
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",
}
#: the format each record field stands for (`PromptSet.data_format`)
FIELD_FORMATS = {
    "conversations": "sharegpt",
    "messages": "openai",
    "prompt": "prompt",
    "instruction": "alpaca",
    "text": "text",
    "turns": "mt-bench",
}


@dataclass(frozen=True)
class PromptSet:
    """Tokenised calibration prompts, in a fixed order.

    ``token_ids[i]`` is prompt i (special tokens included); ``name`` is "demo" or the path as
    given; ``sha256`` identifies the data (of the file's bytes; for a directory, of the sorted
    list of relative paths with each file's sha256); ``kind`` is "jsonl" or "text";
    ``skipped`` lists files of a directory that were skipped as not UTF-8; ``prompt_tokens`` is
    the chunk size / prompt length cap the prompts were made with; ``data_format`` the record
    layouts met (`FIELD_FORMATS` values or "string", joined by "+"; "text" for text files);
    ``chat_template`` the template the prompts went through: ``sha256:`` + 16 hex digits of it,
    "none" (the tokenizer has none, or no record was templated) or "off" (no-chat-template).
    """

    token_ids: tuple[tuple[int, ...], ...]
    name: str
    sha256: str
    kind: str
    skipped: tuple[str, ...] = ()
    prompt_tokens: int = 128
    data_format: str = "text"
    chat_template: str = "none"

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.token_ids)


@dataclass(frozen=True)
class Conversation:
    """One record of a prompt file as chat turns: ``turns`` are (role, content) pairs with the
    roles ``system``, ``user`` and ``assistant``; ``data_format`` names the record's layout
    (`FIELD_FORMATS`, or "string"); ``raw`` marks a ``text`` record (running text, never put
    through a chat template)."""

    turns: tuple[tuple[str, str], ...]
    data_format: str
    raw: bool = False

    def contexts(self, with_replies: bool = False) -> list[tuple[tuple[str, str], ...]]:
        """The prompts of the record: the turns before each assistant turn that follows a user
        turn, plus the whole conversation when it ends in a turn to answer. `with_replies`
        (data labels) includes each assistant turn itself (docs/formats.md#prompt-data)."""
        out = []
        seen_user = False
        for i, (role, _) in enumerate(self.turns):
            if role == "assistant" and seen_user:
                out.append(self.turns[: i + 1] if with_replies else self.turns[:i])
            seen_user = seen_user or role == "user"
        if self.turns and self.turns[-1][0] != "assistant" and seen_user:
            out.append(self.turns)
        return out


#: the most text read as prompts from plain text files: it is tokenised whole, and tokens take
#: tens of times the text's size in memory (a 1 GB file took 20.8 GB); 64 MiB is some 16
#: million tokens, far more than a calibration counts
MAX_TEXT_BYTES = 64 << 20


def _content(value, where: str, field: str) -> str:
    """A turn's text: a string, or OpenAI's list of content parts (their ``text`` joined)."""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        value = "".join(p.get("text", "") for p in value if isinstance(p.get("text", ""), str))
    if not isinstance(value, str):
        raise UserError(f"{where}: {field} is {type(value).__name__}, expected a string")
    return value


def _chat_turns(value, where: str, field: str) -> list[tuple[str, str]]:
    speaker, text = ("from", "value") if field == "conversations" else ("role", "content")
    if not isinstance(value, list):
        raise UserError(f"{where}: field '{field}' is {type(value).__name__}, expected a list of turns")
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict) or speaker not in turn or text not in turn:
            raise UserError(f"{where}: {field}[{i}]: expected an object with '{speaker}' and '{text}'")
        role = ROLES.get(str(turn[speaker]).lower())
        if role is None:
            raise UserError(
                f"{where}: {field}[{i}].{speaker}: unknown speaker {turn[speaker]!r} (known: {', '.join(ROLES)})"
            )
        turns.append((role, _content(turn[text], where, f"{field}[{i}].{text}")))
    return turns


def conversation_from_record(record, where: str) -> Conversation:
    """The `Conversation` of one prompt record (a JSON object or string; module doc); UserError
    for a turn holding a lone surrogate (a JSON escape such as \\ud800, half a character), which
    no tokenizer encodes."""
    conversation = _conversation(record, where)
    for role, text in conversation.turns:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise UserError(
                f"{where}: the {role} text holds a lone surrogate (\\u{ord(text[err.start]):04x}), which is no text"
            ) from None
    return conversation


def _conversation(record, where: str) -> Conversation:
    if isinstance(record, str):
        return Conversation((("user", record),), "string")
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object, found {type(record).__name__}")
    field = next((f for f in PROMPT_FIELDS if f in record), None)
    if field is None:
        raise UserError(f"{where}: none of the fields {', '.join(PROMPT_FIELDS)}")
    if field in ("conversations", "messages"):
        turns = _chat_turns(record[field], where, field)
        system = record.get("system")
        if isinstance(system, str) and system and not any(r == "system" for r, _ in turns):
            turns.insert(0, ("system", system))  # ShareGPT variants keep it beside the turns
        return Conversation(tuple(turns), FIELD_FORMATS[field])
    return _single_turn(record, field, where)


def _single_turn(record: dict, field: str, where: str) -> Conversation:
    """The `Conversation` of a record read by a field that holds one text (module doc)."""
    value = record[field]
    fmt = FIELD_FORMATS[field]
    if field == "turns" and isinstance(value, list):
        value = value[0] if value else ""
    if not isinstance(value, str):
        raise UserError(f"{where}: field '{field}' is {type(value).__name__}, expected a string")
    if not value:
        return Conversation((), fmt)
    if field == "instruction":
        extra = record.get("input")
        if isinstance(extra, str) and extra:
            value = f"{value}\n\n{extra}"  # Alpaca's instruction and its input, one user turn
        reply = record.get("output")
        if isinstance(reply, str) and reply:
            return Conversation((("user", value), ("assistant", reply)), fmt)
    return Conversation((("user", value),), fmt, raw=field == "text")


def _prompt_from_record(record, where: str) -> str:
    """The first prompt of a record as text: its first user turn."""
    turns = conversation_from_record(record, where).turns
    return next((text for role, text in turns if role == "user"), "")


def read_jsonl_records(path: str | Path) -> list[tuple[object, str]]:
    """The records of a JSON-lines file with where each is (``file:line``), blank lines skipped."""
    path = Path(path)
    check_input_file(path, "a JSON-lines file of prompts")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror or err})") from None
    records = []
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path}:{lineno}: not valid UTF-8") from None
        text = text.strip()
        if not text:
            continue
        try:
            record = loads_strict(text)
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        except RecursionError:
            raise UserError(f"{path}:{lineno}: JSON nested too deeply to read") from None
        except DuplicateKey as err:
            raise UserError(f"{path}:{lineno}: the key {str(err)[:60]!r} is given twice in one object") from None
        if isinstance(record, str):  # a bare string is not a JSON-lines record
            raise UserError(f"{path}:{lineno}: expected a JSON object, found str")
        records.append((record, f"{path}:{lineno}"))
    return records


def read_json_records(path: str | Path) -> list[tuple[object, str]]:
    """The records of a JSON file holding a list (objects or plain strings), with where each is."""
    path = Path(path)
    doc = read_json_input(path, "a JSON list of prompts")
    if not isinstance(doc, list):
        raise UserError(
            f"{path}: expected a JSON list of prompts (objects with one of the fields "
            f"{', '.join(PROMPT_FIELDS)}), found {type(doc).__name__}"
        )
    return [(r, f"{path}: item {i}") for i, r in enumerate(doc)]


def read_records(path: str | Path) -> list[tuple[object, str]]:
    """The prompt records of a JSON file (a list) or a JSON-lines file, by its suffix, with
    where each is: the one reader of record files (module doc)."""
    path = Path(path)
    return read_json_records(path) if path.suffix.lower() == ".json" else read_jsonl_records(path)


def read_prompt_texts(path: str | Path) -> list[str]:
    """The prompt strings of a JSON or JSON-lines file, in file order (empty prompts dropped):
    each record's first user turn."""
    return [v for r, where in read_records(path) if (v := _prompt_from_record(r, where))]


def read_json_prompts(path: str | Path) -> list[str]:
    """The prompts of a JSON file holding a list of records (objects with a prompt field, as in
    Medusa's and Alpaca's evaluation sets, or plain strings)."""
    return [v for r, where in read_json_records(path) if (v := _prompt_from_record(r, where))]


def check_prompt_source(data: str | Path, option: str = "--data") -> None:
    """UserError (naming the file and line, or `option`) for prompts `load_prompts` would refuse,
    found without a tokenizer, so before any model loads: a missing source, a record file that
    does not parse or holds no prompt, an unreadable or non-UTF-8 text file, a directory
    without a text file."""
    path = _data_path(data, option)
    if path.is_dir():
        if not any(p.is_file() and p.suffix.lower() in TEXT_SUFFIXES for p in path.rglob("*")):
            raise UserError(f"{option}: {data}: no text files ({', '.join(TEXT_SUFFIXES[:4])}, ...) in this directory")
    elif path.suffix.lower() in JSONL_SUFFIXES + (".json",):
        records = read_records(path)
        if not any(conversation_from_record(r, where).contexts() for r, where in records):
            raise UserError(f"{path}: no prompts")
    elif not read_text_input(path, "a text file of prompts", MAX_TEXT_BYTES).strip():
        raise UserError(f"{path}: no prompts")


def chat_template_id(tokenizer) -> str | None:
    """``sha256:`` + 16 hex digits of the tokenizer's chat template (None: it has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def render_context(tokenizer, turns, *, template: bool, prefix: list[int], where: str) -> list[int]:
    """Token ids of one prompt context (module doc): through the chat template, with the
    assistant header of the turn to generate, when `template`; else the turns' texts joined by
    blank lines after the tokenizer's special prefix."""
    if not template:
        return list(prefix) + _encode(tokenizer, "\n\n".join(text for _, text in turns))
    messages = [{"role": role, "content": text} for role, text in turns]
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=turns[-1][0] != "assistant"
        )
    except Exception as err:  # jinja2 raises its own errors (e.g. roles that do not alternate)
        raise UserError(
            f"{where}: the chat template rejects this conversation: "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from None
    # the template writes its own special tokens (a BOS) as text
    return _encode(tokenizer, text)


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
    pieces = [ids[i : i + body] for i in range(0, len(ids), body)]
    if len(pieces) > 1 and len(prefix) + len(pieces[-1]) < prompt_tokens // 2:
        pieces.pop()
    return [tuple(prefix) + tuple(p) for p in pieces if p]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_prompts(
    data: str | Path,
    tokenizer,
    *,
    prompt_tokens: int = 128,
    max_prompts: int | None = None,
    chat_template: bool = True,
    with_replies: bool = False,
) -> PromptSet:
    """Load and tokenise the calibration prompts named by `data` (see the module docstring).

    `max_prompts` keeps the first prompts only (after chunking). `chat_template`: put the
    records of a JSON or JSON-lines file through the tokenizer's chat template when it has one
    (`--no-chat-template` turns it off). `with_replies`: each assistant turn is part of its
    prompt (data labels: the reply is the text that labels the heads). Raises `UserError` for
    a missing, unreadable, malformed or empty source.
    """
    if prompt_tokens < 1:
        raise UserError(f"--prompt-tokens: must be at least 1, got {prompt_tokens}")
    if max_prompts is not None and max_prompts < 1:
        raise UserError(f"--max-prompts: must be at least 1, got {max_prompts}")
    path = _data_path(data)
    prefix = _special_prefix(tokenizer)
    skipped: tuple[str, ...] = ()
    data_format, template_used = "text", "none"
    if path.is_dir():
        kind = "text"
        prompts, sha, skipped = _directory_prompts(path, tokenizer, prompt_tokens, max_prompts, prefix)
    elif path.suffix.lower() in JSONL_SUFFIXES + (".json",):
        kind = "jsonl"
        records = read_records(path)
        template_id = chat_template_id(tokenizer) if chat_template else None
        prompts, formats, template_used = _record_prompts(
            records, tokenizer, prefix, prompt_tokens, max_prompts, template_id, with_replies
        )
        template_used = template_used or ("off" if not chat_template else "none")
        data_format = "+".join(formats)
        sha = _sha256_file(path)
    else:
        kind = "text"
        text = read_text_input(path, "a text file of prompts", MAX_TEXT_BYTES)
        prompts = chunk_ids(_encode(tokenizer, text), prompt_tokens, prefix)
        sha = _sha256_file(path)

    if max_prompts is not None:
        prompts = prompts[:max_prompts]
    if not prompts:
        raise UserError(f"{path}: no prompts" + (f" ({len(skipped)} files skipped as not UTF-8)" if skipped else ""))
    return PromptSet(tuple(prompts), str(data), sha, kind, skipped, prompt_tokens, data_format, template_used)


def _data_path(data: str | Path, option: str = "--data") -> Path:
    """The file or directory `data` names (`DEMO_SOURCES`: the bundled prompts), checked to exist."""
    if str(data) in DEMO_SOURCES:
        bundled = DEMO_SOURCES[str(data)]
        if not bundled.is_file():
            raise UserError(f"{data} prompts missing at {bundled}")
        return bundled
    path = Path(data)
    if not path.exists():
        raise UserError(f"{option}: {path} does not exist")
    return path


def _directory_prompts(path: Path, tokenizer, prompt_tokens: int, max_prompts: int | None, prefix: list[int]):
    """The prompts of every text file below `path` (module doc), the directory's sha256 and the
    files skipped as not UTF-8."""
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.suffix.lower() in TEXT_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    total = sum(f.stat().st_size for f in files)
    if total > MAX_TEXT_BYTES:
        raise UserError(f"{path}: its text files hold {total} bytes, more than prompts may be ({MAX_TEXT_BYTES})")
    digest = hashlib.sha256()
    prompts: list[tuple[int, ...]] = []
    skipped: list[str] = []
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
    return prompts, digest.hexdigest(), tuple(skipped)


def _record_prompts(records, tokenizer, prefix, prompt_tokens: int, max_prompts, template_id, with_replies: bool):
    """The prompts of a JSON or JSON-lines file's `records`, the record layouts met (in file
    order) and the template id when a record went through the template `template_id` (None:
    no template), else None."""
    prompts: list[tuple[int, ...]] = []
    formats: list[str] = []
    template_used = None
    for record, where in records:
        if max_prompts is not None and len(prompts) >= max_prompts:
            break
        conversation = conversation_from_record(record, where)
        if conversation.data_format not in formats:
            formats.append(conversation.data_format)
        templated = template_id is not None and not conversation.raw
        template_used = template_id if templated else template_used
        for turns in conversation.contexts(with_replies):
            ids = render_context(tokenizer, turns, template=templated, prefix=prefix, where=where)
            if len(ids) <= len(prefix) and not templated:
                continue  # an empty text
            prompts.append(tuple(_cut(ids, turns, prompt_tokens, len(prefix), templated)))
    return prompts, formats, template_used


def _cut(ids: list[int], turns, prompt_tokens: int, prefix_length: int, templated: bool) -> list[int]:
    """A record's prompt cut to `prompt_tokens` tokens by the module's length rule."""
    if len(ids) > prompt_tokens and turns[-1][0] != "assistant" and (templated or len(turns) > 1):
        # why: the turn to answer and the assistant header end the prompt
        # (docs/formats.md#prompt-data)
        ids = ids[-prompt_tokens:]
    else:
        ids = ids[: max(prefix_length + 1, prompt_tokens)]
    return ids
