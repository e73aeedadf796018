"""Denoising chains for RL: sample one (the rollout) and re-score it (the actor).

The rollout keeps the whole chain ``x_{t_0} .. x_{t_N}`` it drew (and, for ``flow_sde``, which step
was stochastic); the actor recomputes the velocities along that same chain under its current
weights, so the ratio of new to old log-probs is that of the same sample. Log-probs cover the
executed part of the chunk (its first ``executed_actions`` actions) and the real action
dimensions only: the rest of the chunk and the padding dimensions never reach the env. They are
summed over those entries (one per decision), or kept per entry (``per_dimension``:
``algorithm.logprob_type=token_level``), flattened to ``executed_actions x action_dim``.

Noise is drawn into the executed entries alone: the other entries take the deterministic Euler
step, so no randomness the log-prob leaves out reaches the executed actions through attention in
later steps. What each method's log-prob covers:

- ``flow_sde``: one stochastic step per sample (RLinf's pi_RL parity); the other steps, and the
  chain's start, are randomness it does not credit;
- ``flow_noise``: every step, jointly (``chain_logprob=joint``, the exact log-density of the chain
  given its start) or as the per-step mean (``step_mean``, RLinf's ``joint_logprob: false``);
- ``action_gaussian``: a deterministic chain from a fixed start whose executed action alone is
  drawn around the chain's end, ``a ~ N(flow(s), sigma^2)``: the log-prob is the policy's whole
  randomness, and its mean is the evaluation rule (``flow_ode`` from the same start).
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
    # flow_noise: the steps' log-densities summed ("joint") or averaged ("step_mean")
    chain_logprob: str = "joint"

    @property
    def step_size(self) -> float:
        return 1.0 / self.steps

    def times(self, device=None) -> torch.Tensor:
        """t_k = 1 - k / steps as float32 (LeRobot's ``1 + k * dt`` in double, then cast)."""
        return torch.tensor([1.0 + k * (-1.0 / self.steps) for k in range(self.steps + 1)], dtype=torch.float32,
                            device=device)


def executed_entries(x: torch.Tensor, settings: ChainSettings) -> torch.Tensor:
    """[1, chunk, dims] bool: the entries of a chunk the env executes (first actions, real dims)."""
    entries = torch.zeros((1, *x.shape[1:]), dtype=torch.bool, device=x.device)
    entries[:, :settings.executed_actions, :settings.action_dim] = True
    return entries


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
                 per_dimension: bool = False, action_std: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
    """Draw a chain from ``noise`` -> {"chain" [B, steps+1, chunk, A], "stochastic_step" [B] (-1
    when none), "logprob" [B] (per_dimension: [B, executed_actions x action_dim]), "entropy" [B],
    "actions" (the chain's end)}. ``action_std`` [A]: ``action_gaussian``'s std per dimension."""
    batch, device = noise.shape[0], noise.device
    noise = noise.float()
    times = settings.times(device)
    executed = executed_entries(noise, settings)
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
        else:  # flow_noise: every step is stochastic; flow_ode and action_gaussian: none
            pick = torch.full((batch,), settings.method == "flow_noise", dtype=torch.bool, device=device)
        x = torch.where(pick[:, None, None] & executed, mean + std * eps, euler)
        chain.append(x)
        if pick.any():
            rows = pick[:, None] if per_dimension else pick
            logprob = logprob + torch.where(rows, executed_log_prob(gaussian_log_prob(x, mean, std), settings,
                                                                    per_dimension), 0.0)
            entropy = entropy + torch.where(pick, executed_sum(_gaussian_entropy(std), settings).float(), 0.0)
    if settings.method == "action_gaussian":
        std = action_std.float().expand_as(x)
        mean, x = x, torch.where(executed, x + std * torch.randn(x.shape, generator=generator).to(device), x)
        chain[-1] = x  # the chain's end: the action drawn around the flow's output
        logprob = executed_log_prob(gaussian_log_prob(x, mean, std), settings, per_dimension)
        entropy = executed_sum(_gaussian_entropy(std), settings).float()
    logprob, entropy = _over_steps(logprob, entropy, settings)
    return {"chain": torch.stack(chain, dim=1), "stochastic_step": stochastic, "logprob": logprob,
            "entropy": entropy, "actions": x}


def chain_log_prob(model, prefix, state: torch.Tensor, chain: torch.Tensor, stochastic_step: torch.Tensor,
                   settings: ChainSettings, noise_head: Optional[Callable] = None, per_dimension: bool = False,
                   action_std: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Re-score a stored chain under the current weights -> (logprob [B] or, per_dimension,
    [B, executed_actions x action_dim]; entropy [B]), with gradients. ``flow_sde`` recomputes only
    each sample's stochastic step; ``flow_noise`` every step; ``action_gaussian`` integrates the
    chain from its start again, the action's mean being where it ends now."""
    batch, device = chain.shape[0], chain.device
    chain = chain.float()
    times = settings.times(device)
    if settings.method == "flow_sde":
        rows = torch.arange(batch, device=device)
        x, target = chain[rows, stochastic_step], chain[rows, stochastic_step + 1]
        _, mean, std = _transition(model, prefix, state, x, times[stochastic_step], settings, noise_head)
        return (executed_log_prob(gaussian_log_prob(target, mean, std), settings, per_dimension),
                executed_sum(_gaussian_entropy(std), settings).float())
    if settings.method == "action_gaussian":
        x = chain[:, 0]
        for k in range(settings.steps):
            x, _, _ = _transition(model, prefix, state, x, times[k].expand(batch), settings, noise_head)
        std = action_std.float().expand_as(x)
        return (executed_log_prob(gaussian_log_prob(chain[:, -1], x, std), settings, per_dimension),
                executed_sum(_gaussian_entropy(std), settings).float())
    if settings.method != "flow_noise":
        raise ValueError(f"{settings.method} draws no stochastic step: it has no log-prob (use it to evaluate)")
    logprob = _zero_log_prob(batch, settings, per_dimension, device)
    entropy = torch.zeros(batch, dtype=torch.float32, device=device)
    for k in range(settings.steps):
        _, mean, std = _transition(model, prefix, state, chain[:, k], times[k].expand(batch), settings, noise_head)
        logprob = logprob + executed_log_prob(gaussian_log_prob(chain[:, k + 1], mean, std), settings, per_dimension)
        entropy = entropy + executed_sum(_gaussian_entropy(std), settings).float()
    return _over_steps(logprob, entropy, settings)


def _over_steps(logprob: torch.Tensor, entropy: torch.Tensor, settings: ChainSettings):
    """flow_noise's ``step_mean``: the steps' mean instead of their sum (the joint log-density)."""
    if settings.method == "flow_noise" and settings.chain_logprob == "step_mean":
        return logprob / settings.steps, entropy / settings.steps
    return logprob, entropy


def _gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.log(2 * torch.pi * torch.e * std.clamp_min(1e-12) ** 2)
