"""Entry point of a fitting process (``advisor fit``), started like the agent's bootstrap.

The agent's own bootstrap (``advisor.agent.bootstrap``) runs the script, with the fake world of
``advisor.fit.run.FitRun`` entered around it; everything else (the agent, its probes, the channel,
how the script's end is recorded) is an attach's.
"""

from __future__ import annotations

import sys

from advisor.agent import bootstrap
from advisor.fit.run import FitRun


def main(argv: list[str] | None = None) -> int:
    return bootstrap.main(argv, around_script=FitRun)


if __name__ == "__main__":
    sys.exit(main())
