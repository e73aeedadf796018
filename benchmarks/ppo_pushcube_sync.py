"""Compact synchronous PPO on ManiSkill PushCube-v1 (state, CPU simulation) in one file: the
baseline our default recipe is measured against. No Ray, no framework: the learner
runs in this process, the sub-envs in ``--num-procs`` worker processes joined by pipes. The one
thing taken from the framework is the evaluation protocol's episode seeds
(``embodied_async.evaluation.evaluation_seed``), so both face the same episodes.

Settings (the default recipe's, configs/maniskill_async_ppo_mlp.yaml): 16 envs in 2 processes,
50-step rollouts, 8 epochs x 8 minibatches, running observation normalisation, gamma 0.8, lambda
0.9, target KL 0.1, 3x256 Tanh networks, the value bootstrapped at success termination and at the
time limit.

    .venv/bin/python benchmarks/ppo_pushcube_sync.py --seed 0 --target-success 0.9
    .venv/bin/python benchmarks/ppo_pushcube_sync.py --env-steps 24000 --eval-every 0   # throughput only

Prints one line per update and, at the end, one JSON line (``--json`` also writes it to a file):
env steps and training seconds (evaluation excluded) when the evaluation first reached
``--target-success``, and the training throughput.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import time

import numpy as np
import torch
from torch import nn

from embodied_async.evaluation import evaluation_seed

# enhanced_determinism: every auto-reset episode follows from the sub-env's seed (as in our env)
TASK = dict(id="PushCube-v1", obs_mode="state", control_mode="pd_joint_delta_pos", reward_mode="normalized_dense",
            sim_backend="cpu", max_episode_steps=50, enhanced_determinism=True)

# ---- env processes ---------------------------------------------------------------------------
def env_process(pipe, num_envs: int, first_index: int) -> None:
    """Own sub-envs ``first_index ..`` (``num_envs``); answer ("reset", seed) (sub-env ``i`` gets
    ``seed + i``) and ("step", actions [n, A]) with numpy."""
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)

    kwargs = {k: v for k, v in TASK.items() if k != "id"}
    envs = [gym.make(TASK["id"], **kwargs) for _ in range(num_envs)]
    flat = lambda x: np.asarray(x, dtype=np.float32).reshape(-1)  # noqa: E731
    try:
        while True:
            command = pipe.recv()
            if command[0] == "reset":
                pipe.send(np.stack([flat(env.reset(seed=command[1] + first_index + i)[0])
                                    for i, env in enumerate(envs)]))
            elif command[0] == "cpu":
                pipe.send(time.thread_time())
            elif command[0] == "step":
                obs, rewards, terminated, truncated, successes = [], [], [], [], []
                finals = {}
                for i, (env, action) in enumerate(zip(envs, command[1])):
                    o, r, term, trunc, info = env.step(action)
                    term, trunc = bool(term), bool(trunc)
                    if term or trunc:
                        finals[i] = flat(o)
                        successes.append(bool(info.get("success", False)))
                        o, _ = env.reset()
                    else:
                        successes.append(False)
                    obs.append(flat(o))
                    rewards.append(float(r))
                    terminated.append(term)
                    truncated.append(trunc)
                obs = np.stack(obs)
                final_obs = obs.copy()
                for i, o in finals.items():
                    final_obs[i] = o
                pipe.send((obs, np.array(rewards, np.float32), np.array(terminated), np.array(truncated),
                           np.array(successes), final_obs))
            else:
                break
    finally:
        for env in envs:
            env.close()


class VectorEnv:
    """``num_envs`` sub-envs split over ``num_procs`` processes, stepped in parallel."""

    def __init__(self, num_envs: int, num_procs: int):
        context = mp.get_context("spawn")
        self.num_envs, self.per_proc = num_envs, num_envs // num_procs
        self.pipes, self.procs = [], []
        for p in range(num_procs):
            parent, child = context.Pipe()
            proc = context.Process(target=env_process, args=(child, self.per_proc, p * self.per_proc), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)

    def reset(self, seed: int) -> np.ndarray:
        for pipe in self.pipes:
            pipe.send(("reset", seed))
        return np.concatenate([pipe.recv() for pipe in self.pipes])

    def step(self, actions: np.ndarray):
        for p, pipe in enumerate(self.pipes):
            pipe.send(("step", actions[p * self.per_proc:(p + 1) * self.per_proc]))
        parts = [pipe.recv() for pipe in self.pipes]
        return tuple(np.concatenate(column) for column in zip(*parts))

    def cpu_seconds(self) -> float:
        """CPU seconds the env processes' loops have used so far, summed."""
        for pipe in self.pipes:
            pipe.send(("cpu",))
        return sum(pipe.recv() for pipe in self.pipes)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(("close",))
        for proc in self.procs:
            proc.join(timeout=10)


# ---- the agent ---------------------------------------------------------------------------------
class RunningMeanStd:
    def __init__(self, dim: int):
        self.mean, self.var, self.count = np.zeros(dim), np.ones(dim), 1e-4

    def update(self, x: np.ndarray) -> None:
        mean, var, count = x.mean(0), x.var(0), x.shape[0]
        delta, total = mean - self.mean, self.count + count
        self.mean = self.mean + delta * count / total
        self.var = (self.var * self.count + var * count + delta ** 2 * self.count * count / total) / total
        self.count = total

    def __call__(self, x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10, 10), dtype=torch.float32)


def mlp(n_in: int, n_out: int, out_std: float) -> nn.Sequential:
    layers, width = [], n_in
    for _ in range(3):
        layers += [nn.Linear(width, 256), nn.Tanh()]
        width = 256
    layers.append(nn.Linear(width, n_out))
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, 2 ** 0.5 if layer is not layers[-1] else out_std)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Agent(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.actor = mlp(obs_dim, action_dim, 0.01 * 2 ** 0.5)
        self.critic = mlp(obs_dim, 1, 1.0)
        self.log_std = nn.Parameter(torch.full((action_dim,), -0.5))

    def value(self, x):
        return self.critic(x).squeeze(-1)

    def distribution(self, x):
        return torch.distributions.Normal(self.actor(x), self.log_std.exp())


# ---- training ----------------------------------------------------------------------------------
def evaluate(agent: Agent, norm: RunningMeanStd, envs: VectorEnv, episodes: int, seed: int,
             stop_below: float = None) -> tuple:
    """Success rate of the deterministic policy over ``episodes`` episodes, the same number from
    every sub-env (the first ``episodes`` to finish would favour short, successful ones), the
    sub-envs reset with ``seed``; and the number of episodes scored. ``stop_below``: stop once the
    rounds every sub-env has completed hold more failures than that rate over ``episodes`` allows,
    scoring those rounds (as the graph's ``runner.eval_stop_once_below_target``)."""
    per_env = -(-episodes // envs.num_envs)
    allowed = episodes - math.ceil(stop_below * episodes - 1e-9) if stop_below is not None else None
    obs, successes = envs.reset(seed), [[] for _ in range(envs.num_envs)]
    while min(len(s) for s in successes) < per_env:
        with torch.no_grad():
            actions = agent.actor(norm(obs)).clamp(-1, 1).numpy()
        obs, _, terminated, truncated, success, _ = envs.step(actions)
        for i in np.flatnonzero(terminated | truncated):
            if len(successes[i]) < per_env:
                successes[i].append(bool(success[i]))
        rounds = min(len(s) for s in successes)
        if allowed is not None and rounds < per_env and sum(not s for env in successes for s in env[:rounds]) > allowed:
            successes = [env[:rounds] for env in successes]
            break
    scored = [s for env in successes for s in env]
    return float(np.mean(scored)), len(scored)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--num-steps", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--gamma", type=float, default=0.8)
    parser.add_argument("--gae-lambda", type=float, default=0.9)
    parser.add_argument("--target-kl", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--env-steps", type=int, default=200_000, help="stop after this many env steps")
    parser.add_argument("--target-success", type=float, default=None, help="stop once an evaluation reaches this")
    parser.add_argument("--eval-every", type=int, default=10, help="evaluate every N updates (0: never)")
    parser.add_argument("--eval-episodes", type=int, default=128)
    parser.add_argument("--eval-stop-once-below-target", action="store_true",
                        help="end an evaluation once its failures rule --target-success out")
    parser.add_argument("--json", default=None)
    return parser.parse_args()


def collect(agent: Agent, norm: RunningMeanStd, envs: VectorEnv, obs: np.ndarray, T: int, N: int) -> tuple:
    """One rollout of ``T`` steps of the ``N`` sub-envs: its tensors and the last observation."""
    obs_dim, action_dim = obs.shape[1], 8
    raw_obs = np.zeros((T, N, obs_dim), np.float32)
    actions = torch.zeros(T, N, action_dim)
    logprobs, rewards, values = torch.zeros(T, N), torch.zeros(T, N), torch.zeros(T, N)
    dones, bootstrap = torch.zeros(T, N), torch.zeros(T, N)
    for t in range(T):
        raw_obs[t] = obs
        with torch.no_grad():
            x = norm(obs)
            dist = agent.distribution(x)
            action = dist.sample()
            logprobs[t], values[t], actions[t] = dist.log_prob(action).sum(-1), agent.value(x), action
        obs, reward, terminated, truncated, _, final_obs = envs.step(action.clamp(-1, 1).numpy())
        finished = terminated | truncated
        rewards[t], dones[t] = torch.as_tensor(reward), torch.as_tensor(finished, dtype=torch.float32)
        if finished.any():  # success terminations and time limits alike: bootstrap from the last obs
            with torch.no_grad():
                bootstrap[t] = torch.as_tensor(finished, dtype=torch.float32) * agent.value(norm(final_obs))
    rollout = dict(raw_obs=raw_obs, actions=actions, logprobs=logprobs, rewards=rewards, values=values, dones=dones,
                   bootstrap=bootstrap)
    return rollout, obs


def advantages_of(rollout: dict, next_value: torch.Tensor, gamma: float, gae_lambda: float) -> torch.Tensor:
    rewards, values, dones, bootstrap = (rollout[k] for k in ("rewards", "values", "dones", "bootstrap"))
    T, N = rewards.shape
    advantages, last = torch.zeros(T, N), torch.zeros(N)
    for t in reversed(range(T)):
        following = next_value if t == T - 1 else values[t + 1]
        # an ended episode's return continues from its own last observation, not the next one's
        target = rewards[t] + gamma * ((1 - dones[t]) * following + bootstrap[t])
        last = target - values[t] + gamma * gae_lambda * (1 - dones[t]) * last
        advantages[t] = last
    return advantages


def update(agent: Agent, optimizer, norm: RunningMeanStd, rollout: dict, advantages: torch.Tensor, args) -> None:
    """PPO epochs over minibatches, stopped once the epoch's mean KL exceeds ``--target-kl``."""
    T, N, obs_dim = rollout["raw_obs"].shape
    batch, minibatch = T * N, T * N // args.minibatches
    returns = advantages + rollout["values"]
    norm.update(rollout["raw_obs"].reshape(batch, obs_dim))  # after the rollout, as our actor does
    b_x = norm(rollout["raw_obs"].reshape(batch, obs_dim))
    b_actions, b_logprobs = rollout["actions"].reshape(batch, -1), rollout["logprobs"].reshape(batch)
    b_advantages, b_returns = advantages.reshape(batch), returns.reshape(batch)
    for epoch in range(args.epochs):
        order, kls = torch.randperm(batch), []
        for begin in range(0, batch, minibatch):
            idx = order[begin:begin + minibatch]
            dist = agent.distribution(b_x[idx])
            new_logprob = dist.log_prob(b_actions[idx]).sum(-1)
            log_ratio = new_logprob - b_logprobs[idx]
            ratio = log_ratio.exp()
            with torch.no_grad():
                kls.append(((ratio - 1) - log_ratio).mean().item())
            adv = b_advantages[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
            value_loss = 0.5 * (agent.value(b_x[idx]) - b_returns[idx]).pow(2).mean()
            optimizer.zero_grad()
            (policy_loss + 0.5 * value_loss).backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()
        if args.target_kl is not None and np.mean(kls) > args.target_kl:
            break


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(1)
    envs = VectorEnv(args.num_envs, args.num_procs)
    eval_envs = VectorEnv(8, args.num_procs) if args.eval_every else None
    obs = envs.reset(1000 * args.seed)
    agent = Agent(obs.shape[1], 8)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
    norm = RunningMeanStd(obs.shape[1])
    env_steps, train_s, collect_s, updates, reached, history = 0, 0.0, 0.0, 0, None, []
    sim_cpu_start = envs.cpu_seconds()
    while env_steps < args.env_steps:
        start = time.perf_counter()
        rollout, obs = collect(agent, norm, envs, obs, args.num_steps, args.num_envs)
        env_steps += args.num_steps * args.num_envs
        collect_s += time.perf_counter() - start
        with torch.no_grad():
            next_value = agent.value(norm(obs))
        update(agent, optimizer, norm, rollout, advantages_of(rollout, next_value, args.gamma, args.gae_lambda), args)
        train_s += time.perf_counter() - start
        updates += 1
        record = {"update": updates, "env_steps": env_steps, "train_s": round(train_s, 2),
                  "env_steps_per_s": round(env_steps / train_s, 1),
                  "mean_reward": round(float(rollout["rewards"].mean()), 6)}
        if eval_envs is not None and updates % args.eval_every == 0:
            record["eval_success"], record["eval_episodes"] = evaluate(
                agent, norm, eval_envs, args.eval_episodes, evaluation_seed(args.seed, updates),
                args.target_success if args.eval_stop_once_below_target else None)
            if reached is None and args.target_success is not None and record["eval_success"] >= args.target_success:
                reached = {"env_steps": env_steps, "train_s": round(train_s, 2), "update": updates}
        history.append(record)
        print(json.dumps(record), flush=True)
        if reached is not None:
            break
    sim_cpu = envs.cpu_seconds() - sim_cpu_start  # evaluation runs in its own processes
    for each in (envs, eval_envs):
        if each is not None:
            each.close()
    write_summary(args, history, reached, env_steps, train_s, collect_s, sim_cpu)


def write_summary(args, history, reached, env_steps: int, train_s: float, collect_s: float, sim_cpu: float) -> None:
    summary = {"baseline": "ppo_pushcube_sync", "seed": args.seed, "env_steps": env_steps, "train_s": round(train_s, 2),
               "env_steps_per_s": round(env_steps / train_s, 1), "collect_s": round(collect_s, 2),
               "learn_s": round(train_s - collect_s, 2),
               "sim_cpu_ms_per_env_step": round(1000 * sim_cpu / env_steps, 3),
               "target_success": args.target_success, "reached": reached,
               "curve": [r for r in history if "eval_success" in r],
               "last_eval": next((r["eval_success"] for r in reversed(history) if "eval_success" in r), None)}
    print(json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
