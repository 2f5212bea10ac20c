"""``advisor sessions``: the recorded sessions, newest last."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from advisor.errors import SessionError
from advisor.paths import DB_NAME, sessions_dir
from advisor.store import load_state, read_meta


def print_sessions(console: Console | None = None) -> int:
    console = console or Console()
    home = sessions_dir(create=False)  # a read path: nothing is created, even on a read-only home
    rows = sorted(home.glob(f"*/{DB_NAME}"))
    if not rows:
        console.print(f"no sessions yet in {home}; `advisor attach SCRIPT` records one")
        return 0
    table = Table(title=f"sessions in {home}")
    table.add_column("id", no_wrap=True)
    table.add_column("created", no_wrap=True)
    table.add_column("script", overflow="ellipsis", max_width=40)
    table.add_column("status")
    for db in rows:
        try:
            meta = read_meta(db)
        except (SessionError, OSError) as exc:  # one bad session never hides the others
            table.add_row(Text(db.parent.name), "", "", Text(f"unreadable: {_why(exc, db)}", style="red"))
            continue
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(meta.get("created", 0)))
        status = (f"exit {meta.get('exit_code')}: {meta.get('exit_reason', '')}" if meta.get("finished")
                  else _unfinished_status(db))
        if isinstance(meta.get("store_error"), dict):  # the disk filled up (or failed) while it recorded
            status += f"; store incomplete ({meta['store_error'].get('error')})"
        # Script paths and exit reasons come from the user's process: text, never markup.
        table.add_row(Text(db.parent.name), created, Text(str(meta.get("script", ""))), Text(status))
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
