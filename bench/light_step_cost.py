"""Where a light step's agent time goes: each hook callback's own time, per step, in one process.

    python bench/light_step_cost.py                   # the 20 ms MLP of the whole-process bench, 1 thread
    python bench/light_step_cost.py --probes all --steps 400
    python bench/light_step_cost.py --model gpt       # examples/gpt.py's model

The agent is installed as ``bench/overhead_inproc.py`` installs it (its records through a real
``AgentChannel``, deep probes off, light block timing on), and each of its callbacks (a forward
pre/post hook, the backward's start and end, the optimizer's pre and post hooks, zero_grad) is
timed with ``time.perf_counter_ns`` around it, and so is the lifting of the module hooks around a
top-level forward and a backward (advisor/agent/forward_hooks.py). Printed: calls and microseconds per step of each,
their sum, and that sum over the measured step time; then the channel's sender thread's CPU time
per step over the same steps (``/proc``: user and system time, so its waits' kernel time too; the
part it runs under the interpreter lock is what the training thread can wait for between ops). The callbacks run once a step between
milliseconds of the user's kernels, so their code and data are cold: they cost many times what a
loop of the same calls measures, which is why this times them in place. What it leaves out: the
global hook's own dispatch (``bench/module_hooks.py``) and what the agent's work evicts from the
caches for the kernels after it (only a side-by-side run shows that: ``bench/overhead_inproc.py``
and ``bench/overhead.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead_inproc import gpt_step, make_agent, mlp_step  # noqa: E402

from advisor.agent.hooks import install  # noqa: E402

CALLBACKS = ("forward_pre", "forward_post", "backward_start", "backward_end", "optimizer_pre",
             "optimizer_post", "zero_grad_called")
# advisor/agent/forward_hooks.py: taking the module hooks off for a top-level forward or a
# backward and putting them back (the hooks call these beside the agent's callbacks).
LIFTING = ("lift", "_forward_ended", "lift_for_backward", "end_backward")


def timed_callbacks(agent, spent: dict[str, int], calls: dict[str, int], owner=None, names=CALLBACKS) -> None:
    """Wrap each of ``owner``'s (the agent's) callbacks ``names`` (an instance attribute over the
    method) to add its time."""
    owner = agent if owner is None else owner
    for name in names:
        method = getattr(owner, name)

        def timed(*args, _method=method, _name=name, **kwargs):
            start = time.perf_counter_ns()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_name] += time.perf_counter_ns() - start
                calls[_name] += 1

        setattr(owner, name, timed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    p.add_argument("--mlp", default="768,4,64", help="hidden,layers,batch of the MLP")
    p.add_argument("--probes", choices=["all", "none"], default="none")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch threads; 0 keeps torch's default")
    ns = p.parse_args(argv)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    if ns.model == "mlp":
        hidden, layers, batch = (int(v) for v in ns.mlp.split(","))
        step = mlp_step(hidden, layers, batch)
    else:
        step = gpt_step([])
    agent, sink = make_agent(ns.probes, deep=False)
    spent: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    timed_callbacks(agent, spent, calls)
    hooks = install(agent)
    # The lifting's own calls, timed on their own (``_forward_ended`` calls ``forward_post``, timed
    # above too: its row is the lifting's work around it).
    timed_callbacks(agent, spent, calls, agent.hooks_aside.__self__, LIFTING)
    try:
        for _ in range(20):  # warm-up: the model found, the period learned
            step()
        spent.clear()
        calls.clear()
        sender_before = thread_cpu_s(sink.channel._sender.native_id)
        times = []
        for _ in range(ns.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        sender_s = thread_cpu_s(sink.channel._sender.native_id) - sender_before
    finally:
        hooks.remove()
        sink.channel.close()
    median = statistics.median(times)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {ns.model}, probes {ns.probes}, "
          f"{ns.steps} steps, median step {median * 1e3:.2f} ms")
    print(f"{'callback':18} {'calls/step':>10} {'us/step':>9}")
    for name in sorted(spent, key=lambda n: -spent[n]):
        print(f"{name:18} {calls[name] / ns.steps:10.1f} {spent[name] / ns.steps / 1e3:9.1f}")
    total = sum(spent[n] for n in spent if n != "_forward_ended") / ns.steps / 1e3  # forward_post is inside it
    print(f"{'all callbacks':18} {'':10} {total:9.1f}  = {total / (median * 1e6):.2%} of the median step")
    if sender_s == sender_s:  # not NaN: /proc was readable
        sender = sender_s / ns.steps * 1e6
        print(f"{'sender thread CPU':18} {'':10} {sender:9.1f}  = {sender / (median * 1e6):.2%} of the median step "
              f"(clock ticks: +-{1e6 / os.sysconf('SC_CLK_TCK') / ns.steps:.0f} us a step)")
    return 0


def thread_cpu_s(native_id: int | None) -> float:
    """User plus system CPU seconds of this process's thread ``native_id`` (NaN where /proc cannot say)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
