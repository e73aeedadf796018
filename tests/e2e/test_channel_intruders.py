"""A whole training run (the default recipe, a few updates) on a machine where other processes keep
trying to connect to every socket the run opens and to deliver a pickle that would create a file:
one of our own uid (without the run's secret) and, where the tests run as root, one of another
user. The run completes, the file never appears, and the refused attempts show in the metrics."""

import os
import shutil
import tempfile

import pytest
from conftest import run_recipe
from local_users import NOBODY, outcomes, start_intruder

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess


@pytest.mark.slow
def test_a_training_run_completes_while_intruders_keep_trying(tmp_path, monkeypatch):
    marker = tmp_path / "executed"
    # the run's channel folders go under a folder of this test's, which any user may enter (as
    # /dev/shm): the intruders attack this run's sockets alone, not other runs on the machine
    parent = tempfile.mkdtemp(prefix="intruded-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(parent, 0o755)
    monkeypatch.setenv("EMBODIED_ASYNC_CHANNEL_DIR", parent)
    # each keeps trying until it is told to stop (10 minutes at most)
    intruders = {"same uid": start_intruder(marker, "frame", 600, parent)}
    if os.getuid() == 0:
        intruders["uid 65534"] = start_intruder(marker, "frame", 600, parent, uid=NOBODY)
    try:
        _, records = run_recipe("maniskill_async_ppo_mlp", tmp_path / "run", "runner.max_steps=3",
                                "runner.val_check_interval=0", "env.num_envs=4", "rollout.num_steps=8",
                                "actor.global_batch_size=32", "actor.micro_batch_size=32", "algorithm.update_epochs=1")
    finally:
        for proc in intruders.values():
            proc.terminate()
        tries = {who: outcomes(proc) for who, proc in intruders.items()}
        shutil.rmtree(parent, ignore_errors=True)
    assert not marker.exists(), "an intruder's pickle was executed"
    assert [r["step"] for r in records] == [1, 2, 3]
    refused = sum(value for r in records for key, value in r.items() if key.endswith("_refused_connections"))
    tried = {who: sum(len(attempts) for attempts in by_socket.values()) for who, by_socket in tries.items()}
    # the same-uid intruder got in before some producer and was refused by the proof
    assert refused >= 1 and tried["same uid"] > 10, (refused, tries)
    sent = sum(attempts.count("sent") for attempts in tries["same uid"].values())
    assert refused <= sent  # every refusal is one of its connections
    if "uid 65534" in tries:  # the other user never even connected: the folder keeps it out
        other = {outcome for attempts in tries["uid 65534"].values() for outcome in attempts}
        assert tried["uid 65534"] > 10 and other <= {"PermissionError", "FileNotFoundError"}, tries["uid 65534"]
