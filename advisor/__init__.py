"""The controller: CLI, session, store, reports and the terminal UI; and ``advisor.session()``,
the in-process API (advisor/api.py), for loops that ``advisor attach`` cannot launch."""

__version__ = "0.1.0"

from advisor.api import InProcessSession, session  # noqa: E402  (cheap: the agent loads when a session starts)
from advisor.errors import AdvisorError  # noqa: E402

__all__ = ["AdvisorError", "InProcessSession", "__version__", "session"]
