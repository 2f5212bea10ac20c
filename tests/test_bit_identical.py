"""Under the advisor a script trains exactly as without it (issue 21, item 1).

Each example and each loop of tests/scripts runs bare, then twice under ``advisor attach``
in a fresh ``$ADVISOR_HOME``: the first attached run finds an empty device cache and runs
the micro-benchmarks at its first step boundary, the second reads the cache. The lines
the script prints (``step N loss X``, ``val loss X``, ``test loss X``, with X a float's
repr, and a forked child's ``child exited N``) must be the same bytes in all three runs. Everything runs on one thread, so the
bare and the attached runs use the same kernels.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOSS_LINE = re.compile(r"^((step \d+|val|test) loss \S+|child exited \d+)$")

GPT_SMALL = ["--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "64",
             "--device", "cpu", "--steps", "4"]
CASES: dict[str, tuple[str, list[str], list[str]]] = {
    # name: (script, script args, advisor attach options)
    "example-gpt": ("examples/gpt.py", GPT_SMALL, []),
    "example-cnn": ("examples/cnn.py", ["--width", "8", "--blocks", "1", "--batch", "8", "--steps", "4",
                                        "--device", "cpu"], []),
    "example-slow-input": ("examples/slow_input.py", ["--steps", "4", "--load-ms", "1", "--device", "cpu"],
                           ["--probes", "memory,compute"]),
    "example-ddp-single-rank": ("examples/ddp.py", ["--steps", "4", "--device", "cpu", "--accumulate", "2"], []),
    "accumulate-gpt": ("tests/scripts/accumulate_gpt.py", ["--steps", "4"], []),
    "hand-sgd": ("tests/scripts/hand_sgd.py", ["--steps", "4"], []),
    "gan": ("tests/scripts/gan.py", ["--steps", "4"], ["--steps", "3"]),
    "lbfgs-rnn": ("tests/scripts/lbfgs_rnn.py", ["--steps", "3", "--length", "6"], ["--deep-steps", "1"]),
    "python-rnn": ("tests/scripts/python_rnn.py", ["--steps", "4", "--length", "8"], []),
    "compiled": ("tests/scripts/compiled.py", ["--steps", "4"], ["--probes", "memory"]),
    # torch.compile of a module that is no container: truth-testing it raised "Net does not support len()".
    "compiled-plain-module": ("tests/scripts/compiled_module.py", [], []),
    # Children forked after the compute probe's profiler session hung for ever at exit (kineto).
    "forks-after-profiling": ("tests/scripts/fork_after_steps.py", [], []),
    "eval-in-step": ("tests/scripts/eval_in_step.py", ["--steps", "4"], ["--probes", "compute"]),
    # torch.func's grad and jacrev refuse saved-tensor hooks: they died at the first deep step.
    "func-transforms": ("tests/scripts/func_transforms.py", ["--steps", "7"], []),
}


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A shell starts a background job
    (``pytest ... &``) with SIGINT ignored, the ignore is inherited through exec, and Python then
    never raises KeyboardInterrupt: the Ctrl-C tests read exit 0 whenever the suite ran that way."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _loss_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if LOSS_LINE.match(line)]


def _start(args: list[str], home: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", ADVISOR_HOME=str(home))
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen, what: str) -> str:
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{stderr[-3000:]}"
    return stdout


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_losses_are_bit_identical_to_a_bare_run_on_a_fresh_cache_and_after(case, tmp_path):
    script, script_args, options = CASES[case]
    home = tmp_path / "fresh-home"
    attach = ["-m", "advisor", "attach", "--headless", *options, script, *script_args]
    bare = _start([script, *script_args], tmp_path / "bare-home")
    first = _start(attach, home)  # side by side: most of each run is importing torch
    bare_lines = _loss_lines(_finish(bare, "bare run"))
    first_lines = _loss_lines(_finish(first, "first attached run"))
    assert (home / "device_cache.json").exists() == ("--probes" not in options or "compute" in " ".join(options))
    second_lines = _loss_lines(_finish(_start(attach, home), "second attached run"))
    assert bare_lines and any(line.startswith("step ") for line in bare_lines)
    if "--steps" in options:  # the advisor stopped the script after N steps, at the boundary
        n = int(options[options.index("--steps") + 1])
        bare_lines = [line for line in bare_lines if line.startswith("step ")][:n]
    assert first_lines == bare_lines
    assert second_lines == bare_lines


@pytest.mark.slow
def test_ctrl_c_during_a_deep_step_ends_the_run(tmp_path):
    """SIGINT while the deep probes run (their finalizers are where it used to be lost)."""
    import signal

    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", ADVISOR_HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "attach", "--headless", "--deep-steps", "1,2,3,4,5",
                             "tests/scripts/python_rnn.py", "--steps", "1000", "--length", "64"],
                            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_default_sigint)
    try:
        for line in proc.stdout:  # step 1 printed: deep step 2 is under way
            if line.startswith("step 1 "):
                break
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
