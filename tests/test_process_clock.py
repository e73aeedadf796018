"""A worker's CPU accounting counts the child processes it runs (an isolated env family's
simulators), once: while they live and after they are reaped."""

import subprocess
import sys
import time

from embodied_async.workers.base import ProcessClock, process_metrics

BURN_THEN_WAIT = (
    "import sys, time\n"
    "end = time.process_time() + 0.5\n"
    "while time.process_time() < end: pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.readline()\n"
)


def test_a_child_process_cpu_counts_as_the_workers_work_once():
    clock = ProcessClock()
    child = subprocess.Popen([sys.executable, "-c", BURN_THEN_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "burnt"
    alive = process_metrics("env", clock, 0.01)
    # the child's start-up adds to its 0.5 s of burning; the parent here only waited on a pipe
    assert 0.45 <= alive["cpu/env_work"] - 0.01 <= 3.0, alive
    assert alive["cpu/env_process"] >= alive["cpu/env_work"] - 0.01
    child.communicate("go\n", timeout=30)  # ends and is reaped: its CPU moves to getrusage's count
    time.sleep(0.05)
    reaped = process_metrics("env", clock, 0.0)
    assert reaped["cpu/env_work"] < 0.2, reaped  # not counted a second time
