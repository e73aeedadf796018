"""Stochastic denoising transitions for RL (``model.noise_method``) and their log-densities.

Flow matching samples by Euler steps of a learned velocity field from t=1 (noise) to t=0
(actions), ``x_{t-d} = x_t - d * v``: deterministic, so it has no probability of the action taken.
Making a transition Gaussian gives one (the pi_RL recipe, as RLinf runs it):

- ``flow_sde``: the Euler step of the probability-flow ODE becomes a step of the matching SDE.
  With ``sigma = noise_level * sqrt(t / (1 - t))`` (``t`` clipped to ``1 - d`` in the denominator,
  so the first step from t=1 is finite), the mean is
  ``x_t - d * (v + sigma^2 / (2 t) * (x_t + (1 - t) v))`` and the std ``sqrt(d) * sigma``; the
  correction keeps the marginals those of the flow.
- ``flow_noise``: the Euler mean, with a std given per element by a learned head.

Times and step sizes are positive Python floats here: ``t`` the current time, ``d`` the step.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def sde_sigma(t, step: float, noise_level: float):
    """The SDE's noise scale at time ``t`` (``t / (1 - t)`` with ``t <= 1 - step``); ``t`` a
    float or a tensor."""
    if isinstance(t, torch.Tensor):
        return noise_level * torch.sqrt(t / (1.0 - t.clamp(max=1.0 - step)))
    return noise_level * math.sqrt(t / (1.0 - min(t, 1.0 - step)))


def sde_transition(x_t: torch.Tensor, velocity: torch.Tensor, t, step: float,
                   noise_level: float) -> Tuple[torch.Tensor, object]:
    """(mean, std) of the Gaussian step from ``x_t`` at time ``t`` to time ``t - step``. ``t``: a
    float, or a tensor [B] of per-sample times (then std is [B, 1, 1])."""
    if isinstance(t, torch.Tensor):
        t = t.to(x_t.dtype).reshape(-1, *([1] * (x_t.dim() - 1)))
    sigma = sde_sigma(t, step, noise_level)
    mean = x_t - step * (velocity + sigma ** 2 / (2 * t) * (x_t + (1 - t) * velocity))
    return mean, math.sqrt(step) * sigma


def euler_mean(x_t: torch.Tensor, velocity: torch.Tensor, step: float) -> torch.Tensor:
    return x_t - step * velocity


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2) (``std`` a float or a tensor broadcast to ``x``)."""
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    return -0.5 * ((x - mean) / std) ** 2 - torch.log(std) - LOG_SQRT_2PI


def bounded_std(raw: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """A learned head's output -> a std in [low, high]: log-variance interpolated by tanh (RLinf's
    exploration-noise head does the same)."""
    log_low, log_high = 2 * math.log(low), 2 * math.log(high)
    log_var = log_low + (log_high - log_low) * (torch.tanh(raw) + 1) / 2
    return torch.exp(0.5 * log_var)
