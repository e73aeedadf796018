"""Where a Pi0 chain's randomness lies, and what PPO can learn from it: a one-observation bandit.

A ``flow_sde`` chain's log-prob covers its one stochastic denoising step, not the start it was
integrated from. This script takes a Pi0 checkpoint of ours (e.g. the miniature's SFT checkpoint),
repeats one observation of its env ``--batch`` times, and rewards each sampled chunk by its
squared distance to a target: the mean sampled action shifted by ``--delta`` along the first
action dimension. Every iteration draws ``--batch`` chains, takes group-relative advantages
(reward minus the batch's mean) and one decoupled-PPO update (2 epochs, clip 0.2 / 0.28, Adam at
``--lr``), for each ``--method`` (``model.noise_method``) and ``--initial-noise-scale`` (the std of
the chains' start, ``model.initial_noise_scale``; ``action_gaussian`` always starts from zero). It
prints the spread of the sampled actions and, per iteration, the mean squared distance of the
samples and of the deterministic rule (the ODE) to the target, the update's reported KL
(``train/actor/proximal_approx_kl``) and how far the deterministic action moved in it; then one
JSON line with, per run, the summed reported KL against the summed movement of the deterministic
action: a log-prob that covers the policy reports KL where the action moves.

    .venv/bin/python benchmarks/pi0_flow_credit.py logs/mini_pi0/sft/checkpoints/global_step_1500
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch


def load(checkpoint: str, method: str, scale: float, seed: int):
    """(policy with the checkpoint's weights, one observation repeated later, env spec); heads only
    RL has (flow_noise's noise head, action_gaussian's std) start fresh."""
    from embodied_async.config.recipes import checkpoint_config
    from embodied_async.config.validate import to_train_config
    from embodied_async.registry import build_env, build_policy
    from embodied_async.run_folder import load_policy_weights

    raw = checkpoint_config(checkpoint, [f"model.noise_method={method}", f"model.initial_noise_scale={scale}"])
    raw.cluster.device_type = "cpu"
    cfg = to_train_config(raw)
    if cfg.model.name != "pi0":
        raise SystemExit(f"{checkpoint} holds a {cfg.model.name} policy: give a Pi0 checkpoint")
    env = build_env(cfg.env, 1, seed)
    try:
        obs = env.reset(seed=seed).obs
        policy = build_policy(cfg.model, env.spec)
    finally:
        env.close()
    load_policy_weights(policy, checkpoint, "credit")
    return policy, obs


def repeat(obs, batch: int):
    if isinstance(obs, dict):
        return {key: repeat(value, batch) for key, value in obs.items()}
    if isinstance(obs, list):
        return obs * batch
    if isinstance(obs, np.ndarray):
        return np.repeat(obs, batch, axis=0)
    return obs.repeat_interleave(batch, 0) if torch.is_tensor(obs) else obs


def run(args, method: str, scale: float) -> dict:
    from embodied_async.algorithms.ppo import PPOBatch, UpdateSettings, ppo_update

    torch.manual_seed(args.seed)
    policy, obs = load(args.checkpoint, method, scale, args.seed)
    obs = repeat(obs, args.batch)
    policy.eval()
    with torch.no_grad():
        draws = torch.stack([policy.predict(obs, "train").actions.float() for _ in range(4)])
    spread = float(draws[..., 0].std())
    target = draws.mean(dim=(0, 1))
    target[..., 0] += args.delta
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=args.lr)
    settings = UpdateSettings(
        epochs=2, minibatch_size=args.batch, micro_batch_size=16, world_size=1, version=0, recompute_logprobs=True,
        critic_warmup_left=0, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, behave_weight_threshold=2.0,
        value_clip=None, huber_delta=10.0, value_loss_coef=0.5, entropy_coef=0.0, normalize_advantages=False,
        target_kl=None, max_grad_norm=1.0, recompute_fresh_logprobs=False, train_critic=False, policy_lr=args.lr,
        policy_lr_warmup_steps=0, policy_steps_before=0, policy_lr_factor=1.0, demo_loss_coef=0.0, frozen_prefixes=())
    curve = []
    print(f"[credit] {method}, initial_noise_scale={scale}: the samples' spread along the first action dimension "
          f"{spread:.3f}", flush=True)
    previous = None
    for iteration in range(args.iters):
        policy.eval()
        with torch.no_grad():
            torch.manual_seed(args.seed + 7)  # the same start for the deterministic rule each time
            deterministic = policy.predict(obs, "eval").actions.float()
            drawn = policy.predict(obs, "train")
        if previous is not None:  # how far the last update moved the deterministic action
            curve[-1]["rule_moved"] = float((deterministic - previous).norm(dim=(1, 2)).mean())
        previous = deterministic
        actions = drawn.actions.float()
        distance = ((actions - target) ** 2).sum(dim=(1, 2))
        rule_distance = float(((deterministic - target) ** 2).sum(dim=(1, 2)).mean())
        curve.append({"iteration": iteration, "sampled": float(distance.mean()), "deterministic": rule_distance})
        print(f"  {iteration:3d}  sampled {float(distance.mean()):.4f}  deterministic {rule_distance:.4f}", flush=True)
        n = args.batch
        batch = PPOBatch({k: v.detach() for k, v in drawn.forward_inputs.items()}, actions,
                         drawn.logprobs.detach().float(), torch.zeros(n), -(distance - distance.mean()), torch.zeros(n),
                         torch.full((n,), iteration, dtype=torch.long), torch.ones(n, dtype=torch.bool))
        settings.version = iteration
        policy.train()
        metrics = ppo_update(policy, optimizer, batch, settings, lambda t: t, torch.Generator().manual_seed(iteration))
        curve[-1]["reported_kl"] = metrics.get("train/actor/proximal_approx_kl", float("nan"))
    last, updates = curve[-5:], [c for c in curve if "rule_moved" in c]
    return {"method": method, "initial_noise_scale": scale, "spread": spread, "first": curve[0],
            "last5_sampled": sum(c["sampled"] for c in last) / len(last),
            "last5_deterministic": sum(c["deterministic"] for c in last) / len(last),
            "summed_reported_kl": sum(c["reported_kl"] for c in updates),
            "summed_rule_moved": sum(c["rule_moved"] for c in updates), "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a Pi0 checkpoint folder of ours (global_step_<N>)")
    parser.add_argument("--method", nargs="+", default=["flow_sde", "flow_noise", "action_gaussian"],
                        choices=["flow_sde", "flow_noise", "action_gaussian"])
    parser.add_argument("--initial-noise-scale", type=float, nargs="+", default=[1.0, 0.0])
    parser.add_argument("--iters", type=int, default=25)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--delta", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the JSON here")
    args = parser.parse_args()
    from embodied_async.run_folder import not_a_checkpoint

    problem = not_a_checkpoint(args.checkpoint, "checkpoint")
    if problem:
        raise SystemExit(problem)
    results = {"checkpoint": args.checkpoint, "batch": args.batch, "lr": args.lr, "delta": args.delta,
               "runs": [run(args, method, scale) for method in args.method
                        for scale in ([0.0] if method == "action_gaussian" else args.initial_noise_scale)]}
    line = json.dumps(results)
    print(json.dumps({**results, "runs": [{k: v for k, v in r.items() if k != "curve"} for r in results["runs"]]}))
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
