"""The one exception type for bad user input.

Library code raises `UserError` with a message that names the file or argument and says what
is wrong; the CLI prints it as one line and exits with status 2.
"""

from __future__ import annotations

import re


class UserError(ValueError):
    """Bad input from the user: a file, an argument, a value. The message is shown as is.

    `param` names the library argument at fault (snake_case, e.g. ``max_depth``) so that the
    command line can name its own option (``--max-depth``) instead.
    """

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.detail = message


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_UNSAFE_GLOBAL = re.compile(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)")


def first_line(err: BaseException | str) -> str:
    """An error's message cut to one line, for a one-line `UserError`.

    torch and transformers raise multi-line messages; a bad input is reported on one line
    (docs/formats.md). torch's refusal of a pickle that holds code (a safe, weights-only load)
    advises turning that safety off, which would run the code: the message becomes a statement
    of what the file holds instead, and no sentence naming the option is ever passed on.
    """
    text = _ANSI.sub("", str(err))
    if text.startswith("Weights only load failed"):
        found = _UNSAFE_GLOBAL.search(text)
        if found is None:  # not a pickle of tensors at all (a damaged or foreign file)
            return "not a PyTorch checkpoint of tensors (a weights-only load refused it)"
        return f"holds Python objects other than tensors ({found.group(1)}), refused: it could run code"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else (type(err).__name__ if isinstance(err, BaseException) else "")
    sentences = [s for s in re.split(r"(?<=\.)\s+", line) if "weights_only" not in s]
    return " ".join(sentences) or "not a readable file"
