"""The bundled example scripts run as a user would run them: plain subprocesses.

Each prints ``step N loss X`` per optimizer step, with X the repr of a float, so
the same command twice must print the very same losses on CPU.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STEP_LINE = re.compile(r"^step (\d+) loss (\S+)$")
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"

# Small sizes keep each run to import time plus well under a second of steps.
GPT_SMALL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
             "--batch", "8", "--vocab", "128", "--device", "cpu"]


def _run_many(*commands: list[str], timeout: float = 120) -> list[str]:
    """Run the commands side by side (most of each is importing torch) and return their stdout."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if len(commands) > 1:  # one thread each, so side-by-side runs do not fight over 2 cores
        env["OMP_NUM_THREADS"] = "1"
    procs = [subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for args in commands]
    outputs = []
    try:
        for args, proc in zip(commands, procs):
            stdout, stderr = proc.communicate(timeout=timeout)
            if proc.returncode != 0 and GLOO_TEARDOWN_ABORT in stderr:
                # Seen intermittently with plain torchrun and no advisor code on torch 2.13 CPU: a
                # gloo rank aborts in its C++ teardown after training finished. Run it once more,
                # alone, so the test judges the example rather than that teardown.
                again = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, text=True,
                                       capture_output=True, timeout=timeout)
                stdout, stderr, code = again.stdout, again.stderr, again.returncode
                if code != 0 and GLOO_TEARDOWN_ABORT in stderr:
                    code = 0  # twice in a row (seen once): the caller still checks every step's line
            else:
                code = proc.returncode
            assert code == 0, f"{args} exited {code}:\n{stderr[-3000:]}"
            outputs.append(stdout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def _run(args: list[str], timeout: float = 120) -> str:
    return _run_many(args, timeout=timeout)[0]


def _losses(stdout: str, steps: int) -> list[float]:
    """Parse the step lines; everything else a launcher prints is ignored."""
    found = [STEP_LINE.match(line) for line in stdout.splitlines()]
    found = [m for m in found if m]
    assert [int(m.group(1)) for m in found] == list(range(steps)), stdout
    losses = [float(m.group(2)) for m in found]
    assert all(math.isfinite(x) for x in losses), losses
    return losses


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(extra: list[str]) -> str:
    return _run(["-m", "torch.distributed.run", "--nproc-per-node", "2",
                 "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                 str(EXAMPLES / "ddp.py"), "--steps", "3", "--device", "cpu", *extra])


@pytest.mark.slow
def test_gpt_is_deterministic_and_learns():
    cmd = [str(EXAMPLES / "gpt.py"), *GPT_SMALL, "--steps", "15", "--lr", "1e-2", "--seed", "1"]
    first, second = (_losses(out, 15) for out in _run_many(cmd, cmd))
    assert first == second  # exact: the repr round-trips the float
    assert sum(first[-3:]) / 3 < first[0] - 0.3, first


def test_gpt_parameter_count_matches_docstring_formula(monkeypatch):
    spec = importlib.util.spec_from_file_location("example_gpt", EXAMPLES / "gpt.py")
    gpt = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, gpt)  # dataclasses look their module up there
    spec.loader.exec_module(gpt)
    for V, s, h, l, a in [(512, 64, 128, 4, 4), (100, 17, 48, 3, 6)]:
        cfg = gpt.GPTConfig(vocab=V, seq=s, hidden=h, layers=l, heads=a)
        model = gpt.GPT(cfg)
        expected = V * h + s * h + l * (12 * h * h + 13 * h) + 2 * h + h * V + V
        assert sum(p.numel() for p in model.parameters()) == expected == cfg.param_count()
        assert len(model.blocks) == l
    assert "12h^2+13h" in gpt.__doc__.replace(" ", "").replace("*", "")


@pytest.mark.slow
def test_cnn_runs():
    out = _run([str(EXAMPLES / "cnn.py"), "--width", "8", "--blocks", "1", "--batch", "8",
                "--steps", "3", "--device", "cpu"])
    _losses(out, 3)


@pytest.mark.slow
def test_slow_input_losses_do_not_depend_on_workers():
    base = [str(EXAMPLES / "slow_input.py"), "--steps", "3", "--load-ms", "1", "--device", "cpu"]
    inline, workers = (_losses(out, 3) for out in
                       _run_many(base, [*base, "--workers", "2", "--pin-memory"]))
    assert inline == workers


@pytest.mark.slow
def test_ddp_under_torchrun_with_accumulation_and_explicit_allreduce():
    out = _torchrun(["--explicit-allreduce", "16", "--accumulate", "2",
                     "--slow-rank", "1", "--slow-ms", "5"])
    _losses(out, 3)  # rank 0 only: exactly one line per step


@pytest.mark.slow
def test_ddp_under_torchrun_with_zero():
    _losses(_torchrun(["--zero"]), 3)
