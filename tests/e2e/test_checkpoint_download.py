"""A hub checkpoint that cannot be fetched stops the launcher before any worker starts: one clean
message naming the repo and the command to run where the hub is reachable, exit code 2."""

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")


@pytest.mark.parametrize("recipe,repo", [("maniskill_async_ppo_openvla_tiny", "someone/no-such-openvla"),
                                         ("maniskill_async_ppo_pi0_tiny", "someone/no-such-pi0")])
def test_missing_hub_checkpoint_is_one_clean_message_before_workers(tmp_path, recipe, repo):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))  # no network, empty cache
    proc = subprocess.run([sys.executable, ENTRY, "--config-name", recipe, f"model.path={repo}",
                           "model.tiny_random_init=false", f"runner.logger.log_path={tmp_path}/run"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"hf download {repo}" in proc.stderr and proc.stderr.startswith("checkpoint error:")
    assert "Traceback" not in proc.stderr and "building workers" not in proc.stdout


def cached_hub_repo(cache, repo_id, make):
    """A repo as the hub's cache holds it after ``hf download``: refs/main names a snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / ("models--" + repo_id.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    make(str(root / "snapshots" / commit))
    return str(root / "snapshots" / commit)


def test_a_cached_hub_checkpoint_loads_without_the_hub_and_the_config_keeps_the_repo_id(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from embodied_async.contracts import EnvSpec
    from models.pi0.configuration_policy import Pi0PolicyConfig
    from models.pi0.policy_pi0 import build_pi0_policy
    from models.pi0.tiny import make_tiny_pi0

    cached_hub_repo(tmp_path / "hub", "someone/tiny-pi0", lambda folder: make_tiny_pi0(folder, 8, 7))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: any request fails
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    cfg = Pi0PolicyConfig(path="someone/tiny-pi0", tokenizer="words", num_steps=2)
    cfg.fetch()  # the launcher's download: the hub is unreachable, the cache has it
    assert cfg.path == "someone/tiny-pi0"  # what checkpoints' model_info.json and the saved config record
    spec = EnvSpec(obs_shapes={"states": (8,), "main_images": (32, 32, 3)},
                   obs_dtypes={"states": "float32", "main_images": "uint8"}, action_dim=7, num_action_chunks=5)
    import huggingface_hub

    download = huggingface_hub.snapshot_download

    def cache_only(**kwargs):  # a worker must not ask the hub for what the launcher fetched
        assert kwargs.get("local_files_only"), f"a worker asked the hub: {kwargs}"
        return download(**kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cache_only)
    policy = build_pi0_policy(cfg, spec)
    assert policy.model.arch.action_dim == 7
    assert policy.model.state_proj.weight.shape[1] == policy.model.arch.max_state_dim
