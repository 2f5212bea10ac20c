"""Command lines that start the advisor's code in a training process (or under torchrun).

``python -m advisor...`` would put the current directory first on ``sys.path``, where a user's
own ``advisor.py`` would shadow this package before a line of ours ran. So the process starts
as ``python -c`` with a two-line launcher that puts this installation's root in that first slot,
imports the module by its full name and runs it as ``__main__``; the bootstrap then hands
``sys.path[0]`` to the script's folder, as ``python SCRIPT`` would. The user's ``PYTHONPATH`` is
left as it was.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The folder that holds the ``advisor`` package (a source checkout or site-packages).
ADVISOR_ROOT = str(Path(__file__).resolve().parents[1])

BOOTSTRAP = "advisor.agent.bootstrap"
COMM_BENCH = "advisor.probes.comm.bench"


def python_command(module: str, args: list[str]) -> list[str]:
    """``python -c LAUNCHER ARGS``: run ``module`` as ``__main__`` with ``ARGS`` as its argv."""
    code = (f"import runpy, sys; sys.path[0] = {ADVISOR_ROOT!r}; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code, *args]


def torchrun_command(nproc_per_node: int, module: str, args: list[str],
                     rendezvous: list[str] | None = None) -> list[str]:
    """PyTorch's own launcher, each rank started through ``python_command`` (``--no-python`` runs
    it as given). Without ``rendezvous`` options (one node) it runs ``--standalone``, which picks a
    free rendezvous port on this host; with them (``--nnodes``, ``--rdzv-endpoint``, ... as
    ``MultiNode.torchrun_options`` gives them) they go to torchrun as they are."""
    where = list(rendezvous) if rendezvous else ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", *where,
            f"--nproc-per-node={nproc_per_node}", "--no-python", *python_command(module, args)]
