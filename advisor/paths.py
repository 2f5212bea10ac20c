"""Where sessions live, and owner-only permissions for everything written there."""

from __future__ import annotations

import base64
import glob
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
    """Create ``path`` (and parents) and make it readable by its owner only (writers only: a read
    path must work on a read-only home, so it never calls this)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.stat(path).st_mode & 0o777 != 0o700:
        os.chmod(path, 0o700)
    return path


def sessions_dir(*, create: bool = True) -> Path:
    """The sessions folder; ``create=False`` for read paths, which never create or chmod anything."""
    folder = advisor_home() / "sessions"
    return private_dir(folder) if create else folder


SESSION_NAME_TRIES = 8


def new_session_dir(script: str) -> Path:
    """A new, empty session folder, owner-only, whose name no other controller can take.

    The name is the time to the millisecond (names sort by creation), the script's stem and 64
    random bits: hundreds of same-script sessions starting at once on a shared home (a Slurm
    array) collided with a second-resolution time and 16 random bits. ``mkdir`` is the claim
    (``EEXIST`` is never taken over): on a collision a new name is drawn.
    """
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(script).stem)[:32] or "script"
    parent = sessions_dir()
    for _ in range(SESSION_NAME_TRIES):
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
        folder = parent / f"{stamp}-{stem}-{_random_tag()}"
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
        return folder
    raise SessionError(f"could not create a new session folder in {parent}: {SESSION_NAME_TRIES} names were taken",
                       hint="is something creating folders there? retry, or set ADVISOR_HOME")


def _random_tag() -> str:
    """64 random bits in 13 characters (base32, lowercase): ids stay short enough to list."""
    return base64.b32encode(secrets.token_bytes(8)).decode().rstrip("=").lower()


def resolve_session(ref: str) -> Path:
    """A session id, a session folder or its ``session.sqlite`` file -> the database path."""
    home = sessions_dir(create=False)
    candidates = [Path(ref), Path(ref) / DB_NAME, home / ref / DB_NAME]
    if ref == "latest":
        found = sorted(home.glob(f"*/{DB_NAME}"))
        if found:
            return found[-1]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    matches = sorted(home.glob(f"*{glob.escape(ref)}*/{DB_NAME}"))
    if len(matches) == 1:
        return matches[0]
    raise SessionError(f"no session {ref!r}", hint="`advisor sessions` lists them; pass an id, a folder or a .sqlite file")
