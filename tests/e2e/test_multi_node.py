"""Two Ray nodes on this machine (two raylets): the graph places its workers on the nodes its CPU
placement ids name, and the messages between nodes go through Ray while those within a node go
point to point. A node lost mid-run (its raylet killed): the run restarts from its checkpoint once
the cluster has its nodes again, or stops naming them."""

import json
import os
import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from embodied_async.runner import Runner
from embodied_async.runner.healing import run_healing
from embodied_async.scheduler.channel import RayChannel
from embodied_async.scheduler.direct_channel import DirectChannel
from embodied_async.scheduler.graph_channels import RoutedChannel
from embodied_async.scheduler.worker_group import WorkerFailed

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess


@pytest.fixture
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    # shutdown_at_exit=False: a node may be added from a thread (a lost node's replacement), and
    # the exit hook it would register needs the main thread; the teardown below stops every node
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 100 * 2**20,
                                                            "include_dashboard": False}, shutdown_at_exit=False)
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


# env rank 1 and the rollout worker on the second node, the actor and env rank 0 on the head
SPLIT = ("cluster.num_nodes=2", "cluster.component_placement.env=1-2", "cluster.component_placement.rollout=3",
         "cluster.component_placement.actor=0", "runner.val_check_interval=0", "runner.max_steps=8",
         "runner.save_interval=2", "runner.restarts_per_hour=3")


def records_of(log_path) -> list:
    try:
        with open(os.path.join(log_path, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


def lose_the_second_node_at_step_3(cluster, log_path, replace: bool) -> threading.Thread:
    """Once the run logged step 3: kill the second node's raylet and every process on it; with
    ``replace``, a scheduler's new node joins a moment later."""
    lost = cluster.list_all_nodes()[1]

    def lose():
        deadline = time.monotonic() + 240
        while not any(r.get("step", 0) >= 3 for r in records_of(log_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        cluster.remove_node(lost, allow_graceful=False)
        if replace:
            time.sleep(2)
            cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20)

    thread = threading.Thread(target=lose, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_lost_node_restarts_the_run_from_its_checkpoint_once_a_new_node_joined(two_nodes, make_config):
    cfg = make_config(*SPLIT)
    log_path = cfg.runner.logger.log_path
    losing = lose_the_second_node_at_step_3(two_nodes, log_path, replace=True)
    result = run_healing(cfg)
    losing.join(timeout=5)
    assert result["step"] == 8
    records = records_of(log_path)
    heals = [r for r in records if "heal/fault" in r]
    # its workers died with it: the first found restarted the run (a lost node is not healed in place)
    assert len(heals) == 1 and heals[0]["heal/restarts"] == 1, heals
    assert "heal/replaced" not in heals[0] and ("env[1]" in heals[0]["heal/fault"]
                                                or "rollout[0]" in heals[0]["heal/fault"])
    resumed = heals[0]["step"]
    assert resumed >= 2 and heals[0]["heal/resumed_from"].endswith(f"global_step_{resumed}")
    after = records[records.index(heals[0]) + 1:]
    assert [r["step"] for r in after if "train/actor/current_version" in r] == list(range(resumed + 1, 9))


@pytest.mark.slow
def test_a_lost_node_that_does_not_come_back_stops_the_run_naming_it(two_nodes, make_config):
    cfg = make_config(*SPLIT, "runner.node_wait_s=5")
    losing = lose_the_second_node_at_step_3(two_nodes, cfg.runner.logger.log_path, replace=False)
    started = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"the Ray cluster has 1 answering nodes of cluster.num_nodes=2 after "
                                           r"runner.node_wait_s=5 s: not restarted. Start the missing node, then "
                                           r"resume with runner.resume_dir=\S+global_step_\d+"):
        run_healing(cfg)
    losing.join(timeout=5)
    assert time.monotonic() - started < 240
