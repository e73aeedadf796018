"""algorithm.adv_type=grpo through the graph (one process, the synthetic env): each trajectory
starts every group of sub-envs from one seed, the actor trains only on the steps of episodes in
groups whose returns differ, builds and trains no critic; demonstrations enter the loss."""

import json
import os

import numpy as np
import pytest
from demonstrations import random_demonstrations

from embodied_async import serial_env
from embodied_async.contracts import sub_env_seeds
from embodied_async.runner import Runner
from embodied_async.workers import actor_worker

pytestmark = pytest.mark.slow  # runs the graph

LOCAL = ["cluster.backend=local", "cluster.component_placement.env=0", "cluster.component_placement.rollout=0",
         "cluster.component_placement.actor=0", "runner.val_check_interval=0", "runner.save_interval=0"]
SYNTHETIC = ["env.name=synthetic_image", "env.image_size=[16,16]", "env.action_dim=2", "env.max_episode_steps=6",
             "env.num_envs=8", "rollout.num_steps=6", "actor.global_batch_size=16", "actor.micro_batch_size=16"]


def records(cfg):
    with open(os.path.join(cfg.runner.logger.log_path, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "train/actor/current_version" in r]


def test_groups_share_their_seed_and_only_informative_groups_train(make_config, monkeypatch, tmp_path):
    resets, masks = [], []
    reset, advantages = serial_env.SerialEnv.reset, actor_worker.group_relative_advantages

    def spy_reset(self, seed=None):
        if isinstance(seed, list):  # the env worker's grouped resets (an int: an env's own at its build)
            resets.append(sub_env_seeds(seed, self.num_envs))
        return reset(self, seed)

    def spy_advantages(*args, **kwargs):
        out = advantages(*args, **kwargs)
        masks.append(out[1])
        return out

    monkeypatch.setattr(serial_env.SerialEnv, "reset", spy_reset)
    monkeypatch.setattr(actor_worker, "group_relative_advantages", spy_advantages)
    demos = random_demonstrations(str(tmp_path / "demos"), make_config(*LOCAL, *SYNTHETIC).env)
    cfg = make_config(*LOCAL, *SYNTHETIC, "algorithm.adv_type=grpo", "algorithm.group_size=4",
                      "algorithm.normalize_advantages=false",
                      "algorithm.demo_loss_coef=0.5", "algorithm.demo_batch_size=8", f"dataset.root={demos}",
                      "runner.max_steps=3", "algorithm.update_epochs=1")
    assert cfg.model.add_value_head is False
    Runner(cfg).run()
    grouped = resets
    assert len(grouped) >= 4  # the first observations, then one per finished trajectory
    for seeds in grouped:
        assert seeds[:4] == [seeds[0]] * 4 and seeds[4:] == [seeds[4]] * 4 and seeds[0] != seeds[4]
    assert len({tuple(seeds) for seeds in grouped}) == len(grouped)  # fresh initial states every trajectory
    trained = records(cfg)
    assert [r["train/actor/num_samples"] for r in trained] == [float(m.sum()) for m in masks]
    for record in trained:
        assert not any(k.startswith("train/critic/") for k in record)
        assert record["train/grpo/groups"] == 2.0 and "train/grpo/groups_dropped" in record
        if record["train/actor/optimizer_steps"]:
            assert np.isfinite(record["train/demo/loss"]) and np.isfinite(record["train/actor/policy_loss"])
