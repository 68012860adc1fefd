"""The one exception type for what a user can fix.

Raised deep, rendered once by the CLI as a single line (plus an optional hint) with exit code 2.
Anything else that escapes is a bug and shows its traceback only with --debug.
"""

import errno


class UserError(Exception):
    """A problem the user can fix: bad input, a port in use, an unreachable server."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class EngineFailed(UserError):
    """The engine process died or never became ready. Carries the evidence for the message."""

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None,
                 log_tail: list[str] | None = None):
        super().__init__(message, hint)
        self.engine_exit_code = exit_code
        self.log_tail = log_tail or []
        # The failed launch as a record (records.LaunchResult), so a run directory can keep the evidence.
        self.launch_result = None


def os_error_words(exc: OSError) -> str:
    """'No space left on device (ENOSPC)': the reason and the errno's name, for one-line messages."""
    name = errno.errorcode.get(exc.errno or 0)
    reason = exc.strerror or str(exc)
    return f"{reason} ({name})" if name else reason
