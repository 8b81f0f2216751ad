"""The one exception type for bad user input.

Library code raises `UserError` with a message that names the file or argument and says what
is wrong; the CLI prints it as one line and exits with status 2.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user: a file, an argument, a value. The message is shown as is.

    `param` names the library argument at fault (snake_case, e.g. ``max_depth``) so that the
    command line can name its own option (``--max-depth``) instead.
    """

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.detail = message
