"""``advisor``: the command line. ``main(argv) -> exit code``; every user error is one line and a hint."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from advisor import __version__
from advisor.errors import AdvisorError, UsageError
from advisor.multinode import add_options as add_multinode_options
from advisor.multinode import from_namespace as multinode_from_namespace
from advisor.records.fit import target_names
from advisor.records.settings import AgentSettings, probe_names
from advisor.records.units import parse_rate, parse_size

# Each cmd_* imports its command's modules inside the function, on purpose: `advisor --help`
# and `advisor sessions` stay fast and never load rich/textual/torch-side code they do not use.
# These are the only deferred imports of our own modules in the controller (with advisor/tui's
# lazy textual import); tests/test_import_graph.py still sees them.


SIZE_FORMS = "a number with a unit, e.g. 24GiB, 800MiB or 1.5GB"
BARE_BYTES_FROM = 2**20  # a bare number is taken as bytes only from 1 MiB up: "24" meant 24 GB, not 24 B


def _size(value: str) -> int:
    text = value.strip()
    if text.startswith("-"):
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {value!r}; write {SIZE_FORMS}")
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if re.fullmatch(r"[0-9.]+", text) and 0 < size < BARE_BYTES_FROM:  # 0 is 0 in any unit
        raise argparse.ArgumentTypeError(
            f"{value!r} has no unit: write {SIZE_FORMS} (a bare number counts as bytes only from "
            f"{BARE_BYTES_FROM} up)")
    return size


def _rate(value: str) -> float:
    try:
        rate = parse_rate(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    body = value.strip().removesuffix("/s").strip()
    if rate < BARE_BYTES_FROM and body.replace(".", "", 1).replace("e", "", 1).isdigit():
        # "--host-link-bandwidth 5" meant 5 GB/s, not 5 B/s (as "--memory-budget 24" meant 24 GB)
        raise argparse.ArgumentTypeError(
            f"{value!r} has no unit: write a rate, e.g. 25GB/s or 12.5GiB/s (a bare number counts as bytes "
            f"per second only from {BARE_BYTES_FROM} up)")
    return rate


def _budget(value: str) -> int:
    size = _size(value)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"a memory budget must be more than 0 bytes, got {value!r}")
    return size


def _probes(value: str) -> str:
    try:
        probe_names(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _target(value: str) -> str:
    if value not in target_names():
        raise argparse.ArgumentTypeError(f"unknown target {value!r}; valid: {', '.join(target_names())}")
    return value


def _apply_choice(value: str) -> str:
    if value == "auto" or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*", value):
        return value
    raise argparse.ArgumentTypeError(f"expected 'auto' or a recommendation id such as checkpoint-blocks-4 or zero-3+ckpt-2, got {value!r}")


def _log_target(value: str) -> Any:
    from advisor.trackers import parse_target  # its writers load their tools only when used

    try:
        return parse_target(value)
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
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No prefix matching: `--headles` must be an error, not silently `--headless`.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # "-5GB" is a (negative) value, not an option: argparse only knew "-5" and "-.5", and said
        # "expected one argument" for --memory-budget -5GB. No option of ours looks like a number.
        self._negative_number_matcher = re.compile(r"^-\.?[0-9][0-9.]*[A-Za-z/]*$")

    def error(self, message: str) -> None:  # one line and a hint, exit code 2
        raise UsageError(message, hint=f"`{self.prog} --help` lists the options")


REPORT_FORMATS = ("text", "json", "markdown")


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
    attach.add_argument("--report", metavar="FILE",
                        help="write the final report to FILE (in --format) instead of the terminal")
    attach.add_argument("--format", choices=REPORT_FORMATS, default="text",
                        help="the final report's format: text (default), json or markdown")
    attach.add_argument("--memory-budget", type=_budget, metavar="SIZE",
                        help="memory capacity to plan against, e.g. 12GiB (default: the device's memory)")
    attach.add_argument("--enforce-budget", action="store_true",
                        help="raise PyTorch's out-of-memory error when tracked memory exceeds the budget")
    attach.add_argument("--probes", type=_probes, default="all", metavar="LIST",
                        help="probes to run: memory,compute,comm, all or none (default all)")
    attach.add_argument("--deep-compiled", action="store_true",
                        help="deep-sample a torch.compile'd model with the memory and compute probes too "
                             "(they run it outside its compiled code on those steps, which changes its numerics)")
    attach.add_argument("--deep-steps", type=_steps_list, default=[1, 2, 3], metavar="LIST",
                        help="steps to deep-sample (default 1,2,3; step 0 is the warm-up; the compute "
                             "probe counts ops and then times them on two steps of its own after the first of a run)")
    attach.add_argument("--deep-every", type=int, default=100, metavar="N",
                        help="also deep-sample every N-th step, the period doubling after every ten such steps up to "
                             "64N (0: never; default 100)")
    attach.add_argument("--peak-flops", type=float, metavar="FLOPS", help="override the device's peak FLOP/s")
    attach.add_argument("--peak-bandwidth", type=float, metavar="B/S", help="override the device's memory bandwidth")
    attach.add_argument("--host-link-bandwidth", type=_rate, metavar="RATE",
                        help="override the measured host-device copy bandwidth, e.g. 25GB/s (offload plans)")
    attach.add_argument("--apply", type=_apply_choice, metavar="auto|ID", help="apply the top live recommendation that fits the memory budget (auto) or the named one")
    attach.add_argument("--apply-at-step", type=_positive, metavar="K", help="step boundary to apply at (default: as soon as ready: after the first ordinary step that follows the deep-sampled ones); the job waits at the boundary before it, up to 60 s, for the advice that decides it")
    attach.add_argument("--plan", metavar="FILE", help="apply a plan file's remedies before the first step")
    attach.add_argument("--allow-inexact", action="store_true",
                        help="allow live remedies that change numerics (apply class live-opt-in)")
    attach.add_argument("--log-to", type=_log_target, action="append", metavar="TOOL[:WHERE]",
                        help="also log the findings, the applies and the step-time and memory series to "
                             "tensorboard[:DIR], mlflow[:TRACKING_URI] or wandb[:PROJECT] (repeatable)")
    add_multinode_options(attach)
    # Optional to argparse so that a missing SCRIPT gets an accurate message (cmd_attach).
    attach.add_argument("script", metavar="SCRIPT", nargs="?", help="the training script")
    attach.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")

    fit = sub.add_parser("fit", help="plan a job for a device this machine does not have",
                         description="Run SCRIPT with ARGS, unmodified, in one process on fake tensors placed on "
                         "the target device, for its first optimizer steps, and report per rank the predicted peak "
                         "memory, the roofline step time, whether it fits and, if not, the best plan.")
    fit.add_argument("--target", type=_target, default="cpu", metavar="DEVICE",
                     help="the device to plan for: cpu (default), h100, h100-pcie, h200, a100-80gb, a100-40gb, "
                          "a10, l4, v100, t4")
    fit.add_argument("--nproc-per-node", type=_positive, default=1, metavar="N",
                     help="ranks per node of the planned job (default 1); the script's process group is a fake one "
                          "of this world size")
    fit.add_argument("--nnodes", type=_positive, default=1, metavar="M", help="nodes of the planned job (default 1)")
    fit.add_argument("--memory-budget", type=_budget, metavar="SIZE",
                     help="memory to fit in, per device (default: the target's memory)")
    fit.add_argument("--json", metavar="FILE", help="write the fit report as JSON (schema advisor.fit/1)")
    fit.add_argument("-o", "--output", metavar="FILE",
                     help="where to write the plan when the job does not fit (default: plan.json in the session folder)")
    fit.add_argument("script", metavar="SCRIPT", nargs="?", help="the training script")
    fit.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")

    sub.add_parser("sessions", help="list recorded sessions")

    report = sub.add_parser("report", help="report a recorded session")
    report.add_argument("session", metavar="SESSION", nargs="+",
                        help="session id, folder, .sqlite file, or 'latest'; several sessions of one "
                             "multi-node job (one per node) are merged into one report")
    report.add_argument("--json", metavar="FILE", help="write the report as JSON instead of printing it")
    report.add_argument("--trace", metavar="FILE", help="export the timelines as Chrome/Perfetto trace JSON")
    report.add_argument("--memory-budget", type=_budget, metavar="SIZE", help="re-advise against this budget")
    report.add_argument("--format", choices=REPORT_FORMATS, default="text",
                        help="how to print the report: text (default), json or markdown")

    plan = sub.add_parser("plan", help="write a plan of remedies from a recorded session")
    plan.add_argument("session", metavar="SESSION", nargs="?",
                      help="session id, folder, .sqlite file or 'latest' (default: the latest "
                           "session that ran out of memory or over its budget)")
    plan.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the plan JSON")
    plan.add_argument("--memory-budget", type=_budget, metavar="SIZE", help="budget to plan against")
    plan.add_argument("--recommendation", metavar="ID", help="which recommendation (default: the top one)")
    plan.add_argument("--host-link-bandwidth", type=_rate, metavar="RATE",
                      help="plan with this host-device copy bandwidth instead of the recorded one, e.g. 25GB/s")

    bench = sub.add_parser("bench-comm", help="measure collective bus bandwidth on this machine's ranks")
    bench.add_argument("--nproc-per-node", type=_positive, default=2, metavar="N")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="options passed to advisor.probes.comm.bench")

    imp = sub.add_parser("import", help="make a session from Kineto traces or a CUDA memory snapshot",
                         description="Import torch.profiler traces (one per rank, .json or .json.gz, or a "
                         "folder of them) and/or a torch.cuda.memory._dump_snapshot pickle as a session.")
    imp.add_argument("paths", nargs="+", metavar="PATH", help="trace files, folders of traces, snapshot pickles")
    imp.add_argument("--name", metavar="N", help="a name for the session (default: the first file's name)")
    imp.add_argument("--json", metavar="FILE", help="write the report as JSON instead of printing it")

    opened = sub.add_parser("open", help="browse a recorded session in the TUI (read-only)",
                            description="Open a recorded session in the terminal UI: every view, every rank; "
                            "b recomputes the advice at another budget, p writes a recommendation to a plan.")
    opened.add_argument("session", metavar="SESSION", help="session id, folder, .sqlite file, or 'latest'")
    opened.add_argument("--memory-budget", type=_budget, metavar="SIZE", help="advise against this budget")

    diff = sub.add_parser("diff", help="compare two sessions (and gate CI on regressions)",
                          description="Compare session B against session A: step time and phases, memory "
                          "by category at the peak, ops, collectives, diagnosis and recommendations.")
    diff.add_argument("a", metavar="A", help="the baseline session (id, folder, .sqlite file or 'latest'; "
                      "the sessions of one multi-node job comma-separated, e.g. node0,node1)")
    diff.add_argument("b", metavar="B", help="the session to compare with it")
    diff.add_argument("--json", metavar="FILE", help="write the comparison as JSON (schema advisor.diff/1)")
    diff.add_argument("--fail-on", metavar="SPEC", help="exit 1 when B regresses past a threshold, e.g. "
                      "step_time:+5%%,peak_memory:+10%%")
    diff.add_argument("--top", type=_positive, default=10, metavar="N", help="ops shown (default 10)")

    check = sub.add_parser("check", help="check a JSON report for figures that contradict each other",
                           description="Check reports (advisor report --json, attach --json, diff --json) "
                           "against the invariants docs/report-schema.md states: exit 0 when consistent, 1 "
                           "with one line per breach (field and values), 2 when a file is not a report.")
    check.add_argument("reports", nargs="+", metavar="REPORT.json", help="the JSON reports to check")

    mcp = sub.add_parser("mcp", help="serve the sessions to coding agents (Model Context Protocol, stdio)",
                         description="A Model Context Protocol server on stdin/stdout: tools that list sessions, "
                         "read report sections, give the diagnosis and recommendations at a budget, the evidence "
                         "for a finding, and write plans. Read-only unless --allow-apply.")
    mcp.add_argument("--allow-apply", action="store_true",
                     help="also offer apply and revert on live sessions (a live-opt-in remedy still needs the "
                          "caller's explicit confirm)")
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
        raise UsageError(f"{path}:{exc.lineno}: {exc.msg}", hint="the script has a syntax error; "
                         "`python SCRIPT` shows the same") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not a Python file ({exc})", hint="pass a .py training script") from None


def check_output_path(path: str, flag: str, *, protected: list[str] | None = None) -> None:
    """Fail before any work, in one line, on a path a result could not be written to."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path} is a folder", hint=f"name a file, e.g. {flag} {target / 'report.json'}")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist",
                         hint=f"create it first (mkdir -p {folder}) or write elsewhere")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the folder {folder} is not writable", hint="write elsewhere")
    for other in protected or []:
        try:
            same = target.exists() and os.path.samefile(target, other)
        except OSError:
            same = False
        if same or target.resolve() == Path(other).resolve():
            raise UsageError(f"{flag} {path} would overwrite the training script",
                             hint="name another file for the output")


def agent_settings(ns: argparse.Namespace) -> AgentSettings:
    """The training process's settings from ``advisor attach``'s flags (``AgentSettings`` names
    the flag behind each field); ``UsageError`` for combinations that cannot work."""
    try:
        probes = probe_names(ns.probes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if ns.enforce_budget and ns.memory_budget is None:
        raise UsageError("--enforce-budget needs --memory-budget", hint="e.g. --memory-budget 800MiB --enforce-budget")
    plan_path, plan_env = None, {}
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
        plan_path = os.path.abspath(ns.plan)
        plan_env = dict(plan.env)  # set in the training process's environment (advisor/controller.py)
    try:
        return AgentSettings(
            probes=tuple(probes), deep_steps=tuple(ns.deep_steps), deep_every=ns.deep_every,
            memory_budget_bytes=ns.memory_budget, enforce_budget=ns.enforce_budget,
            deep_compiled=bool(getattr(ns, "deep_compiled", False)),
            peak_flops=ns.peak_flops, peak_bandwidth=ns.peak_bandwidth, host_link_bandwidth=ns.host_link_bandwidth,
            allow_inexact=bool(getattr(ns, "allow_inexact", False)),
            # The job waits for the controller's decision at the boundary before the step asked for
            # (advisor/agent/hold.py): the apply lands there however long the advice takes.
            apply_hold_step=ns.apply_at_step if getattr(ns, "apply", None) else None,
            plan=plan_path, plan_env=plan_env)
    except ValueError as exc:  # a negative --deep-every, --peak-flops, ...
        raise UsageError(f"attach: {exc}") from None


def cmd_attach(ns: argparse.Namespace) -> int:
    from advisor.attach import run_attach

    if ns.script is None:
        raise UsageError("attach needs a SCRIPT to run",
                         hint="advisor attach [options] SCRIPT [ARGS...]; `advisor attach --help` lists the options")
    check_script(ns.script)
    if ns.json:
        check_output_path(ns.json, "--json", protected=[ns.script])
    if ns.apply_at_step and not ns.apply:
        raise UsageError("--apply-at-step needs --apply", hint="e.g. --apply auto --apply-at-step 5")
    check_log_targets(ns.log_to)
    ns.multinode = multinode_from_namespace(ns)
    return run_attach(ns, agent_settings(ns))


def check_log_targets(targets: list[Any] | None) -> None:
    """Fail before the job starts when a ``--log-to`` tool is not installed."""
    from advisor.trackers import missing_package

    for target in targets or []:
        missing = missing_package(target)
        if missing:
            raise UsageError(missing)


def cmd_fit(ns: argparse.Namespace) -> int:
    from advisor.fit_cli import run_fit

    if ns.script is None:
        raise UsageError("fit needs a SCRIPT to plan",
                         hint="advisor fit [--target DEVICE] [--nproc-per-node N] SCRIPT [ARGS...]")
    check_script(ns.script)
    for path, flag in ((ns.json, "--json"), (ns.output, "-o")):
        if path:
            check_output_path(path, flag, protected=[ns.script])
    return run_fit(ns)


def cmd_sessions(ns: argparse.Namespace) -> int:
    from advisor.listing import print_sessions

    return print_sessions()


def cmd_report(ns: argparse.Namespace) -> int:
    from advisor.job import load_job
    from advisor.paths import resolve_session
    from advisor.report import build_report, write_json

    script = [s for ref in ns.session for s in _session_script(resolve_session(ref))]
    for path, flag in ((ns.json, "--json"), (ns.trace, "--trace")):
        if path:
            check_output_path(path, flag, protected=script)
    state = load_job(ns.session)
    report = build_report(state, budget_bytes=ns.memory_budget)
    if ns.trace:
        from advisor.trace import write_trace

        write_trace(state, ns.trace)
        print(f"wrote trace {ns.trace}", file=sys.stderr)
    if ns.json:
        write_json(report, ns.json)
        print(f"wrote report {ns.json}", file=sys.stderr)
    if ns.format != "text" or (not ns.json and not ns.trace):
        from advisor.render import emit_report

        emit_report(report, ns.format, sys.stdout)
    return 0


def cmd_plan(ns: argparse.Namespace) -> int:
    from advisor.paths import resolve_session
    from advisor.planning import latest_session_to_plan, write_plan_from_session

    db_path = resolve_session(ns.session) if ns.session else latest_session_to_plan()
    check_output_path(ns.output, "-o", protected=_session_script(db_path))
    return write_plan_from_session(db_path, ns.output,
                                   budget_bytes=ns.memory_budget, recommendation_id=ns.recommendation,
                                   host_link_bandwidth=ns.host_link_bandwidth)


def _session_script(db_path: Path) -> list[str]:
    """The recorded session's script, which no output may overwrite."""
    from advisor.store import read_meta

    script = read_meta(db_path).get("script")
    return [script] if isinstance(script, str) and script else []


def cmd_bench_comm(ns: argparse.Namespace) -> int:
    import subprocess

    from advisor.launch import COMM_BENCH, torchrun_command

    return subprocess.call(torchrun_command(ns.nproc_per_node, COMM_BENCH, list(ns.args)))


def cmd_import(ns: argparse.Namespace) -> int:
    from advisor.importers.run import run_import

    if ns.json:
        check_output_path(ns.json, "--json", protected=list(ns.paths))
    return run_import(ns.paths, name=ns.name, json_path=ns.json)


def cmd_diff(ns: argparse.Namespace) -> int:
    from advisor.diff_cli import run_diff

    return run_diff(ns.a, ns.b, json_path=ns.json, fail_on=ns.fail_on, top=ns.top)


COMMANDS = {"attach": cmd_attach, "sessions": cmd_sessions, "report": cmd_report,
            "plan": cmd_plan, "bench-comm": cmd_bench_comm}
COMMANDS.update({"import": cmd_import, "diff": cmd_diff})  # kept apart so other commands merge cleanly


def cmd_open(ns: argparse.Namespace) -> int:
    from advisor.open_cli import run_open

    return run_open(ns.session, budget_bytes=ns.memory_budget)


COMMANDS["open"] = cmd_open
COMMANDS["fit"] = cmd_fit


def cmd_check(ns: argparse.Namespace) -> int:
    from advisor.check import main as check_main

    return check_main(ns.reports)


COMMANDS["check"] = cmd_check

def cmd_mcp(ns: argparse.Namespace) -> int:
    from advisor.mcp_server import run_stdio
    from advisor.mcp_tools import build_server

    return run_stdio(build_server(allow_apply=ns.allow_apply))


COMMANDS["mcp"] = cmd_mcp


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Like ``parse_args``, but an unknown option's hint names the subcommand's own --help."""
    ns, extras = parser.parse_known_args(argv)
    if extras:
        raise UsageError(f"unrecognized arguments: {' '.join(extras)}",
                         hint=f"`advisor {ns.command} --help` lists the options")
    return ns


def main(argv: list[str] | None = None) -> int:
    # Everything the controller writes (store, reports, plans) is readable by its owner only;
    # the training script gets the user's own umask back (advisor.controller).
    from advisor.paths import restrict_umask

    restrict_umask()
    try:
        ns = parse_args(build_parser(), argv)
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
