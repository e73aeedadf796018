"""A non-finite (or absurd) observation or reward from an env (env.on_nonfinite): "stop", the
default, ends the run in one error naming the env worker, the sub-env, the key, the value and the
step; "drop" drops the sample, resets its sub-env and counts it (env/nonfinite_dropped). The
synthetic env's test hook (env.nan_reward_at_step) gives the NaN."""

import re
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO_ROOT
from test_failure_drills import assert_no_process_left
from test_interrupt_resume import ENTRY, output_when_ended

from embodied_async.config import ConfigError, check
from embodied_async.data import ActionMessage, EnvOutput
from embodied_async.scheduler.channel import LocalChannel
from embodied_async.workers.env_worker import EnvWorker, NonFiniteEnvValue, _first_invalid

SYNTHETIC = ["env.name=synthetic_image", "env.image_size=[16,16]", "env.action_dim=2", "env.num_envs=4",
             "env.max_episode_steps=50", "cluster.backend=local", "cluster.component_placement.env=0",
             "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0"]
STEPS_TIMEOUT_S = 30


def run_env_worker(make_config, steps: int, *overrides: str):
    """An env worker stepping the synthetic env on its own thread, fed ``steps`` zero actions
    through its channels as a rollout worker would -> (the worker, its outputs, its error or None)."""
    cfg = make_config(*SYNTHETIC, *overrides)
    channels = SimpleNamespace(env_outputs=LocalChannel(name="env_outputs"), actions=LocalChannel(name="actions"))
    worker = EnvWorker(cfg, check(cfg), rank=0, device_id=0, channels=channels)
    failure = []

    def loop():
        try:
            worker.run()
        except NonFiniteEnvValue as err:
            failure.append(err)
            channels.env_outputs.close()  # as the runner's shutdown does: nothing more comes

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    outputs = [channels.env_outputs.get(key=(0, 0), timeout=STEPS_TIMEOUT_S)]  # the first observations
    try:
        for _ in range(steps):
            channels.actions.put(ActionMessage(np.zeros((4, 1, 2), np.float32)), key=(0, 0))
            outputs.append(channels.env_outputs.get(key=(0, 0), timeout=STEPS_TIMEOUT_S))
    except Exception:  # the channel closed: the worker stopped with an error
        pass
    worker.stop()
    thread.join(timeout=STEPS_TIMEOUT_S)
    worker.close()
    return worker, outputs, (failure[0] if failure else None)


def test_stop_is_the_default_and_names_worker_sub_env_key_value_and_step(make_config):
    worker, outputs, error = run_env_worker(make_config, 6, "env.nan_reward_at_step=4")
    assert worker.cfg.env.on_nonfinite == "stop"
    assert len(outputs) == 1 + 3  # the reset, then steps 1-3; step 4 never left the worker
    assert isinstance(error, NonFiniteEnvValue)
    message = str(error)
    assert "\n" not in message
    assert "env worker 0, sub-env 0 of stage 0: rewards=nan at step 4 of that stage" in message
    assert "env.on_nonfinite=drop" in message and "synthetic_image" in message  # the fix, and where to look


def test_drop_keeps_the_run_going_resets_the_sub_env_and_counts_it(make_config):
    worker, outputs, error = run_env_worker(make_config, 6, "env.nan_reward_at_step=4", "env.on_nonfinite=drop")
    assert error is None and len(outputs) == 1 + 6
    dropped = outputs[4]
    assert list(dropped.valid) == [False, True, True, True]
    assert dropped.rewards[0] == 0.0 and np.isfinite(dropped.rewards).all()
    assert dropped.dones[0] and not dropped.bootstrap[0]  # its episode ends, with nothing to bootstrap
    assert dropped.obs["states"][0, 0] == 0.0  # a fresh episode: the cursor starts in the middle
    for out in outputs[1:4] + outputs[5:]:
        assert out.valid.all() and np.isfinite(out.rewards).all()
    assert worker.pop_metrics()["env/nonfinite_dropped"] == 1.0


def test_a_value_beyond_max_abs_value_counts_as_non_finite():
    obs = {"states": np.zeros((3, 2), np.float32), "task_descriptions": ["x"] * 3}
    obs["states"][2, 1] = 1e7
    out = EnvOutput(obs, np.zeros(3, np.float32), *(np.zeros(3, bool) for _ in range(3)), np.ones(3, bool))
    assert _first_invalid(out, max_abs=1e6) == (2, "states", 1e7)
    out.rewards[1] = np.inf  # rewards are named first
    assert _first_invalid(out, max_abs=1e6) == (1, "rewards", np.inf)


@pytest.mark.parametrize("override, expected", [
    ("env.on_nonfinite=skip", "env.on_nonfinite='skip' is not allowed; use one of: stop, drop"),
    ("env.nan_reward_at_step=0", "env.nan_reward_at_step=0 must be >= 1"),
])
def test_start_up_refuses_bad_settings(make_config, override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check(make_config(*SYNTHETIC, override))


@pytest.mark.slow
def test_a_nan_reward_ends_a_real_run_naming_the_worker_key_and_step(tmp_path):
    """Through Ray, as a user runs it: two env workers, each of whose first sub-env gives a NaN
    reward at its fifth step."""
    proc = subprocess.Popen(
        [sys.executable, ENTRY, "env=synthetic_bridge", "env.image_size=[16,16]", "env.action_dim=2", "env.num_envs=4",
         "env.max_episode_steps=10", "env.nan_reward_at_step=5", "rollout.num_steps=8", "actor.global_batch_size=16",
         "actor.micro_batch_size=8", "model.hidden_sizes=[32,32]", "runner.max_steps=1000",
         "runner.val_check_interval=0", "runner.save_interval=0", f"runner.logger.log_path={tmp_path / 'run'}"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = output_when_ended(proc, timeout=300)
    assert proc.returncode == 1, output[-3000:]
    report = re.search(r"env worker (\d), sub-env 0 of stage 0: rewards=nan at step 5 of that stage", output)
    assert report, output[-3000:]
    assert f"env[{report.group(1)}].run failed" in output, output[-3000:]  # the rank, in the runner's words
    failed = [line for line in output.splitlines() if "a worker failed" in line]
    assert len(failed) == 1 and report.group(0) in failed[0], output[-3000:]
    assert 'File "' not in output, output[-3000:]  # one line, not Ray's traceback of the worker
    assert_no_process_left(proc.pid)
