"""Two FSDP2 actor ranks give the same first update as one rank on the same data."""

import pytest
import ray
import torch

from embodied_async.config import resolve_topology
from embodied_async.contracts import EnvSpec
from embodied_async.data import Trajectory
from embodied_async.scheduler.channel import RayChannel
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.scheduler.worker_group import WorkerGroup, init_ray, wait_all
from embodied_async.workers.actor_worker import ActorWorker

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

SPEC = EnvSpec(obs_shapes={"states": (5,)}, obs_dtypes={"states": "float32"}, action_dim=2)
T, B = 8, 4  # the SMALL config: 4 envs x 8 steps


def synthetic_trajectory(B: int = B, seed: int = 7) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    dones = torch.zeros(T, B, dtype=torch.bool)
    dones[3, 1] = True
    return Trajectory(
        forward_inputs={"states": rand(T, B, 5)}, actions=rand(T, B, 1, 2), logprobs=rand(T, B) - 2.0,
        values=rand(T, B), rewards=rand(T, B), dones=dones, bootstrap_values=torch.zeros(T, B),
        loss_mask=torch.ones(T, B, dtype=torch.bool), versions=torch.zeros(T, B, dtype=torch.int64),
        next_values=rand(B))


def first_update(make_config, world_size: int, name: str, *overrides, queued=None):
    """``queued``: (stream, trajectory) put for every rank before the update, in order; by default
    one env process's one stream, with one trajectory."""
    # one epoch, one minibatch of the whole batch: the update is then independent of sample order
    cfg = make_config(f"cluster.component_placement.actor=0-{world_size - 1}", "cluster.component_placement.env=0",
                      "algorithm.update_epochs=1",
                      f"actor.global_batch_size={T * B}", f"actor.micro_batch_size={T * B // 2}",
                      "algorithm.target_kl=null", "model.hidden_sizes=[16,16]", *overrides)
    actor_ch, weight_ch = RayChannel.create(f"traj-{name}"), RayChannel.create(f"weights-{name}")
    channels = GraphChannels(env_outputs=None, actions=None, trajectories=actor_ch, weights=weight_ch)
    topology = resolve_topology(cfg)
    assert topology.actor_world_size == world_size
    group = WorkerGroup("actor", ActorWorker, topology, "ray",
                        kwargs_for=lambda r: dict(cfg=cfg, topology=topology, rank=r, env_spec=SPEC,
                                                  channels=channels))
    try:
        host, port = group.call_rank(0, "master_address").result()
        wait_all(group.call("init_model", host, port), timeout=120)
        wait_all(group.call("publish_weights"), timeout=60)
        # a published payload lives in the publishing actor's object store: read it while it runs
        first = weight_ch.get(key=0, timeout=30)
        before = first.state_dict
        for stream, trajectory in queued or [((0, 0), synthetic_trajectory())]:
            for rank, shard in enumerate(trajectory.split(world_size)):
                actor_ch.put(shard, key=(*stream, rank))  # stream (rollout rank, its stream), actor rank
        metrics = wait_all(group.call("train_step"), timeout=120)[0]
        after = weight_ch.get(key=0, timeout=30)
        after_state = after.state_dict
    finally:
        wait_all(group.call("close"), timeout=30)
        group.shutdown()
        actor_ch.destroy()
        weight_ch.destroy()
    assert (first.version, after.version) == (0, 1)
    return before, after_state, metrics


@pytest.mark.slow
def test_two_ranks_match_one_rank(make_config):
    init_ray(1)
    before_1, after_1, metrics_1 = first_update(make_config, 1, "one")
    before_2, after_2, metrics_2 = first_update(make_config, 2, "two")
    for key in before_1:
        torch.testing.assert_close(before_1[key], before_2[key])  # same initial weights
    moved = max((after_1[k] - before_1[k]).abs().max().item() for k in after_1)
    assert moved > 1e-4  # the update really changed the weights
    for key in after_1:
        torch.testing.assert_close(after_1[key], after_2[key], atol=1e-6, rtol=1e-5)
    assert metrics_1["train/critic/value_loss"] == pytest.approx(metrics_2["train/critic/value_loss"], rel=1e-5)
    ray.shutdown()


@pytest.mark.slow
def test_two_ranks_train_on_the_trajectories_rank_0_took_first(make_config):
    """algorithm.batch_from=first_arrived: rank 0 takes shards as they arrive and sends the other
    ranks the order; the update of two ranks equals one rank's. Two pipeline stages (streams) of
    two sub-envs, a trajectory queued on each (the batch whatever the order they arrive in)."""
    init_ray(1)
    queued = [((0, 0), synthetic_trajectory(B // 2, 1)), ((0, 1), synthetic_trajectory(B // 2, 2))]
    pooled = ("algorithm.batch_from=first_arrived", "env.pipeline_stage_num=2")
    before_1, after_1, metrics_1 = first_update(make_config, 1, "pooled-one", *pooled, queued=queued)
    before_2, after_2, metrics_2 = first_update(make_config, 2, "pooled-two", *pooled, queued=queued)
    assert max((after_1[k] - before_1[k]).abs().max().item() for k in after_1) > 1e-4
    for key in after_1:
        torch.testing.assert_close(after_1[key], after_2[key], atol=1e-6, rtol=1e-5)
    for metrics in (metrics_1, metrics_2):
        assert metrics["train/rollout_store/trajectories_lag_0"] == 2
    assert metrics_1["train/critic/value_loss"] == pytest.approx(metrics_2["train/critic/value_loss"], rel=1e-5)
    ray.shutdown()
