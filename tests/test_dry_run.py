"""runner.dry_run: the plan of the 7B recipe on a machine without GPUs, and the arithmetic behind it."""

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO_ROOT

from embodied_async.config import resolve_topology
from embodied_async.plan import describe, memory_per_device, planned_num_gpus
from embodied_async.registry import build_policy
from models.openvla.memory import parameter_counts

ENTRY = os.path.join(REPO_ROOT, "examples", "embodiment", "train_async.py")


@pytest.mark.slow  # runs the entry point in a subprocess
def test_7b_recipe_dry_run_prints_the_plan_and_starts_nothing():
    command = [sys.executable, ENTRY, "--config-name", "maniskill_async_ppo_openvla", "runner.dry_run=true"]
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "nothing started" in out and "building workers" not in out
    for device in range(4):
        assert f"GPU {device}: env {device}, rollout {device}, actor {device}" in out
    assert "5120 decisions" in out and "16 optimiser steps per update" in out and "2 micro-batches of 40" in out
    totals = [float(x) for x in re.findall(r"^  GPU \d: ([\d.]+) GiB$", out, flags=re.M)]
    assert len(totals) == 4 and all(20 < t < 80 for t in totals)  # fits 4 x 80 GB with room
    assert "rollout weights" in out and "actor Adam moments (shard)" in out and "rollout KV cache" in out


@pytest.mark.slow  # runs the entry point in a subprocess
def test_pi0_recipe_dry_run_prints_its_plan():
    proc = subprocess.run([sys.executable, ENTRY, "--config-name", "maniskill_async_ppo_pi0", "runner.dry_run=true"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model pi0" in proc.stdout and "1024 decisions (5120 env steps)" in proc.stdout
    totals = [float(x) for x in re.findall(r"^  GPU \d: ([\d.]+) GiB$", proc.stdout, flags=re.M)]
    assert len(totals) == 4 and all(10 < t < 80 for t in totals)


def test_pi0_parameter_counts_of_the_plan_match_the_built_policy(make_config, tmp_path):
    from models.pi0.memory import _architecture, _counts

    cfg = make_config("model.name=pi0", f"model.path={tmp_path}/tiny_pi0", "model.tiny_random_init=true",
                      "model.tokenizer=words", "model.value_head_hidden_sizes=[16]", "model.lora.enabled=true",
                      "model.lora.rank=4", "model.camera_keys=[main_images]")
    policy = build_policy(cfg.model, None)  # makes the tiny checkpoint (8 state dims, 7 actions), loads it
    counts = _counts(cfg.model, _architecture(cfg.model)[0])
    assert counts["total"] == sum(p.numel() for p in policy.parameters())
    assert counts["trainable"] == sum(p.numel() for p in policy.parameters() if p.requires_grad)


def test_dry_run_plans_for_the_gpus_the_placement_names():
    placement = lambda **ids: SimpleNamespace(cluster=SimpleNamespace(component_placement=ids))  # noqa: E731
    assert planned_num_gpus(placement(env="0-3", rollout="2-3", actor="0,5")) == 6
    with pytest.raises(ValueError, match="'all'"):
        planned_num_gpus(placement(env="0", rollout="0", actor="all"))


def test_parameter_counts_of_the_plan_match_the_built_policy(make_config, tmp_path):
    overrides = ["model.name=openvla", f"model.path={tmp_path}/tiny", "model.tiny_random_init=true",
                 "model.unnorm_key=tiny", "model.value_head_hidden_sizes=[16]", "model.lora.enabled=true",
                 "model.lora.rank=4", "model.lora.target_modules=[qkv,fc1,q_proj,lm_head]"]
    cfg = make_config(*overrides)
    counts = parameter_counts(cfg.model)
    policy = build_policy(cfg.model, None)  # makes the tiny checkpoint, then loads it
    assert counts["total"] == sum(p.numel() for p in policy.parameters())
    assert counts["trainable"] == sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert counts["largest_unit"] == max(sum(p.numel() for p in u.parameters()) for u in policy.fsdp_units())


def test_memory_per_device_adds_each_component_placed_there(make_config, tmp_path):
    cfg = make_config("model.name=openvla", f"model.path={tmp_path}/tiny", "model.tiny_random_init=true",
                      "model.precision=bfloat16", "model.lora.enabled=true", "cluster.device_type=gpu",
                      "cluster.component_placement.env=0-1", "cluster.component_placement.rollout=0-1",
                      "cluster.component_placement.actor=1", "runner.dry_run=true")
    topology = resolve_topology(cfg, num_gpus=2)
    per_device = memory_per_device(cfg, topology)
    assert "evaluation KV cache" in per_device[0] and "evaluation KV cache" not in per_device[1]
    assert not any(k.startswith("actor") for k in per_device[0])
    trainable = parameter_counts(cfg.model)["trainable"]
    assert per_device[1]["actor Adam moments (shard)"] == trainable * 8  # one rank holds all of it
    assert per_device[0]["rollout weights"] == parameter_counts(cfg.model)["total"] * 2  # bf16
    assert torch.bfloat16.itemsize == 2


def test_the_plan_says_how_the_staleness_bound_is_set(make_config):
    fixed = make_config("algorithm.staleness_threshold=2")
    assert "  staleness: the rollout runs at most 2 version(s) ahead" in describe(fixed, resolve_topology(fixed))
    controlled = make_config("algorithm.staleness_control=kl", "algorithm.staleness_threshold=5",
                             "algorithm.staleness_max=3", "algorithm.staleness_kl_patience=4")
    assert ("staleness: follows the behaviour KL, starting at 3 version(s) ahead, within [0, 3]: raised after "
            "4 updates in a row under 0.01, lowered after as many over 0.03") in describe(controlled,
                                                                                         resolve_topology(controlled))
    assert "batch: the first" not in describe(fixed, resolve_topology(fixed))
    pooled = make_config("algorithm.batch_from=first_arrived", "algorithm.rollout_store_size_per_rank=2")
    streams = len(resolve_topology(pooled).streams)
    assert (f"  batch: the first {2 * streams} trajectories to arrive, from any stream (a slow env worker's share "
            "is filled by the others)") in describe(pooled, resolve_topology(pooled))
