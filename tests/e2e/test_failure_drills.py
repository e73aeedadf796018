"""Failure drills: SIGKILL one component mid-run. The run must end within 60 s with a non-zero exit
and a message naming the component, leave no process behind, and leave its last checkpoint whole
(every file matching its manifest). The checkpoint is written the same way whichever component dies,
so one drill (the actor's: it dies with the weights it was saving) also resumes from it; the others
stop at the manifest check to keep the suite's time down."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT
from test_interrupt_resume import ENTRY, SMALL_CLI, kill_session, session_processes, wait_for_line

from embodied_async.checkpoint_io import verify_checkpoint

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

# the component's name in the error ("env[1].run failed: ..."), and the class name in its Ray
# process title ("ray::EnvWorker..."); the first such process found is killed, whichever rank it is
COMPONENTS = {"env": "EnvWorker", "rollout": "RolloutWorker", "actor": "ActorWorker"}


def component_pid(sid: int, class_name: str) -> int:
    for line in session_processes(sid):
        _, pid, args = line.split(None, 2)
        if args.startswith(f"ray::{class_name}"):
            return int(pid)
    raise AssertionError(f"no ray::{class_name} process in session {sid}:\n" + "\n".join(session_processes(sid)))


def sigkill_mid_run(args, marker: str, timeout: float, victim) -> tuple:
    """``train_async.py args`` in a session of its own; once ``marker`` is printed, SIGKILL the
    process ``victim(session id)`` names -> (the process, its whole output, seconds it took to end)."""
    proc = subprocess.Popen([sys.executable, ENTRY, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = wait_for_line(proc, marker, timeout=timeout)
        os.kill(victim(proc.pid), signal.SIGKILL)
        killed = time.monotonic()
        rest, _ = proc.communicate(timeout=120)
        ended_after = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
    return proc, "".join(seen) + rest, ended_after


def assert_no_process_left(sid: int) -> None:
    deadline = time.monotonic() + 20
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session_processes(sid), session_processes(sid)


@pytest.mark.slow
@pytest.mark.parametrize("component", list(COMPONENTS))
def test_sigkill_of_a_component_ends_the_run_and_keeps_the_checkpoint(tmp_path, component):
    log_path = tmp_path / "run"
    proc, output, ended_after = sigkill_mid_run(
        [*SMALL_CLI, "runner.max_steps=1000", "runner.save_interval=1", f"runner.logger.log_path={log_path}"],
        "step 3/", 300, lambda sid: component_pid(sid, COMPONENTS[component]))
    print(f"[drill] {component}: run ended {ended_after:.1f}s after SIGKILL, exit {proc.returncode}")
    assert proc.returncode not in (0, None), output[-3000:]
    assert ended_after < 60, f"took {ended_after:.1f}s to end"
    assert re.search(rf"{component}\[\d+\]\.\w+ failed", output), output[-3000:]  # e.g. "env[1].run failed"
    assert_no_process_left(proc.pid)

    with open(log_path / "checkpoints" / "latest") as f:
        checkpoint = log_path / "checkpoints" / f.read().strip()
    verify_checkpoint(str(checkpoint))  # whole: every file matches its manifest entry
    with open(checkpoint / "runner.json") as f:
        saved = json.load(f)
    assert saved["step"] >= 2
    if component != "actor":
        return
    resumed = subprocess.run([sys.executable, ENTRY, *SMALL_CLI, f"runner.max_steps={saved['step'] + 1}",
                              f"runner.resume_dir={checkpoint}", f"runner.logger.log_path={tmp_path / 'resumed'}"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    with open(tmp_path / "resumed" / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    assert last["step"] == saved["step"] + 1 and last["train/actor/current_version"] == saved["version"]
