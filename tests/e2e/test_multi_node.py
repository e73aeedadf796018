"""Two Ray nodes on this machine (two raylets): the graph places its workers on the nodes its CPU
placement ids name, and the messages between nodes go through Ray while those within a node go
point to point."""

import json
import os

import pytest
import ray
from ray.cluster_utils import Cluster

from embodied_async.runner import Runner
from embodied_async.scheduler.channel import RayChannel
from embodied_async.scheduler.direct_channel import DirectChannel
from embodied_async.scheduler.graph_channels import RoutedChannel

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess


@pytest.fixture
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 100 * 2**20,
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_env_and_actor_on_different_nodes(two_nodes, make_config):
    head = ray.get_runtime_context().get_node_id()
    # CPU ids count over the nodes, head first: 0-1 on the head node, 2-3 on the other.
    # env rank 0 on the head, env rank 1 and the rollout on the other node, the actor on the head.
    cfg = make_config("cluster.num_nodes=2", "cluster.component_placement.env=1-2",
                      "cluster.component_placement.rollout=3", "cluster.component_placement.actor=0",
                      "runner.val_check_interval=0")
    runner = Runner(cfg)
    result = runner.run()
    assert result["step"] == 2

    graph = runner.graph
    other = graph.rollout.nodes[0]
    assert other != head
    assert graph.env.nodes == [head, other] and graph.actor.nodes == [head]
    # every worker runs on the node it was pinned to (asked from inside the worker's process)
    assert runner.worker_nodes == {group.name: group.nodes for group in graph.groups.values()}
    # env rank 1 shares the rollout's node: point to point; env rank 0 goes through Ray, and so
    # do trajectories from the rollout (other node) to the actor (head)
    assert isinstance(graph.channels.env_outputs, RoutedChannel)
    assert graph.channels.env_outputs.direct_keys == {(1, 0)}
    assert isinstance(graph.channels.env_outputs.direct, DirectChannel)
    assert isinstance(graph.channels.trajectories, RayChannel)

    with open(os.path.join(cfg.runner.logger.log_path, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["train/actor/current_version"] for r in records] == [0.0, 1.0]
    assert records[-1]["env_steps"] >= 2 * 4 * 8  # both env workers stepped their sub-envs
    assert all(r["traffic/env_messages"] > 0 and r["traffic/actor_messages"] > 0 for r in records)
