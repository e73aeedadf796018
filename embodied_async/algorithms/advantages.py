"""Advantage estimation and normalisation (pure torch)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

AllReduce = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_values: torch.Tensor,
    bootstrap_values: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation over a [T, B] rollout.

    Args:
        rewards: [T, B] reward of the action taken at step t.
        values: [T, B] V(s_t) under the critic that scored the rollout.
        dones: [T, B] bool; True when the episode ended after the action at t.
            The sub-env was auto-reset, so values[t + 1] belongs to a new
            episode and must not be bootstrapped from.
        next_values: [B] value of the observation after the last step.
        bootstrap_values: [T, B] V(final observation) where the episode ended
            at t but should still be bootstrapped (truncation or a
            non-terminal termination); 0 elsewhere.
        gamma: discount factor.
        gae_lambda: GAE lambda.

    Returns:
        (advantages, returns), both float32 [T, B]; returns = advantages + values.
    """
    rewards = rewards.float()
    values = values.float()
    bootstrap_values = bootstrap_values.float()
    not_done = 1.0 - dones.float()
    num_steps = rewards.shape[0]

    advantages = torch.zeros_like(rewards)
    last_adv = torch.zeros_like(rewards[0])
    for t in reversed(range(num_steps)):
        v_next = next_values.float() if t == num_steps - 1 else values[t + 1]
        # On a done, V_{t+1} is a new episode's value: zero it and use the
        # caller-provided bootstrap (0 for a true terminal) instead.
        target = rewards[t] + gamma * (v_next * not_done[t] + bootstrap_values[t])
        delta = target - values[t]
        # The advantage recursion is cut at episode boundaries.
        last_adv = delta + gamma * gae_lambda * not_done[t] * last_adv
        advantages[t] = last_adv
    return advantages, advantages + values


def _masked_moments(
    x: torch.Tensor, mask: torch.Tensor, all_reduce: Optional[AllReduce]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population std of x[mask], optionally across ranks."""
    x = x.float()
    m = mask.float()
    # One packed reduce instead of three: sum, sum of squares, count.
    stats = torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()])
    if all_reduce is not None:
        stats = all_reduce(stats)
    total, total_sq, count = stats.unbind()
    count = count.clamp(min=1.0)
    mean = total / count
    # E[x^2] - E[x]^2 can dip below 0 from rounding; clamp before sqrt.
    var = (total_sq / count - mean * mean).clamp(min=0.0)
    return mean, var.sqrt()


@torch.no_grad()
def normalize_advantages(
    advantages: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    eps: float = 1e-8,
    all_reduce: Optional[AllReduce] = None,
) -> torch.Tensor:
    """Normalise advantages to zero mean / unit (population) std.

    Args:
        advantages: tensor of any shape.
        mask: optional bool tensor of the same shape; statistics use only the
            True entries and masked-out entries are returned as 0.
        eps: added to the std to avoid division by zero.
        all_reduce: optional callable summing a 1-D tensor across data-parallel
            ranks, so every rank normalises with the global statistics.
    """
    if mask is None:
        mask = torch.ones_like(advantages, dtype=torch.bool)
    mask = mask.bool()
    mean, std = _masked_moments(advantages, mask, all_reduce)
    normalized = (advantages.float() - mean) / (std + eps)
    return torch.where(mask, normalized, torch.zeros_like(normalized))


@torch.no_grad()
def explained_variance(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
) -> float:
    """1 - Var(returns - values) / Var(returns); nan when Var(returns) == 0.

    1 means a perfect critic, 0 one no better than a constant, < 0 worse.
    """
    values = values.float()
    returns = returns.float()
    if mask is not None:
        values = values[mask.bool()]
        returns = returns[mask.bool()]
    if returns.numel() == 0:
        return float("nan")
    var_returns = returns.var(unbiased=False)
    if var_returns.item() == 0.0:
        return float("nan")
    return float(1.0 - (returns - values).var(unbiased=False) / var_returns)


class EpisodeCutError(ValueError):
    """A group-relative batch holds an episode that did not end within its trajectory."""


@torch.no_grad()
def group_relative_advantages(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    group_size: int,
    *,
    normalize_std: bool,
    episode_weight: str = "step",
    valid: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Value-free advantages (GRPO / RLOO style) over a ``[T, B]`` rollout whose sub-envs began
    their episodes together at ``t = 0``, sub-envs ``g * group_size .. (g + 1) * group_size - 1``
    from one initial state.

    Each sub-env's episode is its steps up to and including its first done. Its return R is the
    sum of those rewards; its advantage, at every step of the episode, is ``R - mean(group)``
    (divided by the group's population std with ``normalize_std``). A group whose returns are
    all equal (within ``eps``: under a success reward, all succeeded or all failed) says nothing
    about which actions were better and is dropped from the loss. Steps after the first done
    (the auto-reset episode that follows) are never trained on. ``group_size``, ``normalize_std``
    and ``episode_weight`` are ``algorithm.group_size``, ``algorithm.group_normalize_std`` and
    ``algorithm.group_episode_weight``, passed as they are (their defaults live in the schema).

    ``episode_weight``: "step" trains every step alike, so an episode weighs in proportion to its
    length (failures that run to the time limit outweigh quick successes); "episode" scales each
    episode's advantages by the mean length of the trained episodes over its own, so every episode
    weighs alike (RLinf's per-episode mean) at the same overall scale. The loss is linear in the
    advantage per sample (its clip bounds too), so this is the per-episode mean of the loss.

    ``valid`` [T, B]: the steps whose samples are whole (``env.on_nonfinite=drop`` ends an episode
    at a dropped sample); a group with an episode holding an invalid step has an unknown return in
    it and is dropped whole.

    Returns:
        (advantages float32 [T, B], mask bool [T, B]: the steps that enter the loss, metrics).

    Raises:
        EpisodeCutError: when a sub-env has no done in the trajectory (its return is unknown).
    """
    dones = dones.bool()
    num_steps, num_envs = dones.shape
    if group_size < 2 or num_envs % group_size:
        raise ValueError(f"{num_envs} sub-envs do not split into groups of {group_size} (group_size must be >= 2 "
                         "and divide the sub-envs)")
    ended = dones.any(0)
    if not bool(ended.all()):
        cut = torch.nonzero(~ended).flatten().tolist()
        raise EpisodeCutError(f"the episodes of sub-envs {cut[:8]} did not end within the {num_steps} decisions "
                              "of their trajectory, so their returns are unknown: group-relative advantages need "
                              "rollout.num_steps x env.num_action_chunks to cover the env's episode length")
    steps = torch.arange(num_steps)[:, None]
    first_done = torch.argmax(dones.int(), dim=0)  # the first True per column
    in_episode = steps <= first_done[None, :]
    returns = (rewards.float() * in_episode).sum(0)
    grouped = returns.view(-1, group_size)
    mean = grouped.mean(1, keepdim=True)
    std = grouped.std(1, unbiased=False, keepdim=True)
    relative = grouped - mean
    if normalize_std:
        relative = relative / (std + eps)
    kept = (grouped.max(1).values - grouped.min(1).values) > eps
    whole = torch.ones_like(kept)
    if valid is not None:  # an episode ended by a dropped sample has no known return
        whole = ~((~valid.bool()) & in_episode).any(0).view(-1, group_size).any(1)
        kept = kept & whole
    advantages = relative.reshape(-1)[None, :] * in_episode
    mask = in_episode & kept.repeat_interleave(group_size)[None, :]
    if episode_weight == "episode":
        lengths = in_episode.sum(0).float()
        trained = mask.any(0)
        mean_length = lengths[trained].mean() if bool(trained.any()) else lengths.new_tensor(1.0)
        advantages = advantages * (mean_length / lengths.clamp_min(1))[None, :]
    elif episode_weight != "step":
        raise ValueError(f"episode_weight={episode_weight!r}; use 'step' or 'episode'")
    num_groups = grouped.shape[0]
    metrics = {"train/grpo/groups": float(num_groups), "train/grpo/groups_dropped": float(num_groups - int(kept.sum())),
               "train/grpo/groups_incomplete": float(num_groups - int(whole.sum())),
               "train/grpo/episode_return": float(returns.mean()),
               "train/grpo/trained_step_fraction": float(mask.float().mean())}
    return advantages.float(), mask, metrics
