"""The actor on a LoRA policy (tiny OpenVLA, bf16): what trains when, in which dtype, and what a
publish sends. Runs one real actor in this process (FSDP2, world size 1, gloo)."""

import os

import numpy as np
import pytest
import torch

from embodied_async.config import resolve_topology
from embodied_async.contracts import EnvSpec
from embodied_async.data import StepRecord, Trajectory
from embodied_async.registry import build_policy
from embodied_async.scheduler.channel import LocalChannel
from embodied_async.scheduler.graph_channels import GraphChannels
from embodied_async.workers.actor_worker import ActorWorker
from embodied_async.workers.sharding import gather_trainable
from embodied_async.workers.trainer_core import free_port

pytestmark = pytest.mark.slow  # runs the graph: Ray, worker processes or a recipe in a subprocess

T, B = 4, 2  # one update = 8 decisions = 2 optimiser steps of 4
SPEC = EnvSpec(obs_shapes={"main_images": (32, 32, 3)}, obs_dtypes={"main_images": "uint8"}, action_dim=7)


@pytest.fixture
def lora_config(make_config, tmp_path):
    return make_config(
        "model.name=openvla", f"model.path={tmp_path}/tiny_openvla", "model.tiny_random_init=true",
        "model.unnorm_key=tiny", "model.precision=bfloat16", "model.value_head_hidden_sizes=[16]",
        "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8",
        "model.lora.target_modules=[q_proj,v_proj]",
        "model.store_raw_images=true", f"env.num_envs={B}", f"rollout.num_steps={T}", "actor.global_batch_size=4",
        "cluster.component_placement.env=0",  # one stream: the actor trains on the one trajectory put below
        "actor.micro_batch_size=2", "actor.critic_warmup_steps=2", "actor.lr=1e-2", "actor.value_lr=1e-2",
        "algorithm.update_epochs=1", "algorithm.target_kl=null", "rollout.recompute_logprobs=false")


def trajectory(cfg, seed: int) -> Trajectory:
    """T decisions of B sub-envs sampled by a rollout-side copy of the policy."""
    torch.manual_seed(seed)
    policy = build_policy(cfg.model, SPEC)
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(T):
        obs = {"main_images": rng.integers(0, 256, (B, 32, 32, 3), dtype=np.uint8),
               "task_descriptions": ["put the carrot on the plate"] * B}
        out = policy.predict(obs, mode="train")
        steps.append(StepRecord(
            forward_inputs={k: v.cpu() for k, v in out.forward_inputs.items()}, actions=out.actions.float(),
            logprobs=out.logprobs.float(), values=out.values.float(), versions=torch.zeros(B, dtype=torch.int64),
            rewards=torch.as_tensor(rng.normal(size=B), dtype=torch.float32), dones=torch.zeros(B, dtype=torch.bool),
            loss_mask=torch.ones(B, dtype=torch.bool), bootstrap_values=torch.zeros(B)))
    return Trajectory.stack(steps, torch.zeros(B), {})


@pytest.fixture
def actor(lora_config):
    threads = torch.get_num_threads()
    channels = GraphChannels(env_outputs=None, actions=None, trajectories=LocalChannel(name="trajectories"),
                             weights=LocalChannel(name="weights"))
    worker = ActorWorker(lora_config, resolve_topology(lora_config), rank=0, device_id=0, env_spec=SPEC,
                         channels=channels)
    worker.init_model("127.0.0.1", free_port())
    yield worker, channels
    worker.close()
    torch.set_num_threads(threads)


def train_on(worker, channels, cfg, seed):
    channels.trajectories.put(trajectory(cfg, seed), key=(0, 0, 0))
    return worker.train_step()


def split(state):
    lora = {k: v for k, v in state.items() if "lora_" in k}
    value = {k: v for k, v in state.items() if k.startswith("value_head.")}
    assert lora and value and len(lora) + len(value) == len(state)
    return lora, value


def test_critic_warmup_freezes_lora_then_trains_it(actor, lora_config):
    worker, channels = actor
    lora_0, value_0 = split(gather_trainable(worker.policy))
    metrics = train_on(worker, channels, lora_config, seed=1)  # 2 optimiser steps, both warm-up
    assert metrics["train/actor/optimizer_steps"] == 2 and worker.optimizer_steps == 2
    lora_1, value_1 = split(gather_trainable(worker.policy))
    for name in lora_0:
        assert torch.equal(lora_0[name], lora_1[name]), f"{name} moved during critic warm-up"
    assert any(not torch.equal(value_0[k], value_1[k]) for k in value_0)
    train_on(worker, channels, lora_config, seed=2)  # warm-up over: the adapters train
    lora_2, _ = split(gather_trainable(worker.policy))
    assert any(not torch.equal(lora_1[k], lora_2[k]) for k in lora_1)


def test_trainable_state_is_float32_and_compute_is_bfloat16(actor, lora_config):
    worker, channels = actor
    frozen = {p.dtype for p in worker.policy.parameters() if not p.requires_grad}
    trainable = {p.dtype for p in worker.policy.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trainable == {torch.float32}
    seen = []
    layer = worker.policy.vla.language_model.model.layers[0].self_attn.q_proj
    handle = layer.register_forward_hook(lambda module, args, out: seen.append((args[0].dtype, out.dtype)))
    train_on(worker, channels, lora_config, seed=1)
    handle.remove()
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}  # adapted layer computes in bf16
    states = list(worker.optimizer.state.values())
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)


def test_publish_sends_only_trainable_tensors(actor):
    worker, channels = actor
    worker.publish_weights()
    message = channels.weights.get(key=0, timeout=5)
    trainable = {name: p for name, p in worker.policy.named_parameters() if p.requires_grad}
    # and the action statistics (buffers): a dataset's range goes with the weights it trained
    statistics = {name for name, _ in worker.policy.named_buffers() if name.startswith("action_statistics.")}
    assert statistics and set(message.state_dict) == set(trainable) | statistics
    assert all(message.state_dict[name].dtype == torch.bfloat16 for name in trainable)  # the rollout's dtype
    sent = sum(t.numel() * t.element_size() for t in message.state_dict.values())
    stats_bytes = sum(message.state_dict[name].numel() * message.state_dict[name].element_size() for name in statistics)
    assert sent == sum(p.numel() for p in trainable.values()) * 2 + stats_bytes == worker.published_bytes
    total = sum(p.numel() * 2 for p in worker.policy.parameters())
    assert sent < total / 20  # adapters + value head, not the model


def test_checkpoint_holds_the_trainable_state_and_resumes_into_a_fresh_actor(actor, lora_config, tmp_path):
    import json

    from safetensors.torch import load_file

    worker, channels = actor
    train_on(worker, channels, lora_config, seed=1)  # mid warm-up: only the value head has Adam state
    folder = str(tmp_path / "checkpoint")
    worker.save_checkpoint(folder)
    saved = load_file(os.path.join(folder, "model.safetensors"))
    trainable = {name for name, p in worker.policy.named_parameters() if p.requires_grad}
    statistics = {name for name, _ in worker.policy.named_buffers() if name.startswith("action_statistics.")}
    assert set(saved) == trainable | statistics  # adapters, value head (fp32), action range; no frozen weight
    assert all(saved[name].dtype == torch.float32 for name in trainable)
    with open(os.path.join(folder, "model_info.json")) as f:
        info = json.load(f)
    assert info == {"family": "openvla", "base": lora_config.model.path, "contents": "trainable"}
    before = gather_trainable(worker.policy)
    moments = {id(p): state for p, state in worker.optimizer.state.items()}
    names = {id(p): name for name, p in worker.policy.named_parameters()}
    saved_moments = {names[key]: {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
                     for key, state in moments.items()}
    worker.close()

    fresh = ActorWorker(lora_config, resolve_topology(lora_config), rank=0, device_id=0, env_spec=SPEC,
                        channels=channels)
    fresh.init_model("127.0.0.1", free_port())
    try:
        assert fresh.load_checkpoint(folder) == 1 and fresh.optimizer_steps == 2
        after = gather_trainable(fresh.policy)
        assert all(torch.equal(before[k], after[k]) for k in before)
        value_group = next(g for g in fresh.optimizer.param_groups if g["name"] == "value")
        # Adam's state came back for the value head only (tensors compare by identity here)
        assert {id(p) for p in fresh.optimizer.state} == {id(p) for p in value_group["params"]}
        for name, param in fresh.policy.named_parameters():
            if param in fresh.optimizer.state:
                for key, value in fresh.optimizer.state[param].items():
                    value = value.full_tensor() if hasattr(value, "full_tensor") else value
                    assert torch.equal(value, saved_moments[name][key]), (name, key)
        train_on(fresh, channels, lora_config, seed=2)  # warm-up over: the adapters train on
        lora_after, _ = split(gather_trainable(fresh.policy))
        assert any(not torch.equal(before[k], lora_after[k]) for k in lora_after)
    finally:
        fresh.close()
