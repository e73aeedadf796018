"""Env families with a Python environment of their own: the pipe's messages (``codec``), and a
simulator in a child process under the family's interpreter behind ``SubEnv`` (``child``)."""

import io
import os
import struct
import sys

import numpy as np
import pytest

from embodied_async.isolated.child import VENVS_ROOT_VARIABLE, ChildSubEnv, family_interpreter
from embodied_async.isolated.codec import CodecError, read_message, write_message
from embodied_async.serial_env import SerialEnv


def round_trip(message):
    stream = io.BytesIO()
    write_message(stream, message)
    stream.seek(0)
    return read_message(stream)


def test_messages_travel_as_json_and_raw_arrays():
    message = {"obs": {"states": np.arange(6, dtype=np.float32).reshape(1, 6),
                       "main_images": np.zeros((1, 2, 2, 3), np.uint8)},
               "reward": 0.5, "success": True, "none": None, "list": [np.int64(3), "a", np.array([True, False])]}
    back = round_trip(message)
    np.testing.assert_array_equal(back["obs"]["states"], message["obs"]["states"])
    assert back["obs"]["states"].dtype == np.float32 and back["obs"]["main_images"].shape == (1, 2, 2, 3)
    assert back["reward"] == 0.5 and back["success"] is True and back["none"] is None and back["list"][:2] == [3, "a"]
    with pytest.raises(TypeError, match="dtype object"):
        write_message(io.BytesIO(), {"bad": np.array([object()])})
    with pytest.raises(TypeError, match="cannot be sent"):
        write_message(io.BytesIO(), {"bad": {1, 2}})


def test_a_bad_frame_is_refused_and_never_unpickled():
    header = b'{"a": {"__array__": 0, "dtype": "|O", "shape": [1]}}'
    frame = struct.pack("<I", len(header)) + header + struct.pack("<Q", 8) + b"\0" * 8
    with pytest.raises(CodecError, match="a bad reference"):
        read_message(io.BytesIO(frame))
    header = b'{"a": {"__array__": 0, "dtype": "<f4", "shape": [4]}}'
    with pytest.raises(CodecError, match="12 bytes for a float32 array of shape"):
        read_message(io.BytesIO(struct.pack("<I", len(header)) + header + struct.pack("<Q", 12) + b"\0" * 12))
    with pytest.raises(EOFError):
        read_message(io.BytesIO(struct.pack("<I", 100) + b"{}"))


@pytest.fixture
def family_venv(tmp_path, monkeypatch):
    """A family environment named "fake" whose interpreter is this one (a real one is a venv of its own)."""
    (tmp_path / ".venv-fake" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / ".venv-fake" / "bin" / "python")
    monkeypatch.setenv(VENVS_ROOT_VARIABLE, str(tmp_path))
    return tmp_path


def child(**config):
    return ChildSubEnv("counting", "fake", "child_sub_envs:build_counting", {"goal": 2, "horizon": 3, **config})


@pytest.mark.slow
def test_a_child_simulator_serves_the_sub_env_contract_in_a_serial_env(family_venv, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.path.join(os.path.dirname(__file__), "support"))
    subs = [child(), child()]
    env = SerialEnv(subs, np.array([-1.0]), np.array([1.0]), terminal_on_success=False)
    try:
        out = env.reset(seed=[11, 11])
        assert out.obs["task_descriptions"] == ["count to 2", "count to 2"]
        assert out.obs["states"][0, 1] == out.obs["states"][1, 1]  # one seed, one initial state
        ended = np.zeros(2, bool)
        for _ in range(2):  # +1 a step from a start of 0, 1 or 2: the goal of 2 within two steps
            out = env.step(np.ones((2, 1, 1), np.float32))
            assert (out.rewards[out.dones] == 1.0).all() and out.successes[out.dones].all()
            ended |= out.dones
            # an ended episode was auto-reset: its new observation is step 0 of the next one
            assert (out.obs["main_images"][out.dones] == 0).all() and (out.final_obs is not None) == out.dones.any()
        assert ended.all() and out.obs["states"].dtype == np.float32
    finally:
        env.close()
    assert all(sub.process.poll() == 0 for sub in subs)  # closed, not killed


@pytest.mark.slow
def test_a_dying_child_or_a_refused_build_is_an_error_naming_the_family(family_venv, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.path.join(os.path.dirname(__file__), "support"))
    sub = child(die_at=2)
    sub.reset(0)
    sub.step(np.ones(1, np.float32))
    with pytest.raises(RuntimeError, match=r"the counting simulator's child process ended \(exit code 7\)"):
        sub.step(np.ones(1, np.float32))
    sub.close()
    with pytest.raises(RuntimeError, match="counting simulator .* failed: ValueError: no task 'c'; the tasks: a, b"):
        ChildSubEnv("counting", "fake", "child_sub_envs:build_refusing", {"task": "c"})


def test_a_missing_family_environment_names_the_set_up_command(tmp_path, monkeypatch):
    monkeypatch.setenv(VENVS_ROOT_VARIABLE, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"the 'libero' Python environment .* is not set up: run "
                                                r"bash scripts/setup.sh --python-env libero"):
        family_interpreter("libero")


def test_a_family_whose_environment_is_missing_is_refused_at_start_up(make_config, tmp_path, monkeypatch):
    from embodied_async.config import ConfigError
    from envs.maniskill import ManiSkillConfig

    monkeypatch.setenv(VENVS_ROOT_VARIABLE, str(tmp_path))
    assert make_config().env.name == "maniskill"  # a family of our venv needs none
    monkeypatch.setattr(ManiSkillConfig, "python_env", "libero")
    with pytest.raises(ConfigError, match=r"env \(maniskill\): the 'libero' Python environment .* is not set up: run "
                                          r"bash scripts/setup.sh --python-env libero"):
        make_config()


@pytest.mark.slow
def test_children_simulate_at_once_and_step_as_the_same_simulators_in_process(family_venv, monkeypatch, tmp_path):
    support = os.path.join(os.path.dirname(__file__), "support")
    monkeypatch.setenv("PYTHONPATH", support)
    monkeypatch.syspath_prepend(support)
    from child_sub_envs import CountingSubEnv

    logs = [tmp_path / "steps_0.txt", tmp_path / "steps_1.txt"]
    configs = [{"goal": 2, "horizon": 3, "step_log": str(log), "step_sleep_s": 0.2} for log in logs]
    children = SerialEnv([child(**c) for c in configs], np.array([-1.0]), np.array([1.0]), terminal_on_success=False)
    here = SerialEnv([CountingSubEnv({"goal": 2, "horizon": 3}) for _ in logs], np.array([-1.0]), np.array([1.0]),
                     terminal_on_success=False)
    try:
        outs = [env.reset(seed=[3, 4]) for env in (children, here)]
        np.testing.assert_array_equal(outs[0].obs["states"], outs[1].obs["states"])
        # chunks of three: one sub-env's episode ends inside its chunk (the rest is not executed)
        for actions in ([[0.5], [0.5], [0.5]], [[1.0], [-1.0], [0.2]], [[0.0], [0.0], [0.0]]):
            chunk = np.array([actions, actions], np.float32)
            outs = [env.step(chunk) for env in (children, here)]
            for key in ("rewards", "dones", "bootstrap", "successes", "env_steps"):
                np.testing.assert_array_equal(getattr(outs[0], key), getattr(outs[1], key), err_msg=key)
            np.testing.assert_array_equal(outs[0].obs["states"], outs[1].obs["states"])
            assert (outs[0].final_obs is None) == (outs[1].final_obs is None)
            if outs[0].final_obs is not None:
                np.testing.assert_array_equal(outs[0].final_obs["states"], outs[1].final_obs["states"])
    finally:
        children.close()
    # every step of the child that stepped less overlaps one of the other's in time: neither
    # waited for the other's reply (stepped in turn, none would)
    fewer, more = sorted(([tuple(map(float, line.split())) for line in log.read_text().splitlines()] for log in logs),
                         key=len)
    assert len(fewer) >= 3
    assert all(any(b0 < a1 and a0 < b1 for b0, b1 in more) for a0, a1 in fewer), (fewer, more)
