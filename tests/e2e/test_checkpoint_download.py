"""A hub checkpoint that cannot be fetched stops the launcher before any worker starts: one clean
message naming the repo and the command to run where the hub is reachable, exit code 2."""

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")


@pytest.mark.parametrize("recipe,repo", [("maniskill_async_ppo_openvla_tiny", "someone/no-such-openvla"),
                                         ("maniskill_async_ppo_openpi_tiny", "someone/no-such-pi0")])
def test_missing_hub_checkpoint_is_one_clean_message_before_workers(tmp_path, recipe, repo):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))  # no network, empty cache
    proc = subprocess.run([sys.executable, ENTRY, "--config-name", recipe, f"model.path={repo}",
                           "model.tiny_random_init=false", f"runner.logger.log_path={tmp_path}/run"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"hf download {repo}" in proc.stderr and proc.stderr.startswith("checkpoint error:")
    assert "Traceback" not in proc.stderr and "building workers" not in proc.stdout
