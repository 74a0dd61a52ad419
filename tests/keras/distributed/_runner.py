"""Launches ``_scenarios.py`` in fresh processes and returns their JSON results.

TF and Keras fix the backend and the devices once per process, so every scenario gets its own interpreter,
with this worktree's ``src`` first on PYTHONPATH. Two-worker scenarios bind free ports on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "_scenarios.py"
SRC = HERE.parents[2] / "src"
MARK = "RESULT "


class ScenarioError(RuntimeError):
    """The scenario's process died, timed out, or printed no result."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.pop("TF_CONFIG", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONHASHSEED"] = "0"
    return env


def _parse(args: list[str], proc: subprocess.CompletedProcess) -> dict:
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise ScenarioError(
        f"{' '.join(args)} exited {proc.returncode} without a result; stderr tail:\n{proc.stderr[-3000:]}"
    )


def run(*args: str, timeout: float = 240) -> dict:
    """Runs one scenario process; returns its result dict."""
    cmd = [sys.executable, str(SCRIPT), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise ScenarioError(f"{' '.join(args)} timed out after {timeout} s") from error
    return _parse(list(args), proc)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_workers(scenario: str, *args: str, workers: int = 2, timeout: float = 240) -> list[dict]:
    """Runs ``workers`` processes of a multi-worker scenario (argv: ``*args, index, "p0,p1"``) together;
    returns their results in worker order. A worker that dies or hangs is reported with the others' output."""
    ports = ",".join(str(p) for p in free_ports(workers))
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), scenario, *args, str(i), ports],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for i in range(workers)
    ]

    def wait(proc: subprocess.Popen) -> subprocess.CompletedProcess:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n[killed after {timeout} s]"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(wait, procs))
    results = []
    for i, proc in enumerate(done):
        try:
            results.append(_parse([scenario, *args, f"worker {i}"], proc))
        except ScenarioError as error:
            results.append({"error": str(error)})
    return results
