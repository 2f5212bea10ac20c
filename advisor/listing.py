"""``advisor sessions``: the recorded sessions, newest last."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from advisor.errors import SessionError
from advisor.paths import DB_NAME, sessions_dir
from advisor.render import report_console
from advisor.rich_text import name_text
from advisor.store import load_state, read_meta


NARROW = 110  # columns below which the listing leaves out "created"


@dataclass(frozen=True, kw_only=True)
class SessionRow:
    """One recorded session as ``advisor sessions`` lists it (and ``advisor mcp``'s list_sessions)."""

    id: str
    path: Path  # its database
    created: float | None = None  # seconds since 1970
    script: str = ""
    status: str = ""  # "exit 0: completed", "running or interrupted", "unreadable: ...", "...; store incomplete"
    finished: bool = False
    exit_code: int | None = None
    readable: bool = True


def session_rows(home: Path | None = None) -> list[SessionRow]:
    """Every session under ``home`` (the sessions folder), oldest first; never writes anything."""
    home = home if home is not None else sessions_dir(create=False)  # a read path, even on a read-only home
    rows = []
    for db in sorted(home.glob(f"*/{DB_NAME}")):
        try:
            meta = read_meta(db)
        except (SessionError, OSError) as exc:  # one bad session never hides the others
            rows.append(SessionRow(id=db.parent.name, path=db, status=f"unreadable: {_why(exc, db)}", readable=False))
            continue
        finished = bool(meta.get("finished"))
        status = f"exit {meta.get('exit_code')}: {meta.get('exit_reason', '')}" if finished else _unfinished_status(db)
        if isinstance(meta.get("store_error"), dict):  # the disk filled up (or failed) while it recorded
            status += f"; store incomplete ({meta['store_error'].get('error')})"
        rows.append(SessionRow(id=db.parent.name, path=db, created=meta.get("created"),
                               script=str(meta.get("script", "")), status=status, finished=finished,
                               exit_code=meta.get("exit_code") if finished else None))
    return rows


def print_sessions(console: Console | None = None) -> int:
    console = console or report_console(sys.stdout)  # off a terminal: COLUMNS, at least 120
    home = sessions_dir(create=False)
    rows = session_rows(home)
    if not rows:
        console.print(f"no sessions yet in {home}; `advisor attach SCRIPT` records one")
        return 0
    # A session id (its time to the millisecond, the script, 64 random bits) takes 40-odd columns:
    # on a narrow terminal the "created" column, which the id begins with anyway, is left out, and
    # the script's path gives way before the status, which is what the listing is read for.
    narrow = console.width < NARROW
    table = Table(title=f"sessions in {home}")
    table.add_column("id", no_wrap=True)
    if not narrow:
        table.add_column("created", no_wrap=True)
    table.add_column("script", overflow="ellipsis", max_width=40, min_width=6)
    table.add_column("status", min_width=16)
    for row in rows:
        if not row.readable:
            cells = [name_text(row.id), "", "", name_text(row.status, style="red")]
        else:
            created = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.created or 0))
            # Script paths and exit reasons come from the user's process: text, never markup, and
            # never a terminal's control sequence (an ESC in an exit reason reached the terminal).
            cells = [name_text(row.id), created, name_text(row.script), name_text(row.status)]
        table.add_row(*(cells[:1] + cells[2:] if narrow else cells))
    console.print(table)
    return 0


def _unfinished_status(db: Path) -> str:
    """A session whose controller stopped: finished all the same if every rank reported its exit."""
    try:
        state = load_state(db)
    except (SessionError, OSError):
        return "running or interrupted"
    if state.finished:
        return f"exit {state.exit_code}: {state.exit_reason}"
    return "running or interrupted"


def _why(exc: Exception, db: Path) -> str:
    """The error without the path the row already names."""
    return str(exc).replace(f"{db}: ", "").replace(str(db), "the file")[:120]
