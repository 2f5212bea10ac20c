"""``advisor``: the command line. ``main(argv) -> exit code``; every user error is one line and a hint."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from advisor import __version__
from advisor.errors import AdvisorError, UsageError
from advisor.records.settings import probe_names
from advisor.records.units import parse_size

# Each cmd_* imports its command's modules inside the function, on purpose: `advisor --help`
# and `advisor sessions` stay fast and never load rich/textual/torch-side code they do not use.
# These are the only deferred imports of our own modules in the controller (with advisor/tui's
# lazy textual import); tests/test_import_graph.py still sees them.


def _size(value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _steps_list(value: str) -> list[int]:
    try:
        steps = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected step numbers like 1,2,3, got {value!r}") from None
    if any(s < 1 for s in steps):
        raise argparse.ArgumentTypeError("deep steps start at 1 (step 0 is the warm-up step)")
    return steps


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {number}")
    return number


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and a hint, exit code 2
        raise UsageError(message, hint=f"`{self.prog} --help` lists the options")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="advisor", description="Profile a PyTorch training script, diagnose its "
                     "bottleneck, and apply remedies while it trains.")
    parser.add_argument("--version", action="version", version=f"advisor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    attach = sub.add_parser("attach", help="run a training script under the advisor",
                            description="Run SCRIPT with ARGS, unmodified, under the advisor.")
    attach.add_argument("--nproc-per-node", type=_positive, default=1, metavar="N",
                        help="launch N ranks with torch.distributed.run (default 1)")
    attach.add_argument("--headless", action="store_true", help="progress lines and a final report, no TUI")
    attach.add_argument("--steps", type=_positive, metavar="N", help="stop the script cleanly after N optimizer steps")
    attach.add_argument("--json", metavar="FILE", help="write the report as JSON (schema advisor.report/1)")
    attach.add_argument("--memory-budget", type=_size, metavar="SIZE",
                        help="memory capacity to plan against, e.g. 12GiB (default: the device's memory)")
    attach.add_argument("--enforce-budget", action="store_true",
                        help="raise PyTorch's out-of-memory error when tracked memory exceeds the budget")
    attach.add_argument("--probes", default="all", metavar="LIST",
                        help="probes to run: memory,compute,comm, all or none (default all)")
    attach.add_argument("--deep-steps", type=_steps_list, default=[1, 2, 3], metavar="LIST",
                        help="steps to deep-sample (default 1,2,3; step 0 is the warm-up)")
    attach.add_argument("--deep-every", type=int, default=100, metavar="N",
                        help="also deep-sample every N-th step (0: never; default 100)")
    attach.add_argument("--peak-flops", type=float, metavar="FLOPS", help="override the device's peak FLOP/s")
    attach.add_argument("--peak-bandwidth", type=float, metavar="B/S", help="override the device's memory bandwidth")
    attach.add_argument("--apply", metavar="auto|ID", help="apply the top (auto) or the named recommendation")
    attach.add_argument("--apply-at-step", type=_positive, metavar="K", help="step boundary to apply at (default: as soon as ready)")
    attach.add_argument("--plan", metavar="FILE", help="apply a plan file's remedies before the first step")
    attach.add_argument("--allow-inexact", action="store_true",
                        help="allow live remedies that change numerics (apply class live-opt-in)")
    attach.add_argument("script", metavar="SCRIPT", help="the training script")
    attach.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")

    sub.add_parser("sessions", help="list recorded sessions")

    report = sub.add_parser("report", help="report a recorded session")
    report.add_argument("session", metavar="SESSION", help="session id, folder, .sqlite file, or 'latest'")
    report.add_argument("--json", metavar="FILE", help="write the report as JSON instead of printing it")
    report.add_argument("--trace", metavar="FILE", help="export the timelines as Chrome/Perfetto trace JSON")
    report.add_argument("--memory-budget", type=_size, metavar="SIZE", help="re-advise against this budget")

    plan = sub.add_parser("plan", help="write a plan of remedies from a recorded session")
    plan.add_argument("session", metavar="SESSION")
    plan.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the plan JSON")
    plan.add_argument("--memory-budget", type=_size, metavar="SIZE", help="budget to plan against")
    plan.add_argument("--recommendation", metavar="ID", help="which recommendation (default: the top one)")

    bench = sub.add_parser("bench-comm", help="measure collective bus bandwidth on this machine's ranks")
    bench.add_argument("--nproc-per-node", type=_positive, default=2, metavar="N")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="options passed to advisor.probes.comm.bench")
    return parser


def check_script(path: str) -> None:
    """Fail early, in one line, on a script Python could not run."""
    script = Path(path)
    if not script.exists():
        raise UsageError(f"no such script: {path}", hint="check the path; it is relative to the current folder")
    if not script.is_file():
        raise UsageError(f"not a file: {path}", hint="pass the training script itself, e.g. train.py")
    try:
        source = script.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", hint="check the file's permissions") from None
    if b"\0" in source[:8192]:
        raise UsageError(f"{path} is not a Python file (it looks binary)", hint="pass a .py training script")
    try:
        compile(source, str(script), "exec")
    except SyntaxError as exc:
        raise AdvisorError(f"{path}:{exc.lineno}: {exc.msg}", hint="the script has a syntax error; "
                           "`python SCRIPT` shows the same", exit_code=1) from None
    except ValueError as exc:
        raise UsageError(f"{path} is not a Python file ({exc})", hint="pass a .py training script") from None


def agent_config(ns: argparse.Namespace) -> dict[str, Any]:

    try:
        probes = probe_names(ns.probes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    config: dict[str, Any] = {
        "probes": probes,
        "deep_steps": ns.deep_steps,
        "deep_every": ns.deep_every,
        "memory_budget_bytes": ns.memory_budget,
        "enforce_budget": ns.enforce_budget,
        "peak_flops": ns.peak_flops,
        "peak_bandwidth": ns.peak_bandwidth,
        "allow_inexact": bool(getattr(ns, "allow_inexact", False)),
    }
    if ns.plan:
        if not os.path.isfile(ns.plan):
            raise UsageError(f"no such plan file: {ns.plan}", hint="`advisor plan SESSION -o plan.json` writes one")
        # Torch-free: each remedy's recommend-side spec checks its params; the training process
        # checks them again against the applier when it loads the plan.
        from advisor.recommend.remedies import check_params
        from advisor.records.plan import read_plan

        try:
            plan = read_plan(ns.plan, check=check_params)
        except ValueError as exc:
            raise UsageError(f"bad plan file {ns.plan}: {exc}") from None
        config["plan"] = os.path.abspath(ns.plan)
        if plan.env:  # set in the training process's environment (advisor/session.py)
            config["plan_env"] = dict(plan.env)
    if ns.enforce_budget and ns.memory_budget is None:
        raise UsageError("--enforce-budget needs --memory-budget", hint="e.g. --memory-budget 800MiB --enforce-budget")
    return config


def cmd_attach(ns: argparse.Namespace) -> int:
    from advisor.attach import run_attach

    check_script(ns.script)
    if ns.apply_at_step and not ns.apply:
        raise UsageError("--apply-at-step needs --apply", hint="e.g. --apply auto --apply-at-step 5")
    return run_attach(ns, agent_config(ns))


def cmd_sessions(ns: argparse.Namespace) -> int:
    from advisor.listing import print_sessions

    return print_sessions()


def cmd_report(ns: argparse.Namespace) -> int:
    from advisor.paths import resolve_session
    from advisor.report import build_report, write_json
    from advisor.store import load_state

    state = load_state(resolve_session(ns.session))
    report = build_report(state, budget_bytes=ns.memory_budget)
    if ns.trace:
        from advisor.trace import write_trace

        write_trace(state, ns.trace)
        print(f"wrote trace {ns.trace}", file=sys.stderr)
    if ns.json:
        write_json(report, ns.json)
        print(f"wrote report {ns.json}", file=sys.stderr)
    if not ns.json and not ns.trace:
        from advisor.render import print_report

        print_report(report)
    return 0


def cmd_plan(ns: argparse.Namespace) -> int:
    from advisor.paths import resolve_session
    from advisor.planning import write_plan_from_session

    return write_plan_from_session(resolve_session(ns.session), ns.output,
                                   budget_bytes=ns.memory_budget, recommendation_id=ns.recommendation)


def cmd_bench_comm(ns: argparse.Namespace) -> int:
    import subprocess

    from advisor.launch import COMM_BENCH, torchrun_command

    return subprocess.call(torchrun_command(ns.nproc_per_node, COMM_BENCH, list(ns.args)))


COMMANDS = {"attach": cmd_attach, "sessions": cmd_sessions, "report": cmd_report,
            "plan": cmd_plan, "bench-comm": cmd_bench_comm}


def main(argv: list[str] | None = None) -> int:
    # Everything the controller writes (store, reports, plans) is readable by its owner only.
    os.umask(0o077)
    try:
        ns = build_parser().parse_args(argv)
        return COMMANDS[ns.command](ns)
    except AdvisorError as exc:
        print(f"advisor: error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("advisor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
