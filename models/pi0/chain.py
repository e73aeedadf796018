"""Denoising chains for RL: sample one (the rollout) and re-score it (the actor).

The rollout keeps the whole chain ``x_{t_0} .. x_{t_N}`` it drew (and, for ``flow_sde``, which step
was stochastic); the actor recomputes the velocities along that same chain under its current
weights, so the ratio of new to old log-probs is that of the same sample. Log-probs cover the
executed part of the chunk (its first ``executed_actions`` actions) and the real action
dimensions only: the rest of the chunk and the padding dimensions never reach the env. They are
summed over those entries (one per decision), or kept per entry (``per_dimension``:
``algorithm.logprob_type=token_level``), flattened to ``executed_actions x action_dim``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from .flow_sampling import bounded_std, euler_mean, gaussian_log_prob, sde_transition


@dataclass(frozen=True)
class ChainSettings:
    method: str  # one of configuration_policy.NOISE_METHODS
    steps: int  # denoising steps
    executed_actions: int  # actions of the chunk the env executes
    action_dim: int  # real action dimensions (the rest is padding)
    noise_level: float = 0.5  # flow_sde
    noise_std_bounds: Tuple[float, float] = (0.08, 0.16)  # flow_noise
    # std of the chain's start x_{t_0} (model.initial_noise_scale): 1 draws it from the flow's N(0, I)
    initial_noise_scale: float = 1.0

    @property
    def step_size(self) -> float:
        return 1.0 / self.steps

    def times(self, device=None) -> torch.Tensor:
        """t_k = 1 - k / steps as float32 (LeRobot's ``1 + k * dt`` in double, then cast)."""
        return torch.tensor([1.0 + k * (-1.0 / self.steps) for k in range(self.steps + 1)], dtype=torch.float32,
                            device=device)


def executed_sum(values: torch.Tensor, settings: ChainSettings) -> torch.Tensor:
    """Sum of [B, chunk, dims] over the executed actions and real dimensions -> [B]."""
    return values[:, :settings.executed_actions, :settings.action_dim].sum(dim=(1, 2))


def executed_log_prob(values: torch.Tensor, settings: ChainSettings, per_dimension: bool) -> torch.Tensor:
    """Log-densities [B, chunk, dims] -> [B] summed over the executed entries, or (per_dimension)
    [B, executed_actions x action_dim]."""
    if per_dimension:
        return values[:, :settings.executed_actions, :settings.action_dim].flatten(1).float()
    return executed_sum(values, settings).float()


def _zero_log_prob(batch: int, settings: ChainSettings, per_dimension: bool, device) -> torch.Tensor:
    """The log-prob accumulator: [B], or [B, executed_actions x action_dim] per_dimension."""
    shape = (batch, settings.executed_actions * settings.action_dim) if per_dimension else (batch,)
    return torch.zeros(shape, dtype=torch.float32, device=device)


def _transition(model, prefix, state, x, time: torch.Tensor, settings: ChainSettings,
                noise_head: Optional[Callable]):
    """(Euler mean, stochastic mean, std) of the step from ``x`` at per-sample ``time`` [B], in
    float32 whatever the model computes in: the chain is kept in float32, and a log-density of
    35 terms summed in bfloat16 would not survive the trip from rollout to actor."""
    velocity, expert_out = model.run_suffix(*prefix, state, x, time)
    x, velocity = x.float(), velocity.float()
    euler = euler_mean(x, velocity, settings.step_size)
    if settings.method == "flow_sde":
        mean, std = sde_transition(x, velocity, time, settings.step_size, settings.noise_level)
        return euler, mean, std.expand_as(mean)
    if settings.method == "flow_noise":
        return euler, euler, bounded_std(noise_head(expert_out).float(), *settings.noise_std_bounds)
    return euler, euler, torch.zeros_like(euler)


def sample_chain(model, prefix, state: torch.Tensor, noise: torch.Tensor, settings: ChainSettings,
                 noise_head: Optional[Callable] = None, generator: Optional[torch.Generator] = None,
                 per_dimension: bool = False) -> Dict[str, torch.Tensor]:
    """Draw a chain from ``noise`` -> {"chain" [B, steps+1, chunk, A], "stochastic_step" [B] (-1
    when none), "logprob" [B] (per_dimension: [B, executed_actions x action_dim]), "entropy" [B],
    "actions" (the chain's end)}."""
    batch, device = noise.shape[0], noise.device
    noise = noise.float()
    times = settings.times(device)
    if settings.method == "flow_sde":  # one stochastic step per sample, uniformly drawn
        stochastic = torch.randint(0, settings.steps, (batch,), generator=generator).to(device)
    else:
        stochastic = torch.full((batch,), -1, dtype=torch.long, device=device)
    x, chain = noise, [noise]
    logprob = _zero_log_prob(batch, settings, per_dimension, device)
    entropy = torch.zeros(batch, dtype=torch.float32, device=device)
    for k in range(settings.steps):
        euler, mean, std = _transition(model, prefix, state, x, times[k].expand(batch), settings, noise_head)
        eps = torch.randn(x.shape, generator=generator).to(device)
        if settings.method == "flow_sde":
            pick = stochastic == k
        else:  # flow_noise: every step is stochastic; flow_ode: none
            pick = torch.full((batch,), settings.method == "flow_noise", dtype=torch.bool, device=device)
        x = torch.where(pick[:, None, None], mean + std * eps, euler)
        chain.append(x)
        if pick.any():
            rows = pick[:, None] if per_dimension else pick
            logprob = logprob + torch.where(rows, executed_log_prob(gaussian_log_prob(x, mean, std), settings,
                                                                    per_dimension), 0.0)
            entropy = entropy + torch.where(pick, executed_sum(_gaussian_entropy(std), settings).float(), 0.0)
    return {"chain": torch.stack(chain, dim=1), "stochastic_step": stochastic, "logprob": logprob,
            "entropy": entropy, "actions": x}


def chain_log_prob(model, prefix, state: torch.Tensor, chain: torch.Tensor, stochastic_step: torch.Tensor,
                   settings: ChainSettings, noise_head: Optional[Callable] = None, per_dimension: bool = False
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Re-score a stored chain under the current weights -> (logprob [B] or, per_dimension,
    [B, executed_actions x action_dim]; entropy [B]), with gradients. ``flow_sde`` recomputes only
    each sample's stochastic step; ``flow_noise`` every step."""
    batch, device = chain.shape[0], chain.device
    chain = chain.float()
    times = settings.times(device)
    if settings.method == "flow_sde":
        rows = torch.arange(batch, device=device)
        x, target = chain[rows, stochastic_step], chain[rows, stochastic_step + 1]
        _, mean, std = _transition(model, prefix, state, x, times[stochastic_step], settings, noise_head)
        return (executed_log_prob(gaussian_log_prob(target, mean, std), settings, per_dimension),
                executed_sum(_gaussian_entropy(std), settings).float())
    if settings.method != "flow_noise":
        raise ValueError(f"{settings.method} draws no stochastic step: it has no log-prob (use it to evaluate)")
    logprob = _zero_log_prob(batch, settings, per_dimension, device)
    entropy = torch.zeros(batch, dtype=torch.float32, device=device)
    for k in range(settings.steps):
        _, mean, std = _transition(model, prefix, state, chain[:, k], times[k].expand(batch), settings, noise_head)
        logprob = logprob + executed_log_prob(gaussian_log_prob(chain[:, k + 1], mean, std), settings, per_dimension)
        entropy = entropy + executed_sum(_gaussian_entropy(std), settings).float()
    return logprob, entropy


def _gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.log(2 * torch.pi * torch.e * std.clamp_min(1e-12) ** 2)
