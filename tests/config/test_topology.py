"""The topology: resolved once from the placement, it says who serves whom."""

import copy

import pytest
from conftest import SMALL

from embodied_async.config import ConfigError, resolve


def small(**sections):
    cfg = copy.deepcopy(SMALL)
    for name, values in sections.items():
        cfg[name].update(values)
    return cfg


def test_disaggregated_gpu_topology():
    cfg = small(cluster={"device_type": "gpu", "component_placement": {"env": "0-3", "rollout": "4-5",
                                                                        "actor": "6-7"}},
                env={"num_envs": 16, "pipeline_stage_num": 2})
    _, topology = resolve(cfg, num_gpus=8)
    assert topology.device_kind == "gpu"
    assert topology.ids("env") == [0, 1, 2, 3] and topology.ids("actor") == [6, 7]
    assert (topology.num_env_workers, topology.num_rollout_workers, topology.actor_world_size) == (4, 2, 2)
    assert topology.envs_per_stage == 2  # 16 sub-envs / 4 env workers / 2 stages
    assert topology.env_ranks(0) == [0, 1] and topology.env_ranks(1) == [2, 3]
    # a stream per stage of each env worker a rollout rank serves, each its own policy batch
    assert topology.stream_env_keys(0) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert topology.stream_env_keys(1) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert topology.streams == [(r, i) for r in (0, 1) for i in range(4)]


def test_colocated_topology_on_cpu_slots():
    cfg = small(cluster={"device_type": "auto", "component_placement": {"env,rollout,actor": "0"}})
    _, topology = resolve(cfg, num_gpus=0)
    assert topology.device_kind == "cpu"
    assert topology.ids("env") == topology.ids("rollout") == topology.ids("actor") == [0]
    assert topology.envs_per_stage == 4 and topology.streams == [(0, 0)]


def test_gpu_ids_beyond_the_machine_are_rejected():
    cfg = small(cluster={"device_type": "gpu", "component_placement": {"env,rollout,actor": "0-3"}})
    with pytest.raises(ConfigError, match="this machine has 2 GPUs"):
        resolve(cfg, num_gpus=2)
