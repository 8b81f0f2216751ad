"""Prompt data in the formats people have, each tested on a file written in that exact layout,
and the chat-template path with a template written here."""

from __future__ import annotations

import hashlib
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from calibration.data import load_prompts
from calibration.models import ModelSource, tiny_model_for_tests
from calibration.runner import CalibrationSettings, run_calibration
from treeopt.accuracy import load_accuracy
from treeopt.cli import main
from treeopt.errors import UserError

#: a small chat template in the usual Jinja layout: each turn "<s>R:text" with R the role's
#: first letter, then "a:" for the turn to generate
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'][0] }}:{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)
TEMPLATE_ID = "sha256:" + hashlib.sha256(TEMPLATE.encode()).hexdigest()[:16]

SHAREGPT = [
    {
        "id": "x1",
        "conversations": [
            {"from": "human", "value": "hi"},
            {"from": "gpt", "value": "yo"},
            {"from": "human", "value": "add 2"},
            {"from": "gpt", "value": "4"},
        ],
    },
    {
        "id": "x2",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "why"},
            {"from": "gpt", "value": "so"},
        ],
    },
]
OPENAI = [
    {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": [{"type": "text", "text": "add"}, {"type": "text", "text": " 2"}]},
        ]
    },
]
ALPACA = [
    {"instruction": "sort", "input": "3 1", "output": "1 3"},
    {"instruction": "say hi", "input": "", "output": "hi"},
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def chat_model(tiny, tmp_path_factory):
    """The tiny model with a tokenizer that has a chat template."""
    path = tmp_path_factory.mktemp("chat")
    for f in tiny.iterdir():
        if f.is_file():
            (path / f.name).write_bytes(f.read_bytes())
    (path / "heads").symlink_to(tiny / "heads")
    tok = AutoTokenizer.from_pretrained(str(tiny))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def plain_tok(tiny):
    return AutoTokenizer.from_pretrained(str(tiny))


@pytest.fixture(scope="module")
def chat_tok(chat_model):
    return AutoTokenizer.from_pretrained(str(chat_model))


def ids(tok, text):
    """Token ids of `text`, special tokens written in it included (the tiny tokenizer: one per
    character, "<s>" is BOS = 1)."""
    return tuple(tok(text, add_special_tokens=False)["input_ids"])


def bos(tok, text):
    """Token ids of `text` after the tokenizer's own special prefix (none for the tiny one)."""
    return tuple(tok(text, add_special_tokens=True)["input_ids"])


def write(tmp_path, name, records, jsonl=True):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records) if jsonl else json.dumps(records))
    return path


@pytest.mark.parametrize("jsonl", [True, False])
def test_sharegpt_one_prompt_per_assistant_turn_through_the_template(chat_tok, tmp_path, jsonl):
    path = write(tmp_path, "sharegpt.jsonl" if jsonl else "sharegpt.json", SHAREGPT, jsonl)
    got = load_prompts(path, chat_tok)
    # written by hand from TEMPLATE: earlier turns as context, the generation prompt last
    assert got.token_ids == (
        ids(chat_tok, "<s>u:hia:"),
        ids(chat_tok, "<s>u:hi<s>a:yo<s>u:add 2a:"),
        ids(chat_tok, "<s>s:be brief<s>u:whya:"),
    )
    assert got.token_ids[0][0] == 1  # "<s>" in the template is the BOS token itself
    assert (got.data_format, got.chat_template) == ("sharegpt", TEMPLATE_ID)
    # data labels: each prompt holds its reply
    replies = load_prompts(path, chat_tok, with_replies=True)
    assert replies.token_ids[0] == ids(chat_tok, "<s>u:hi<s>a:yo")
    assert replies.token_ids[1] == ids(chat_tok, "<s>u:hi<s>a:yo<s>u:add 2<s>a:4")


def test_openai_messages_and_a_final_turn_to_answer(chat_tok, plain_tok, tmp_path):
    path = write(tmp_path, "chat.jsonl", OPENAI)
    got = load_prompts(path, chat_tok)
    assert got.token_ids == (ids(chat_tok, "<s>u:hia:"), ids(chat_tok, "<s>u:hi<s>a:yo<s>u:add 2a:"))
    assert got.data_format == "openai"
    # --no-chat-template, or a tokenizer without one: turns joined by blank lines after the BOS
    for tok, template in ((chat_tok, False), (plain_tok, True)):
        raw = load_prompts(path, tok, chat_template=template)
        assert raw.token_ids == (bos(tok, "hi"), bos(tok, "hi\n\nyo\n\nadd 2"))
        assert raw.chat_template == ("off" if not template else "none")


def test_alpaca_instruction_with_input(chat_tok, plain_tok, tmp_path):
    path = write(tmp_path, "alpaca_data.json", ALPACA, jsonl=False)
    assert load_prompts(path, plain_tok).token_ids == (bos(plain_tok, "sort\n\n3 1"), bos(plain_tok, "say hi"))
    templated = load_prompts(path, chat_tok)
    assert templated.token_ids == (ids(chat_tok, "<s>u:sort\n\n3 1a:"), ids(chat_tok, "<s>u:say hia:"))
    assert templated.data_format == "alpaca"
    assert load_prompts(path, plain_tok, with_replies=True).token_ids[0] == bos(plain_tok, "sort\n\n3 1\n\n1 3")


def test_plain_text_and_prompt_records(chat_tok, tmp_path):
    text = tmp_path / "doc.txt"
    text.write_text("abcdefgh" * 4)
    got = load_prompts(text, chat_tok, prompt_tokens=16)
    # running text is never templated: chunks of 16
    assert got.token_ids[0] == bos(chat_tok, "abcdefgh" * 4)[:16]
    assert (got.data_format, got.chat_template) == ("text", "none")
    mixed = write(tmp_path, "mixed.jsonl", [{"prompt": "p"}, {"text": "t"}, {"turns": ["q", "r"]}])
    got = load_prompts(mixed, chat_tok)
    assert got.token_ids == (ids(chat_tok, "<s>u:pa:"), bos(chat_tok, "t"), ids(chat_tok, "<s>u:qa:"))
    assert got.data_format == "prompt+text+mt-bench"


def test_sharegpt_top_level_system_is_the_first_turn(chat_tok, plain_tok, tmp_path):
    """Some ShareGPT dumps keep the system prompt in a `system` field beside the conversation
    (docs/formats.md#prompt-data): it is the conversation's first turn, in every prompt of
    the record; a record that has a system turn of its own keeps just that one."""
    records = [
        {
            "system": "be brief",
            "conversations": [
                {"from": "human", "value": "why"},
                {"from": "gpt", "value": "so"},
                {"from": "human", "value": "hi"},
            ],
        },
        {
            "system": "unused",
            "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "why"}],
        },
    ]
    path = write(tmp_path, "sharegpt.jsonl", records)
    # written by hand from TEMPLATE: the system turn first, then the turns before each reply
    assert load_prompts(path, chat_tok).token_ids == (
        ids(chat_tok, "<s>s:be brief<s>u:whya:"),
        ids(chat_tok, "<s>s:be brief<s>u:why<s>a:so<s>u:hia:"),
        ids(chat_tok, "<s>s:be brief<s>u:whya:"),
    )
    # without a template: the turns' texts joined by blank lines, the system prompt first
    assert load_prompts(path, plain_tok).token_ids[0] == bos(plain_tok, "be brief\n\nwhy")


#: the characters of the BOS tokenizer's vocabulary, by id ("<s>" = 1 is its BOS)
BOS_VOCAB = {"<pad>": 0, "<s>": 1, "</s>": 2, "u": 3, ":": 4, "h": 5, "i": 6, "a": 7, "\n": 8}


@pytest.fixture(scope="module")
def bos_tok():
    """A character tokenizer that puts a BOS in front of every text, as Llama's do (a
    TemplateProcessing post-processor), with TEMPLATE as its chat template."""
    tok = Tokenizer(models.WordLevel(BOS_VOCAB, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>"
    )
    fast.chat_template = TEMPLATE
    return fast


def test_a_bos_adding_tokenizer_gives_every_prompt_one_bos(bos_tok, tmp_path):
    """docs/formats.md#prompt-data: the chat template writes its own special tokens, so a
    templated prompt holds the template's BOS only; without a template the tokenizer's special
    prefix (its BOS) comes first, once, as it does for a text file's chunks."""
    assert bos_tok("hi")["input_ids"] == [1, 5, 6]  # the tokenizer adds its BOS
    path = write(tmp_path, "one.jsonl", [{"prompt": "hi"}])
    # "<s>u:hia:", the template's "<s>" being the BOS token
    assert load_prompts(path, bos_tok).token_ids == ((1, 3, 4, 5, 6, 7, 4),)
    assert load_prompts(path, bos_tok, chat_template=False).token_ids == ((1, 5, 6),)
    text = tmp_path / "doc.txt"
    text.write_text("hihiha")
    assert load_prompts(text, bos_tok, prompt_tokens=4).token_ids == ((1, 5, 6, 5), (1, 6, 5, 7))


def test_long_context_keeps_the_turn_to_answer(chat_tok, plain_tok, tmp_path):
    long = "x" * 40
    path = write(
        tmp_path,
        "long.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": long},
                    {"role": "assistant", "content": "y"},
                    {"role": "user", "content": "z"},
                ]
            }
        ],
    )
    got = load_prompts(path, chat_tok, prompt_tokens=12)
    full = ids(chat_tok, f"<s>u:{long}<s>a:y<s>u:za:")
    assert got.token_ids[1] == full[-12:] and got.token_ids[1][-4:] == ids(chat_tok, "u:za:")[-4:]
    # a one-turn prompt without a template keeps its start, as before
    one = write(tmp_path, "one.jsonl", [{"prompt": long}])
    assert load_prompts(one, plain_tok, prompt_tokens=12).token_ids == (bos(plain_tok, long)[:12],)


def test_bad_conversations(chat_tok, tmp_path):
    cases = {
        "role.jsonl": (
            {"conversations": [{"from": "robot", "value": "a"}]},
            r"role\.jsonl:1: conversations\[0\]\.from: unknown speaker 'robot'",
        ),
        "keys.jsonl": (
            {"messages": [{"role": "user"}]},
            r"keys\.jsonl:1: messages\[0\]: expected an object with 'role' and 'content'",
        ),
        "list.jsonl": ({"messages": "hi"}, r"list\.jsonl:1: field 'messages' is str, expected a list"),
    }
    for name, (record, message) in cases.items():
        with pytest.raises(UserError, match=message):
            load_prompts(write(tmp_path, name, [record]), chat_tok)
    tok = chat_tok
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    try:
        with pytest.raises(
            UserError,
            match=r"one\.jsonl:1: the chat template rejects this conversation: "
            r"roles must alternate",
        ):
            load_prompts(write(tmp_path, "one.jsonl", [{"prompt": "a"}]), tok)
    finally:
        tok.chat_template = TEMPLATE


def test_provenance_names_format_and_template(chat_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    data = write(tmp_path, "sharegpt.json", SHAREGPT * 2, jsonl=False)
    out = tmp_path / "acc.json"
    run_calibration(
        ModelSource(str(chat_model), device="cpu", dtype="float32"),
        str(data),
        output=out,
        settings=CalibrationSettings(steps=5, topk=4, batch_size=4),
        progress=False,
    )
    prov = load_accuracy(out).provenance
    assert (prov["data_format"], prov["chat_template"], prov["prompts"]) == ("sharegpt", TEMPLATE_ID, 6)


def test_data_required_for_a_model_other_than_the_demo(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--model", str(tiny), "-o", str(tmp_path / "a.json")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"treeopt: error: --data: required for --model {tiny}")
    assert not (tmp_path / "a.json").exists()


class _Captured(Exception):
    """Raised by the stand-in decoder: the prompts validation would decode, caught by the test."""


def _validation_prompts(data, tok, monkeypatch):
    """The token ids `treeopt.app.validation.validate` hands to the decoder for `data`."""
    from types import SimpleNamespace

    import treeopt.app.validation as validation

    def capture(lm, tau, sizes, prompts, **_):
        raise _Captured(tuple(tuple(p) for p in prompts))

    monkeypatch.setattr(validation, "measure_acceptance", capture)
    tau = SimpleNamespace(proposal=SimpleNamespace(size=1))
    with pytest.raises(_Captured) as got:
        validation.validate(SimpleNamespace(tokenizer=tok), tau, [1], str(data), progress=False)
    return got.value.args[0]


@pytest.mark.parametrize(
    "name, records, jsonl, expected",
    [
        # the same prompts as calibration's, written by hand from TEMPLATE (the tests above)
        ("sharegpt.json", SHAREGPT, False, ["<s>u:hia:", "<s>u:hi<s>a:yo<s>u:add 2a:", "<s>s:be brief<s>u:whya:"]),
        ("sharegpt.jsonl", SHAREGPT, True, ["<s>u:hia:", "<s>u:hi<s>a:yo<s>u:add 2a:", "<s>s:be brief<s>u:whya:"]),
        ("chat.jsonl", OPENAI, True, ["<s>u:hia:", "<s>u:hi<s>a:yo<s>u:add 2a:"]),
        ("alpaca_data.json", ALPACA, False, ["<s>u:sort\n\n3 1a:", "<s>u:say hia:"]),
    ],
)
def test_validation_data_reads_what_calibration_data_reads(
    chat_tok, tmp_path, monkeypatch, name, records, jsonl, expected
):
    """`validate --data` and `run --validation-data` take every layout `calibrate --data` takes,
    through the same reader: ShareGPT lists, OpenAI messages, Alpaca, each as JSON or JSON lines."""
    path = write(tmp_path, name, records, jsonl)
    assert _validation_prompts(path, chat_tok, monkeypatch) == tuple(ids(chat_tok, t) for t in expected)


def test_validation_data_of_a_text_file(chat_tok, tmp_path, monkeypatch):
    text = tmp_path / "doc.txt"
    text.write_text("abcdefgh" * 4)
    # running text: one prompt (shorter than a validation prompt's 512 tokens), never templated
    assert _validation_prompts(text, chat_tok, monkeypatch) == (bos(chat_tok, "abcdefgh" * 4),)


@pytest.mark.parametrize(
    "name, records, jsonl",
    [("sharegpt.json", SHAREGPT, False), ("chat.jsonl", OPENAI, True), ("alpaca_data.json", ALPACA, False)],
)
def test_run_accepts_validation_data_in_calibration_layouts(tiny, tmp_path, name, records, jsonl):
    """The check `treeopt run` makes of --validation-data before any model loads passes every
    layout calibration reads (and refuses a file that holds none)."""
    from calibration.data import check_prompt_source

    check_prompt_source(write(tmp_path, name, records, jsonl), "--validation-data")
    with pytest.raises(UserError, match=r"empty\.json: no prompts"):
        check_prompt_source(write(tmp_path, "empty.json", [{"prompt": ""}], jsonl=False), "--validation-data")


def test_validation_data_required_for_a_model_other_than_the_demo(tiny, tmp_path, capsys):
    """As calibrate's --data: the demo's held-out prompts stand in for the demo model only;
    for any other model, one line naming the option, exit 2, before anything loads."""
    (tmp_path / "acc.json").write_text("{}")
    for argv in (
        ["validate", "--model", str(tiny), "--accuracy", str(tmp_path / "acc.json"), "-o", str(tmp_path / "v")],
        ["sweep", "--model", str(tiny), "--accuracy", str(tmp_path / "acc.json"), "--end-to-end", "-o", "s.csv"],
    ):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"treeopt: error: --data: required for --model {tiny}")
    assert not (tmp_path / "v").exists()
