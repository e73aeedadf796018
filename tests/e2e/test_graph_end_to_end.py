"""End to end: the whole graph, through Ray on a real ManiSkill env and in one process."""

import json
import os

import fake_envs  # noqa: F401  (registers the test envs)
import numpy as np
import pytest
from conftest import assert_logs_every_recipe_metric

from embodied_async.runner import Runner
from embodied_async.scheduler.worker_group import WorkerFailed

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

# the point env that gives a NaN, an inf and a 1e30 now and then: these tests want its samples
# dropped (env.on_nonfinite=drop), not the run ended
FAULTY = ["env.name=faulty_point", "env.on_nonfinite=drop"]


def read_records(cfg):
    with open(os.path.join(cfg.runner.logger.log_path, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_records(records):
    return [r for r in records if "train/actor/current_version" in r]


@pytest.mark.slow
def test_two_async_updates_through_ray_then_resume(make_config):
    cfg = make_config()
    result = Runner(cfg).run()
    assert result["step"] == 2
    records = train_records(read_records(cfg))
    assert [r["step"] for r in records] == [1, 2]
    assert [r["train/actor/current_version"] for r in records] == [0.0, 1.0]
    assert_logs_every_recipe_metric(records[-1])
    assert any("eval/success_rate" in r for r in read_records(cfg))
    assert records[-1]["env_steps"] >= 2 * 4 * 8  # two rollout batches were stepped
    checkpoint = os.path.join(cfg.runner.logger.log_path, "checkpoints", "global_step_2")
    assert os.path.exists(os.path.join(checkpoint, "model.safetensors"))
    assert os.path.exists(os.path.join(cfg.runner.logger.log_path, "tensorboard"))

    # resume: step count and versions carry on from the checkpoint
    resumed = make_config(f"runner.resume_dir={checkpoint}", "runner.max_steps=3",
                          "runner.val_check_interval=0")
    assert Runner(resumed).run()["step"] == 3
    last = train_records(read_records(resumed))[-1]
    assert last["step"] == 3 and last["train/actor/current_version"] == 2.0
    assert last["env_steps"] > records[-1]["env_steps"]


@pytest.mark.slow
def test_one_update_in_process_graph(make_config):
    cfg = make_config("cluster.backend=local", "cluster.component_placement.env=0",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0",
                      "runner.max_steps=1", "runner.save_interval=0")
    assert Runner(cfg).run()["step"] == 1
    record = train_records(read_records(cfg))[0]
    assert record["train/actor/current_version"] == 0.0
    assert np.isfinite(record["train/actor/policy_loss"])


def test_nonfinite_env_values_are_dropped(make_config):
    cfg = make_config("cluster.backend=local", *FAULTY, "cluster.component_placement.env=0",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0",
                      "runner.max_steps=2", "runner.val_check_interval=0", "runner.save_interval=0")
    Runner(cfg).run()
    records = train_records(read_records(cfg))
    assert sum(r["env/nonfinite_dropped"] for r in records) == 4  # nan, inf, an absurd 1e30, nan
    # the dropped samples never reached the loss, which stayed finite
    assert records[0]["train/actor/num_samples"] < 4 * 8
    for r in records:
        for key in ("train/actor/policy_loss", "train/critic/value_loss", "train/actor/grad_norm"):
            assert np.isfinite(r[key]), key


def test_dead_worker_fails_the_run_with_its_error(make_config):
    cfg = make_config("cluster.backend=local", "env.name=crashing_point", "cluster.component_placement.env=0",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0",
                      "runner.max_steps=3", "runner.val_check_interval=0", "runner.save_interval=0")
    with pytest.raises(WorkerFailed, match="simulator exploded"):
        Runner(cfg).run()


def test_interpolated_proximal_logprobs_train(make_config):
    """rollout.recompute_logprobs=false: log pi_proximal is interpolated by version instead."""
    cfg = make_config("cluster.backend=local", *FAULTY, "cluster.component_placement.env=0",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0",
                      "rollout.recompute_logprobs=false", "runner.max_steps=3", "runner.val_check_interval=0",
                      "runner.save_interval=0")
    assert Runner(cfg).run()["step"] == 3
    records = train_records(read_records(cfg))
    assert [r["train/actor/current_version"] for r in records] == [0.0, 1.0, 2.0]
    for r in records:
        assert np.isfinite(r["train/actor/policy_loss"]) and np.isfinite(r["train/actor/behav_approx_kl"])


@pytest.mark.parametrize("staleness", [0, 1])
def test_pipeline_stages_sync_and_async(make_config, staleness):
    """Two pipeline stages per env worker; synchronous PPO must not deadlock on the throttle."""
    cfg = make_config("cluster.backend=local", *FAULTY, "cluster.component_placement.env=0",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0",
                      "env.pipeline_stage_num=2", f"algorithm.staleness_threshold={staleness}",
                      "runner.max_steps=3", "runner.val_check_interval=0", "runner.save_interval=0")
    assert Runner(cfg).run()["step"] == 3
    records = train_records(read_records(cfg))
    # the actor consumed one trajectory per stage per update, and never anything staler than allowed
    assert all(r["train/actor/num_samples"] > 0 for r in records)
    assert all(r["train/actor/staleness"] <= staleness for r in records)
    if staleness == 0:
        assert all(r["train/actor/average_version"] == r["train/actor/current_version"] for r in records)


def test_weights_arriving_during_a_shared_evaluation_wait_for_its_end(make_config, monkeypatch):
    """A policy too large to copy is evaluated in place: swaps that arrive meanwhile are held,
    and a rollout waiting for weights gets the held ones as soon as the evaluation ends. A small
    policy is copied instead, and swaps go on."""
    import threading

    from embodied_async.config import resolve_topology
    from embodied_async.data import WeightMessage
    from embodied_async.scheduler.channel import LocalChannel, Shared
    from embodied_async.scheduler.graph_channels import GraphChannels
    from embodied_async.workers import rollout_worker

    cfg = make_config("cluster.backend=local", "env.name=outcome_point", "cluster.component_placement.env=0",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0")
    channels = GraphChannels(*(LocalChannel(name=n) for n in ("env", "actions", "trajectories", "weights")))
    worker = rollout_worker.RolloutWorker(cfg, resolve_topology(cfg), rank=0, device_id=0,
                                          env_spec=fake_envs.PointEnv(num_envs=1, seed=0).spec, channels=channels)
    state = {k: v.clone() for k, v in worker.policy.state_dict().items()}
    publish = lambda version: channels.weights.put(WeightMessage(version, Shared(value=state), {}), key=0)  # noqa: E731
    publish(0)
    worker._wait_for_weights()
    started, release, seen, results = threading.Event(), threading.Event(), [], []
    run_evaluation = worker._run_evaluation

    def gated_evaluation(policy, version, *args):
        seen.append(policy is worker.policy)
        started.set()
        release.wait(timeout=30)
        return run_evaluation(policy, version, *args)

    worker._run_evaluation = gated_evaluation
    monkeypatch.setattr(rollout_worker, "EVAL_COPY_MAX_BYTES", 0)  # any policy counts as large
    evaluation = threading.Thread(target=lambda: results.append(worker.evaluate(2, 1)))
    evaluation.start()
    assert started.wait(timeout=30) and seen == [True]  # shared, not copied
    publish(1)
    waiter = threading.Thread(target=worker._wait_for_weights)
    waiter.start()
    waiter.join(timeout=2.0)
    assert waiter.is_alive() and worker.version == 0  # held, not swapped under the evaluation
    release.set()
    evaluation.join(timeout=60)
    waiter.join(timeout=5.0)
    assert not waiter.is_alive() and worker.version == 1
    assert results[0]["eval/version"] == 0.0

    monkeypatch.setattr(rollout_worker, "EVAL_COPY_MAX_BYTES", 2**30)  # a small policy: copied
    started.clear()
    evaluation = threading.Thread(target=lambda: results.append(worker.evaluate(2, 1)))
    evaluation.start()
    assert started.wait(timeout=30) and seen == [True, False]
    publish(2)
    worker._poll_weights()
    assert worker.version == 2  # swaps go on while the copy is evaluated
    evaluation.join(timeout=60)
    worker.close()


def test_each_env_process_is_answered_as_soon_as_its_observations_arrive(make_config):
    """Two env processes on one rollout worker: each is its own stream (its own policy batch and
    trajectories), so the one whose step ends first gets its actions without waiting for the
    other's observations, and its trajectory reaches the actor on its own key. The streams begin
    their trajectories together: the next one of the early stream waits for the late stream's."""
    import threading
    import time

    from embodied_async.config import resolve_topology
    from embodied_async.data import ActionMessage, WeightMessage
    from embodied_async.scheduler.channel import LocalChannel, Shared
    from embodied_async.scheduler.graph_channels import GraphChannels
    from embodied_async.workers import rollout_worker

    cfg = make_config("cluster.backend=local", "env.name=outcome_point", "env.num_envs=4", "rollout.num_steps=2",
                      "actor.global_batch_size=8", "cluster.component_placement.env=0-1",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0")
    topology = resolve_topology(cfg)
    assert topology.stream_env_keys(0) == [(0, 0), (1, 0)] and topology.envs_per_stage == 2
    channels = GraphChannels(*(LocalChannel(name=n) for n in ("env", "actions", "trajectories", "weights")))
    worker = rollout_worker.RolloutWorker(cfg, topology, rank=0, device_id=0,
                                          env_spec=fake_envs.PointEnv(num_envs=1, seed=0).spec, channels=channels)
    state = {k: v.clone() for k, v in worker.policy.state_dict().items()}
    channels.weights.put(WeightMessage(0, Shared(value=state), {}), key=0)
    loop = threading.Thread(target=worker.run)
    loop.start()
    try:
        late_env = fake_envs.PointEnv(num_envs=2, seed=1)
        early_env = fake_envs.PointEnv(num_envs=2, seed=2)
        channels.env_outputs.put(early_env.reset(), key=(1, 0))  # env process 1 only; 0 still stepping
        for _ in range(2):  # two decisions: a whole trajectory of env process 1
            message: ActionMessage = channels.actions.get(key=(1, 0), timeout=30)
            assert message.actions.shape[0] == 2  # its own sub-envs only
            channels.env_outputs.put(early_env.step(message.actions), key=(1, 0))
        shard = channels.trajectories.get(key=(0, 1, 0), timeout=30)  # (rollout rank, stream, actor rank)
        assert shard.actions.shape[:2] == (2, 2) and channels.actions.qsize((0, 0)) == 0
        time.sleep(0.5)
        assert channels.actions.qsize((1, 0)) == 0  # its next trajectory waits for env process 0's first
        channels.env_outputs.put(late_env.reset(), key=(0, 0))
        for _ in range(2):
            message = channels.actions.get(key=(0, 0), timeout=30)
            assert message.actions.shape[0] == 2
            channels.env_outputs.put(late_env.step(message.actions), key=(0, 0))
        assert channels.trajectories.get(key=(0, 0, 0), timeout=30).actions.shape[:2] == (2, 2)
        assert channels.actions.get(key=(1, 0), timeout=30).actions.shape[0] == 2  # both begin the next
    finally:
        worker.stop()
        loop.join(timeout=30)
        worker.close()
    assert not loop.is_alive()


@pytest.mark.parametrize("pauses", [True, False])
def test_a_paused_evaluation_stops_the_graph_and_the_clock(make_config, monkeypatch, pauses):
    """runner.eval_pauses_training: while an evaluation runs no env steps (beyond the one in
    flight per env worker), it scores the version just trained, and train_time_s leaves its
    seconds out. Beside training (the default) the envs go on stepping meanwhile."""
    import threading
    import time

    from embodied_async.workers.env_worker import EnvWorker
    from embodied_async.workers.rollout_worker import RolloutWorker

    stepped, lock, during = [0], threading.Lock(), []
    sanitize, run_evaluation = EnvWorker._sanitize, RolloutWorker._run_evaluation

    def counting_sanitize(self, stage, out):  # a slow simulator: collection outlasts an update
        time.sleep(0.02)
        with lock:
            stepped[0] += 1
        return sanitize(self, stage, out)

    def slow_evaluation(self, *args):
        before = stepped[0]
        time.sleep(0.4)
        during.append(stepped[0] - before)
        return run_evaluation(self, *args)

    monkeypatch.setattr(EnvWorker, "_sanitize", counting_sanitize)
    monkeypatch.setattr(RolloutWorker, "_run_evaluation", slow_evaluation)
    cfg = make_config("cluster.backend=local", *FAULTY, "cluster.component_placement.env=0",
                      "cluster.component_placement.rollout=0", "cluster.component_placement.actor=0",
                      "runner.max_steps=4", "runner.val_check_interval=2", "runner.save_interval=0",
                      f"runner.eval_pauses_training={str(pauses).lower()}")
    assert Runner(cfg).run()["step"] == 4
    records = train_records(read_records(cfg))
    evaluated = [r for r in records if "eval/success_rate" in r]
    if pauses:
        assert during and all(steps <= 1 for steps in during)  # one env worker, one step in flight
        assert [(r["step"], r["eval/version"]) for r in evaluated] == [(2, 2.0), (4, 4.0)]
        # the pause after step 2 is inside the wall time of steps 3 and 4, not their training time
        assert records[2]["wall_time_s"] - records[2]["train_time_s"] >= 0.4
        assert records[0]["train_time_s"] == records[0]["wall_time_s"]
    else:
        assert any(steps > 1 for steps in during)
        assert all(r["train_time_s"] == r["wall_time_s"] for r in records)
