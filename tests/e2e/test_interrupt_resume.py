"""Ctrl-C stops every process quickly and leaves a checkpoint that a resumed run continues from."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")
SMALL_CLI = ["env.num_envs=4", "env.max_episode_steps=10", "rollout.num_steps=8", "actor.global_batch_size=16",
             "actor.micro_batch_size=8", "model.hidden_sizes=[32,32]", "runner.val_check_interval=0",
             "runner.save_interval=0"]


def session_processes(sid: int) -> list:
    # -ww: whole command lines (without a terminal, as in CI, ps cuts them to 80 columns)
    out = subprocess.run(["ps", "-ww", "-eo", "sid=,pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split() and line.split()[0] == str(sid)]


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session (the launcher's group holds only the launcher: the
    driver and Ray live in a group of their own)."""
    subprocess.run(["pkill", "-KILL", "-s", str(sid)], check=False)


def output_when_ended(proc, timeout: float) -> str:
    """Everything ``proc`` (started in a session of its own) printed, once it ended; past
    ``timeout`` seconds its session is killed (and TimeoutExpired raised)."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
    return output


def wait_for_line(proc, marker: str, timeout: float) -> list:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"'{marker}' never appeared:\n{''.join(lines[-30:])}")


@pytest.mark.slow
def test_ctrl_c_saves_and_resume_continues(tmp_path):
    log_path = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, ENTRY, *SMALL_CLI, "runner.max_steps=1000",
                             f"runner.logger.log_path={log_path}"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for_line(proc, "step 2/", timeout=300)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        rest, _ = proc.communicate(timeout=30)
        stopped_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
    assert proc.returncode == 130, rest
    assert stopped_after < 15, f"took {stopped_after:.1f}s to stop"
    deadline = time.monotonic() + 15 - stopped_after
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session_processes(proc.pid), session_processes(proc.pid)

    with open(log_path / "checkpoints" / "latest") as f:
        checkpoint = log_path / "checkpoints" / f.read().strip()
    with open(checkpoint / "runner.json") as f:
        saved = json.load(f)
    assert saved["step"] >= 2 and saved["version"] == saved["step"]

    resumed = subprocess.run([sys.executable, ENTRY, *SMALL_CLI, f"runner.max_steps={saved['step'] + 1}",
                              f"runner.resume_dir={checkpoint}", f"runner.logger.log_path={log_path}"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    with open(log_path / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    assert last["step"] == saved["step"] + 1
    assert last["train/actor/current_version"] == saved["version"]
    assert last["env_steps"] > saved["env_steps"]
