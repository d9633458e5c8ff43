"""The base class of errors a user fixes by changing the command, the config or the machine's set-up.

Such an error's message says what is wrong and what is valid or what to do, so run.py shows the message alone,
without a traceback (the job's log file keeps the traceback).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or a missing resource; the message names it and says what is valid or what to do."""


class InputError(UserError, ValueError):
    """A refused value, file or folder content (a ValueError for callers that catch those), shown without traceback."""
