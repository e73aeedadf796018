"""A cluster's signals to a real run: SIGUSR1 (SLURM's warning) saves and the run goes on; SIGTERM
to the launcher's whole process group (as SLURM stops a job) saves the last completed update and
ends with exit 143 and the resume command, no process left, even when a second SIGTERM comes while
the checkpoint is written; the run resumes from it. A full disk ends a run in one line and leaves
its last checkpoint whole."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT
from test_failure_drills import assert_no_process_left
from test_interrupt_resume import ENTRY, SMALL_CLI, kill_session, output_when_ended, wait_for_line

from embodied_async.checkpoint_io import verify_checkpoint

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess


def start_run(log_path, *overrides):
    """``train_async.py`` as a scheduler starts it: in a session (and process group) of its own."""
    keys = {o.split("=", 1)[0] for o in overrides}
    small = [o for o in SMALL_CLI if o.split("=", 1)[0] not in keys]
    return subprocess.Popen([sys.executable, ENTRY, *small, f"runner.logger.log_path={log_path}", *overrides],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def latest(log_path):
    with open(log_path / "checkpoints" / "latest") as f:
        return log_path / "checkpoints" / f.read().strip()


def test_sigusr1_saves_and_goes_on_then_sigterm_to_the_group_saves_exits_143_and_the_run_resumes(tmp_path):
    log_path = tmp_path / "run"
    # scheduled checkpoints too: a stop may come while one is being written
    proc = start_run(log_path, "runner.max_steps=1000", "runner.preemption_grace_s=20", "runner.save_interval=3")
    try:
        seen = wait_for_line(proc, "step 2/", timeout=300)
        proc.send_signal(signal.SIGUSR1)  # to the launcher, as SLURM's --signal=B:USR1@N does
        seen += wait_for_line(proc, "SIGUSR1", timeout=120)
        warned = re.search(r"\[runner\] SIGUSR1: (\S+) saved; the run goes on", seen[-1]).group(1)
        verify_checkpoint(warned)
        seen += wait_for_line(proc, "step ", timeout=120)  # the run went on
        os.killpg(proc.pid, signal.SIGTERM)  # the job's whole process group, as SLURM signals it
        sent = time.monotonic()
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGTERM)  # a second one, while the checkpoint is being written
        rest, _ = proc.communicate(timeout=60)
        ended_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
    output = "".join(seen) + rest
    assert proc.returncode == 143, output[-3000:]
    assert ended_after < 20, f"took {ended_after:.1f}s: past the grace period"
    assert_no_process_left(proc.pid)
    checkpoint = latest(log_path)
    verify_checkpoint(str(checkpoint))  # whole, the second signal notwithstanding
    assert checkpoint.name != os.path.basename(warned)  # the stop saved the updates since
    saved_lines = [line for line in output.splitlines() if "checkpoint saved:" in line]
    assert len(saved_lines) == len(set(saved_lines)), output[-3000:]  # no step's checkpoint written twice
    stopped = [line for line in output.splitlines() if line.startswith("[train] stopped by SIGTERM")]
    assert len(stopped) == 1 and str(checkpoint) in stopped[0], output[-3000:]
    command = re.search(r"resume with:  (.*)$", stopped[0]).group(1)
    assert command.startswith("bash scripts/run_async.sh ") and f"runner.resume_dir={checkpoint}" in command
    with open(checkpoint / "runner.json") as f:
        saved = json.load(f)

    resumed = subprocess.run([sys.executable, ENTRY, *SMALL_CLI, f"runner.max_steps={saved['step'] + 1}",
                              f"runner.resume_dir={checkpoint}", f"runner.logger.log_path={log_path}"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed from {checkpoint}: step {saved['step']}" in resumed.stdout
    with open(latest(log_path) / "runner.json") as f:
        assert json.load(f)["step"] == saved["step"] + 1


@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MiB tmpfs (as root, which CI is; elsewhere the test is skipped, saying why)."""
    folder = tmp_path / "small_disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_is_foretold_then_ends_the_run_in_one_line_and_the_last_checkpoint_is_whole(small_filesystem):
    log_path = small_filesystem / "run"
    proc = start_run(log_path, "runner.max_steps=1000", "runner.save_interval=1")
    output = output_when_ended(proc, timeout=600)
    assert proc.returncode == 1, output[-3000:]
    # 1001 checkpoints kept (runner.keep_checkpoints unset) cannot fit in 1 MiB: said before training
    assert re.search(r"\[runner\] warning: \d+ MiB are free where the run writes .* its checkpoints will take about "
                     r"\d+ MiB \(1001 of ~", output), output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("storage error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "MiB free" in errors[0], output[-3000:]
    assert "Traceback" not in output and "HYDRA_FULL_ERROR" not in output
    assert_no_process_left(proc.pid)
    checkpoints = log_path / "checkpoints"
    assert [name for name in os.listdir(checkpoints) if name.endswith((".tmp", ".old"))] == []
    checkpoint = latest(log_path)
    verify_checkpoint(str(checkpoint))
    assert f"resume with runner.resume_dir={checkpoint}" in errors[0]  # resuming from it: the SIGTERM test
