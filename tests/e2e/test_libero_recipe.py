"""The tiny OpenVLA recipe on a LIBERO task (its simulators in child processes under .venv-libero):
an update through the whole graph, then a child simulator killed (as the OOM killer does), which the
run heals like any env worker's death: a new env worker with fresh simulators, the run going on."""

import json

import pytest
from test_failure_drills import assert_no_process_left, healed_records, sigkill_mid_run
from test_interrupt_resume import session_processes

# Ray, worker processes and LIBERO scenes in child processes under .venv-libero (built on first use)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("libero_python_env")]

CHILD_SERVER = "embodied_async.isolated.server"


def child_simulator_pid(sid: int) -> int:
    for line in session_processes(sid):
        _, pid, args = line.split(None, 2)
        if CHILD_SERVER in args:
            return int(pid)
    raise AssertionError("no LIBERO child process in the run's session:\n" + "\n".join(session_processes(sid)))


def test_the_tiny_recipe_updates_on_a_libero_task_and_a_killed_child_simulator_is_healed(tmp_path):
    log_path = tmp_path / "run"
    proc, output, _ = sigkill_mid_run(
        ["--config-name", "libero_async_ppo_openvla_tiny", "runner.max_steps=3", "runner.save_interval=1",
         "runner.val_check_interval=0", f"runner.logger.log_path={log_path}"], "step 1/", 420, child_simulator_pid)
    with open(log_path / "metrics.jsonl") as f:
        first = json.loads(f.readline())
    # the update: 2 sub-envs x 8 decisions of the tiny OpenVLA on the LIBERO task, trained on
    assert first["step"] == 1 and first["env_steps"] >= 16
    for key in ("train/actor/policy_loss", "train/critic/value_loss", "train/actor/grad_norm"):
        assert isinstance(first[key], float) and first[key] == first[key], key
    assert proc.returncode == 0, output[-3000:]
    assert "healing: env[0].run failed: the libero simulator's child process ended (exit code -9); it was killed" \
        in output, output[-3000:]
    heals, trained = healed_records(log_path)
    assert len(heals) == 1 and heals[0]["step"] >= 1 and heals[0]["heal/replaced"] == "env[0]"
    assert [r["step"] for r in trained] == [1, 2, 3]  # nothing taken again: no restart
    assert_no_process_left(proc.pid)
