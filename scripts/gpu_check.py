"""The OpenVLA recipe's model path on one device, without Ray, ManiSkill or Hydra; prints one JSON object.

    python scripts/gpu_check.py                          # one GPU: 7B shape, random bf16 weights
    python scripts/gpu_check.py --device cpu --shape tiny   # the same path on a CPU (the test suite)

Settings come from the recipe's YAML files (read as plain YAML): LoRA targets and rank, value head,
rollout batch (sub-envs per rollout rank), actor micro-batch, optimiser. Phases, each with its time
and peak memory (CUDA allocator peak, reset between phases; on a CPU the process's peak RSS):

- build: random weights of the 7B shape straight on the device, LoRA, a rollout copy and an actor copy;
- rollout: batched KV-cached sampling on 480x640 frames of the synthetic env (decisions/s);
- actor: FSDP2 (world size 1, NCCL on a GPU), gradient checkpointing, one PPO optimiser step on
  one micro-batch (training samples/s), with the largest gap between the log-probs sampled by the
  rollout copy and re-evaluated by the actor at version 0;
- publish: trainable tensors gathered and loaded into the rollout copy (bytes, time);
- sft_openvla: one supervised step (action-token cross-entropy) of the same actor on one micro-batch;
- pi0: a Pi0 of the released shape (tiny on a CPU) with the Pi0 recipe's LoRA: chains sampled by
  a rollout copy, re-scored by an actor copy sharded the same way (the largest log-prob gap at
  version 0), one PPO step on them, then one supervised step (flow matching on 50-action chunks);
- maniskill (when ManiSkill's GPU simulation can be imported): 16 PushCube-v1 envs stepped and rendered.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import resource
import sys
import time

import numpy as np
import torch
import yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from embodied_async.algorithms.ppo import PPOBatch, UpdateSettings, ppo_update  # noqa: E402
from embodied_async.config.schema import ActorConfig, AlgorithmConfig, RolloutConfig, TrainConfig  # noqa: E402
from embodied_async.workers.sharding import (  # noqa: E402
    gather_trainable,
    make_optimizer,
    shard_policy,
    tensor_bytes,
    trainable_parameters,
)
from envs.synthetic.configuration_synthetic import SyntheticImageConfig  # noqa: E402
from envs.synthetic.synthetic_env import SyntheticImageEnv  # noqa: E402
from models.openvla.configuration_openvla import OpenVLAConfig  # noqa: E402
from models.openvla.modeling_openvla import OpenVLAModel  # noqa: E402
from models.openvla.policy_openvla import OpenVLAPolicy  # noqa: E402
from models.openvla.tiny import openvla_7b_config_dict, tiny_config  # noqa: E402
from models.pi0.chain import ChainSettings  # noqa: E402
from models.pi0.configuration_pi0 import pi0_base_architecture  # noqa: E402
from models.pi0.configuration_policy import GEMMA_SIGLIP_LINEARS  # noqa: E402
from models.pi0.modeling_pi0 import Pi0Model  # noqa: E402
from models.pi0.policy_pi0 import Pi0Policy, words_tokenizer  # noqa: E402
from models.pi0.processing_pi0 import Normalization  # noqa: E402
from models.pi0.tiny import tiny_architecture  # noqa: E402

RECIPE = os.path.join(REPO_ROOT, "configs", "maniskill_async_ppo_openvla.yaml")
MODEL = os.path.join(REPO_ROOT, "configs", "model", "openvla_rlvla.yaml")


def log(message: str) -> None:
    print(f"[gpu_check] {message}", file=sys.stderr, flush=True)


def recipe_settings() -> dict:
    with open(RECIPE) as f:
        recipe = yaml.safe_load(f)
    with open(MODEL) as f:
        model = yaml.safe_load(f)
    gpus = 4  # the recipe's placement: every component on GPUs 0-3
    return {"recipe": recipe, "model": model, "rollout_batch": 64 // gpus,  # env.num_envs over 4 rollout ranks
            "micro_batch": recipe["actor"]["micro_batch_size"]}


class Phases:
    """Time and peak memory per phase, peak reset between phases on a GPU."""

    def __init__(self, device: torch.device):
        self.device, self.report = device, {}

    def run(self, name: str, fn):
        log(f"{name} ...")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        result = fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux
        self.report[name] = {"seconds": round(time.perf_counter() - start, 6), "peak_memory_gb": round(peak, 3)}
        log(f"{name}: {self.report[name]['seconds']:.3f} s, peak {self.report[name]['peak_memory_gb']:.2f} GB")
        return result


def build_policies(args, settings, device, dtype):
    config = OpenVLAConfig.from_dict(openvla_7b_config_dict()) if args.shape == "7b" else tiny_config()
    lora = settings["model"]["lora"]
    rank = args.lora_rank if args.lora_rank is not None else lora["rank"]
    torch.manual_seed(0)
    with torch.device(device):  # random weights straight on the device: no 7B copy on the host
        vla = OpenVLAModel(config).to(dtype)
        rollout = OpenVLAPolicy(vla, unnorm_key="tiny", lora_rank=rank, lora_alpha=lora["alpha"],
                                lora_init=lora["init_weights"], lora_target_modules=lora["target_modules"],
                                value_head_hidden_sizes=settings["model"]["value_head_hidden_sizes"],
                                gradient_checkpointing=True, store_raw_images=True,
                                image_preprocessing="torch" if device.type == "cuda" else "pil")
    actor = copy.deepcopy(rollout)  # same frozen weights, adapters and value head: version 0 on both
    return rollout.eval(), actor


def rollout_phase(policy, env, steps: int):
    out, samples = env.reset(seed=0), []
    for _ in range(steps):
        result = policy.predict(out.obs, mode="train")
        samples.append(result)
        out = env.step(result.actions.float().cpu().numpy())
    return samples


def actor_batch(samples, micro: int, device) -> PPOBatch:
    cat = lambda key: torch.cat([s.forward_inputs[key] for s in samples])[:micro]  # noqa: E731
    inputs = {k: cat(k) for k in samples[0].forward_inputs}
    logprobs = torch.cat([s.logprobs.float() for s in samples])[:micro]
    n = len(logprobs)
    gen = torch.Generator().manual_seed(0)
    return PPOBatch(inputs, torch.cat([s.actions for s in samples])[:micro], behaviour_logprobs=logprobs.cpu(),
                    old_values=torch.cat([s.values.float() for s in samples])[:micro].cpu(),
                    advantages=torch.randn(n, generator=gen), returns=torch.randn(n, generator=gen),
                    versions=torch.zeros(n, dtype=torch.int64), loss_mask=torch.ones(n, dtype=torch.bool))


def settings_for_update(n: int, recipe: dict) -> UpdateSettings:
    """The recipe's update settings, for one epoch over ``n`` samples in one micro-batch, the
    policy trained from the first step (no critic warm-up)."""
    cfg = TrainConfig(algorithm=AlgorithmConfig(**recipe["algorithm"]), rollout=RolloutConfig(**recipe["rollout"]),
                      actor=ActorConfig(**recipe["actor"]))
    return dataclasses.replace(UpdateSettings.from_config(cfg, world_size=1), epochs=1, minibatch_size=n,
                               micro_batch_size=n, critic_warmup_left=0)


def supervised_step(policy, optimizer, obs, horizon: int, action_dim: int) -> dict:
    """One optimiser step on the policy's supervised loss for random expert actions in [-1, 1]."""
    batch = len(obs["task_descriptions"])
    actions = torch.rand(batch, horizon, action_dim, generator=torch.Generator().manual_seed(0)) * 2 - 1
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    losses, metrics = policy.supervised_loss(obs, actions, torch.zeros(batch, horizon, dtype=torch.bool))
    losses.mean().backward()
    optimizer.step()
    return {"loss": float(losses.detach().float().mean()), "micro_batch": batch}


def build_pi0(args, device, dtype):
    """A random-weight Pi0 (released shape on a GPU, tiny on a CPU) with the Pi0 recipe's LoRA."""
    arch = pi0_base_architecture(state_dim=8, action_dim=7) if args.shape == "7b" else \
        tiny_architecture(8, 7, ["base_0_rgb"], chunk_size=50)
    torch.manual_seed(0)
    with torch.device(device):
        model = Pi0Model(arch).to(dtype)
        return Pi0Policy(model, Normalization(), words_tokenizer(arch.vocab_size), ChainSettings("flow_sde", 4, 5, 7),
                         camera_keys=["main_images"], value_head_hidden_sizes=(512, 128), lora_rank=32,
                         lora_alpha=32, lora_targets=list(GEMMA_SIGLIP_LINEARS), gradient_checkpointing=True)


def pi0_phase(args, device, dtype, obs, micro: int, recipe: dict) -> dict:
    """A Pi0 rollout copy samples chains, its sharded actor copy re-scores them at version 0 (the
    largest log-prob gap), then takes one PPO step on them and one supervised step."""
    rollout = build_pi0(args, device, dtype).eval()
    actor = copy.deepcopy(rollout)
    precision = "bfloat16" if dtype == torch.bfloat16 else "float32"
    shard_policy(actor, "gpu" if device.type == "cuda" else "cpu", 1, precision)
    rows = {k: v[:micro] for k, v in obs.items()}
    rows["states"] = np.zeros((len(rows["task_descriptions"]), 8), dtype=np.float32)
    sampled = rollout.predict(rows, mode="train")
    with torch.no_grad():
        actor.eval()
        rescored = actor.evaluate(sampled.forward_inputs)[0].float().cpu()
    gap = float((rescored - sampled.logprobs.float().cpu()).abs().max())
    policy_params, value_params = trainable_parameters(actor, actor.value_parameter_prefixes)
    optimizer = make_optimizer(ActorConfig(optimizer="adamw", lr=2.5e-5, betas=[0.9, 0.95]), policy_params,
                               value_params)
    actor.train()
    batch = actor_batch([sampled], micro, device)
    metrics = ppo_update(actor, optimizer, batch, settings_for_update(len(batch), recipe), lambda t: t,
                         torch.Generator().manual_seed(0), device)
    return {"logprob_gap_version_0": gap, "ppo_optimizer_steps": metrics["train/actor/optimizer_steps"],
            **supervised_step(actor, optimizer, rows, actor.supervised_horizon, 7)}


def init_process_group(device) -> None:
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)


def maniskill_phase(num_envs: int = 16, steps: int = 50) -> dict:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401

    env = gym.make("PushCube-v1", num_envs=num_envs, obs_mode="rgb", sim_backend="gpu")
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        env.step(env.action_space.sample())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    env.close()
    return {"env_steps_per_s": round(num_envs * steps / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=("7b", "tiny"), default=None, help="default: 7b on cuda, tiny on cpu")
    parser.add_argument("--steps", type=int, default=4, help="rollout decisions timed per sub-env")
    parser.add_argument("--rollout-batch", type=int, default=None, help="default: the recipe's (16)")
    parser.add_argument("--micro-batch", type=int, default=None, help="default: the recipe's (40)")
    parser.add_argument("--lora-rank", type=int, default=None, help="default: the recipe's (32)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                        help="default: bfloat16 on cuda (FSDP2 mixed precision), float32 on cpu")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()
    args.shape = args.shape or ("7b" if args.device == "cuda" else "tiny")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    settings = recipe_settings()
    batch, micro = args.rollout_batch or settings["rollout_batch"], args.micro_batch or settings["micro_batch"]
    phases = Phases(device)
    rollout, actor = phases.run("build", lambda: build_policies(args, settings, device, dtype))
    env = SyntheticImageEnv(SyntheticImageConfig(image_size=[480, 640], num_envs=batch), num_envs=batch, seed=0)
    steps = max(args.steps, -(-micro // batch))  # enough decisions for one micro-batch
    samples = phases.run("rollout", lambda: rollout_phase(rollout, env, steps))
    init_process_group(device)
    precision = "bfloat16" if dtype == torch.bfloat16 else "float32"
    phases.run("shard", lambda: shard_policy(actor, "gpu" if device.type == "cuda" else "cpu", 1, precision))
    ppo_batch = actor_batch(samples, micro, device)
    with torch.no_grad():
        actor.eval()
        reevaluated = actor.evaluate({k: v.to(device) for k, v in ppo_batch.forward_inputs.items()})[0].float().cpu()
    gap = float((reevaluated - ppo_batch.behaviour_logprobs).abs().max())
    policy_params, value_params = trainable_parameters(actor, actor.value_parameter_prefixes)
    optimizer = make_optimizer(ActorConfig(**settings["recipe"]["actor"]), policy_params, value_params)
    actor.train()
    metrics = phases.run("actor", lambda: ppo_update(actor, optimizer, ppo_batch, settings_for_update(
        len(ppo_batch), settings["recipe"]), lambda t: t, torch.Generator().manual_seed(0), device))
    published = phases.run("publish", lambda: gather_trainable(actor, dtype=dtype))
    phases.run("load", lambda: rollout.load_state_dict(published, strict=False))
    obs = env.reset(seed=1).obs
    sft_openvla = phases.run("sft_openvla", lambda: supervised_step(actor, optimizer, obs, 1, actor.action_dim))
    pi0 = phases.run("pi0", lambda: pi0_phase(args, device, dtype, obs, micro, settings["recipe"]))
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "shape": args.shape, "dtype": precision, "rollout_batch": batch,
        "micro_batch": len(ppo_batch), "image_size": [480, 640],
        "parameters": sum(p.numel() for p in rollout.parameters()),
        "trainable_parameters": sum(p.numel() for p in rollout.parameters() if p.requires_grad),
        "phases": phases.report,
        "rollout_decisions_per_s": round(batch * steps / phases.report["rollout"]["seconds"], 2),
        "train_samples_per_s": round(len(ppo_batch) / phases.report["actor"]["seconds"], 2),
        "published_bytes": tensor_bytes(published),
        "logprob_gap_version_0": gap, "optimizer_steps": metrics["train/actor/optimizer_steps"],
        "sft_openvla": sft_openvla, "pi0": pi0,
    }
    report["maniskill_gpu"] = _maniskill(device, phases)
    text = json.dumps(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)


def _maniskill(device, phases: Phases):
    if device.type != "cuda":
        return "skipped: no GPU"
    try:
        import mani_skill  # noqa: F401
    except ImportError:
        return "skipped: mani_skill is not installed"
    try:
        result = phases.run("maniskill", maniskill_phase)
    except Exception as err:  # e.g. no Vulkan driver: report it, the model figures stand
        return f"failed: {type(err).__name__}: {err}"
    return {**result, **phases.report["maniskill"]}


if __name__ == "__main__":
    main()
