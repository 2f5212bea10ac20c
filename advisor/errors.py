"""User-facing failures: one line, a hint, and an exit code that means something."""

from __future__ import annotations

# Exit codes of the advisor itself (a finished run exits with the script's own code).
EXIT_USAGE = 2  # bad command line, missing or unusable script
EXIT_SESSION = 3  # a session that cannot be found or read
EXIT_LAUNCH = 4  # the training process could not be started
EXIT_INTERRUPTED = 130


class AdvisorError(Exception):
    """An error shown to the user as ``advisor: error: MESSAGE`` plus ``hint: HINT``."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(AdvisorError):
    exit_code = EXIT_USAGE


class SessionError(AdvisorError):
    exit_code = EXIT_SESSION
