"""Shared test helpers: small configs built through the real schema and validation."""

import copy
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

import envs  # noqa: F401,I001  (MuJoCo's EGL backend, before a test module imports ManiSkill and with it mujoco)
from embodied_async.config import to_train_config

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# golden data made by reference implementations; read-only, beside the checkout (also in CI)
FIXTURES = os.path.join(REPO_ROOT, "..", "shared", "fixtures")
OPENVLA_FIXTURES = ["openvla_tiny_a", "openvla_tiny_b"]


def reference_fixture(name: str) -> str:
    """The folder of reference fixture ``name`` (../shared/fixtures). Missing, it fails the test in
    CI (CI=true: the fixtures come with its checkout, so a missing one is a broken set-up) and
    skips it elsewhere."""
    folder = os.path.join(FIXTURES, name)
    if not os.path.isdir(folder):
        message = f"reference fixture {folder} is missing (../shared/fixtures belongs beside the checkout)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return folder


@pytest.fixture(scope="session")
def libero_python_env() -> str:
    """The interpreter of ``.venv-libero``, built on first use by the set-up command a user runs
    (about two minutes and 2.1 GB the first time, a second after): only the tests that start
    LIBERO's simulators ask for it, so the fast tier never builds it."""
    from embodied_async.isolated.child import family_interpreter

    subprocess.run(["bash", "scripts/setup.sh", "--python-env", "libero"], cwd=REPO_ROOT, check=True)
    return family_interpreter("libero")


sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "support"))
sys.path.append(os.path.join(REPO_ROOT, "scripts"))  # tests import a script's functions as a module
sys.path.append(os.path.join(REPO_ROOT, "benchmarks"))  # and a benchmark's

# A PushCube run small enough for a test: 2 updates of 4 envs x 8 steps.
SMALL = {
    "cluster": {"backend": "ray", "device_type": "cpu",
                "component_placement": {"env": "0-1", "rollout": "2", "actor": "3"}},
    "env": {"name": "maniskill", "task": "PushCube-v1", "obs_mode": "state", "num_envs": 4,
            "max_episode_steps": 10, "control_mode": "pd_joint_delta_pos"},
    "model": {"name": "mlp", "hidden_sizes": [32, 32]},
    "algorithm": {"update_epochs": 2, "staleness_threshold": 1},
    "rollout": {"num_steps": 8},
    "actor": {"global_batch_size": 16, "micro_batch_size": 8},
    "runner": {"max_steps": 2, "val_check_interval": 1, "eval_episodes": 2, "eval_num_envs": 2,
               "save_interval": 1},
}


def build_config(tmp_path, *overrides: str):
    """SMALL + ``key=value`` overrides -> validated TrainConfig logging under ``tmp_path``.

    A ``model.name=`` or ``env.name=`` override naming another family drops SMALL's keys of that
    section (they belong to its family; the env keeps num_envs, which every env has), and
    ``runner.mode=sft`` drops the sections only PPO reads (validation refuses them in an SFT run).
    """
    base = copy.deepcopy(SMALL)
    if "runner.mode=sft" in overrides:
        base.pop("algorithm"), base.pop("rollout")
    for section, keep in (("model", {}), ("env", {"num_envs": base["env"]["num_envs"]})):
        names = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{section}.name=")]
        if names and names[-1] != base[section]["name"]:
            base[section] = dict(keep)
    cfg = OmegaConf.merge(OmegaConf.create(base), OmegaConf.from_dotlist(
        [f"runner.logger.log_path={tmp_path}/logs", "runner.logger.backends=[tensorboard]", *overrides]))
    return to_train_config(cfg)


@pytest.fixture
def make_config(tmp_path):
    return lambda *overrides: build_config(tmp_path, *overrides)


@pytest.fixture(scope="module", autouse=True)
def fresh_ray_per_module():
    """Each test module starts without a Ray session and leaves none behind."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


# What every recipe's training records carry (each update's record; eval/* come with evaluations):
# the metrics DESIGN.md names and the graph's own (channels, rollout store, throughput).
EVERY_RECIPE_METRICS = [
    "train/actor/policy_loss", "train/actor/proximal_approx_kl", "train/actor/behav_approx_kl",
    "train/actor/clip_fraction", "train/actor/dual_clip_fraction", "train/actor/behav_clip_fraction",
    "train/actor/average_version", "train/actor/current_version", "train/actor/entropy", "train/actor/grad_norm",
    "train/actor/ratio_mean", "train/actor/staleness", "train/actor/num_samples", "train/actor/epochs",
    "train/actor/nonfinite_skipped", "train/actor/optimizer_steps", "train/actor/published_bytes",
    "train/staleness_threshold", "train/critic/value_loss", "train/critic/explained_variance",
    "train/critic/value_clip_fraction",
    "train/rollout_store/held_trajectories", "train/rollout_store/dropped_trajectories",
    "train/rollout_store/max_lag", "train/rollout_store/waited_for_fresh", "train/rollout_store/trajectories_lag_0",
    "train/rollout_store/fewest_from_one_stream",
    "time/env", "time/rollout", "time/actor_training", "time/actor_data_wait", "throughput/env_steps_per_s",
    "env/success_rate", "env/episode_return", "env/episode_len", "env/episodes", "env/env_steps",
    "env/nonfinite_dropped", "channel/env_outputs_qsize", "channel/actions_qsize", "channel/trajectories_qsize",
    "channel/weights_qsize", "step", "env_steps", "wall_time_s",
]


def assert_logs_every_recipe_metric(record) -> None:
    missing = [k for k in EVERY_RECIPE_METRICS if k not in record]
    assert not missing, f"not logged: {missing}"
    for key in EVERY_RECIPE_METRICS:
        value = record[key]
        assert value is None or value == value, f"{key} is NaN"  # None: no episode ended in the window


def run_recipe(config_name: str, log_path, *overrides: str, timeout: int = 600):
    """Run ``train_async.py`` on a recipe in a subprocess -> (completed process, metrics records)."""
    import json
    import subprocess

    entry = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")
    proc = subprocess.run([sys.executable, entry, "--config-name", config_name, f"runner.logger.log_path={log_path}",
                           *overrides], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(log_path, "metrics.jsonl")) as f:
        return proc, [json.loads(line) for line in f]


# After the last test, the session's exit status is final: the process ends with it at once. The
# interpreter's own teardown of native libraries (the Vulkan driver the ManiSkill renderer loaded,
# torch's and Ray's threads) can crash after every test passed (seen once: a segfault after "839
# passed"), and that crash, not the tests, would then decide what CI reads.
@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    status = config.stash.get(_EXIT_STATUS, None)
    if status is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


_EXIT_STATUS = pytest.StashKey[int]()
