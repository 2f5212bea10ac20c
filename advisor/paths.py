"""Where sessions live, and owner-only permissions for everything written there."""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path

from advisor.errors import SessionError

DB_NAME = "session.sqlite"

_user_umask: int | None = None


def restrict_umask() -> None:
    """Make the controller's own files owner-only; the user's umask is kept for the script."""
    global _user_umask
    previous = os.umask(0o077)
    if _user_umask is None:
        _user_umask = previous


def user_umask() -> int:
    """The umask the user ran the advisor with (what the training script must get)."""
    if _user_umask is not None:
        return _user_umask
    current = os.umask(0o077)
    os.umask(current)
    return current


def advisor_home() -> Path:
    """``$ADVISOR_HOME``, else ``$XDG_DATA_HOME/advisor``, else ``~/.local/share/advisor``."""
    if os.environ.get("ADVISOR_HOME"):
        return Path(os.environ["ADVISOR_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "advisor"


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it readable by its owner only."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def sessions_dir() -> Path:
    return private_dir(advisor_home() / "sessions")


def new_session_dir(script: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(script).stem)[:32] or "script"
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}-{secrets.token_hex(2)}"
    return private_dir(sessions_dir() / name)


def resolve_session(ref: str) -> Path:
    """A session id, a session folder or its ``session.sqlite`` file -> the database path."""
    candidates = [Path(ref), Path(ref) / DB_NAME, sessions_dir() / ref / DB_NAME]
    if ref == "latest":
        found = sorted(sessions_dir().glob(f"*/{DB_NAME}"))
        if found:
            return found[-1]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    matches = sorted(sessions_dir().glob(f"*{ref}*/{DB_NAME}"))
    if len(matches) == 1:
        return matches[0]
    raise SessionError(f"no session {ref!r}", hint="`advisor sessions` lists them; pass an id, a folder or a .sqlite file")
