"""The env worker's side: a ``SubEnv`` whose simulator runs in a child process under the family's
own interpreter (``EnvConfig.python_env``), so our venv never imports what the family pins.

The child is reached only through its stdin and stdout (nothing another process can connect to),
messages are JSON and raw arrays (``codec``), and it ends when the worker closes it or dies (its
stdin closes). A child that dies is an error naming the family and its exit code, which ends the
run like any env worker's failure.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Dict, Optional

import numpy as np

from embodied_async.contracts import SubStep
from embodied_async.isolated.codec import CodecError, read_message, write_message
from embodied_async.serial_env import ChunkResult

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# where the families' environments live (.venv-<name> in it); a test points it elsewhere
VENVS_ROOT_VARIABLE = "EMBODIED_ASYNC_FAMILY_VENVS"
CLOSE_TIMEOUT_S = 10.0


def setup_command(name: str) -> str:
    return f"bash scripts/setup.sh --python-env {name}"


def family_interpreter(name: str) -> str:
    """The interpreter of the family environment ``name``; FileNotFoundError naming the set-up
    command when it was not built."""
    root = os.environ.get(VENVS_ROOT_VARIABLE, REPO_ROOT)
    path = os.path.join(root, f".venv-{name}", "bin", "python")
    if not os.path.exists(path):
        raise FileNotFoundError(f"the '{name}' Python environment ({os.path.dirname(os.path.dirname(path))}) is not "
                                f"set up: run {setup_command(name)}")
    return path


def _start_child(python_env: str, start: Dict[str, Any]) -> subprocess.Popen:
    """The server under the family's interpreter, the repository's code importable, its first
    message sent."""
    paths = [REPO_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]  # the repository's code first
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")
    process = subprocess.Popen([family_interpreter(python_env), "-m", "embodied_async.isolated.server"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT, env=env)
    write_message(process.stdin, start)
    return process


class SimulatorEnded(RuntimeError):
    """The family's simulator process ended under its env worker (killed, out of memory, crashed):
    the runner counts it as a process's death (``worker_group.WorkerDied``), which a run may heal."""

    process_ended = True
    reported_in_full = True  # its message says all: the runner shows it without the worker's traceback


def _reply(process: subprocess.Popen, family: str) -> Any:
    """The child's next reply; RuntimeError naming the family when it failed or ended."""
    try:
        reply = read_message(process.stdout)
    except (EOFError, CodecError) as err:
        code = process.wait(timeout=CLOSE_TIMEOUT_S) if isinstance(err, EOFError) else None
        why = "it was killed (SIGKILL: by hand, or by the kernel when memory ran out: run fewer sub-envs)" \
            if code == -9 else f"its output above says why ({err})"
        raise SimulatorEnded(f"the {family} simulator's child process ended (exit code {code}); {why}") from None
    if "error" in reply:
        raise RuntimeError(f"the {family} simulator (child process) failed: {reply['error']}")
    return reply["result"]


def query(family: str, python_env: str, function: str, config: Dict[str, Any]) -> Any:
    """``function(config)`` (``"module:callable"``) run once under the family's interpreter: what a
    family's start-up checks ask of code our venv cannot import (its task names, its cameras)."""
    process = _start_child(python_env, {"factory": function, "config": config, "query": True})
    try:
        return _reply(process, family)
    finally:
        process.stdin.close()
        process.wait(timeout=CLOSE_TIMEOUT_S)


class ChildSubEnv:
    """``contracts.SubEnv`` over a child process that builds ``factory(config)`` (``"module:callable"``,
    importable under the family's interpreter from the repository)."""

    def __init__(self, family: str, python_env: str, factory: str, config: Dict[str, Any], wait: bool = True):
        """``wait=False``: return once the child started; ``ready()`` waits for its simulator (so
        several children build theirs at once)."""
        self.family = family
        self.process = _start_child(python_env, {"factory": factory, "config": config})
        self.instruction: Optional[str] = None
        if wait:
            self.ready()

    def ready(self) -> "ChildSubEnv":
        """Wait until the child built its simulator."""
        if self.instruction is None:
            self.instruction = self._reply()["instruction"]
        return self

    def _reply(self) -> Any:
        return _reply(self.process, self.family)

    def send_call(self, name: str, *args) -> None:
        """Send a call; ``receive_reply`` reads its result (``contracts.ConcurrentSubEnv``)."""
        try:
            write_message(self.process.stdin, {"call": name, "args": list(args)})
        except (BrokenPipeError, OSError):
            pass  # the reply's read reports the child's end with its exit code

    def receive_reply(self, name: str) -> Any:
        reply = self._reply()
        if name == "step":
            return SubStep(**reply)
        if name == "run_chunk":
            return ChunkResult(**reply)
        return reply

    def _call(self, name: str, *args) -> Any:
        self.send_call(name, *args)
        return self.receive_reply(name)

    def reset(self, seed: Optional[int] = None) -> None:
        self._call("reset", seed)

    def step(self, action: np.ndarray) -> SubStep:
        return self._call("step", np.asarray(action))

    def observe(self) -> Dict[str, np.ndarray]:
        return self._call("observe")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._call("close")
            except RuntimeError:
                pass
        try:
            self.process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
