"""Pieces shared by the small policies: running observation normalisation, MLPs, Gaussian heads.

The Policy protocol (DESIGN.md):
- ``predict(obs, mode) -> PolicyOutput``: ``mode`` "train" samples (and updates running
  observation statistics), "eval" takes the deterministic action.
- ``evaluate(forward_inputs, actions) -> (logprobs, entropy, values)`` with the same log-prob
  semantics as ``predict`` (one log-prob per decision: summed over chunk and action dims).
- ``value(obs) -> values`` for bootstrapping from final observations.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np
import torch
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


def as_tensor(value, dtype=torch.float32, device=None) -> torch.Tensor:
    """Observation arrays (numpy from the env, or tensors) on the policy's device."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype)
    array = np.asarray(value)
    if not array.flags.writeable:  # arrays Ray hands over without a copy are read-only
        array = array.copy()
    return torch.as_tensor(array, dtype=dtype, device=device)


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal init, the PPO default (scaled per layer: small for the policy head)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def make_mlp(in_dim: int, hidden: Sequence[int], out_dim: int, activation: str, out_std: float) -> nn.Sequential:
    if activation not in ACTIVATIONS:
        raise ValueError(f"model.activation={activation!r}; use one of {sorted(ACTIVATIONS)}")
    layers = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """Running mean/variance normalisation of a feature vector (buffers, not parameters).

    Statistics are updated by the rollout worker on the observations it sees; they are buffers,
    so weight publication (parameters only) never overwrites them with the actor's stale copy.
    """

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip, self.eps = clip, eps

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.detach().to(torch.float64).reshape(-1, x.shape[-1])
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        new_mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.eps)
        return normed.clamp(-self.clip, self.clip)


class GaussianHead(nn.Module):
    """Diagonal Gaussian over ``chunks x action_dim`` with a state-independent log std."""

    def __init__(self, num_chunks: int, action_dim: int, init_log_std: float):
        super().__init__()
        self.num_chunks, self.action_dim = num_chunks, action_dim
        self.log_std = nn.Parameter(torch.full((num_chunks * action_dim,), float(init_log_std)))

    def distribution(self, mean: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))

    def sample(self, mean: torch.Tensor, deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(mean)
        flat = mean if deterministic else dist.sample()
        return flat.view(-1, self.num_chunks, self.action_dim), dist.log_prob(flat).sum(-1)

    def log_prob_entropy(self, mean: torch.Tensor, actions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(mean)
        flat = actions.reshape(mean.shape).to(mean.dtype)
        return dist.log_prob(flat).sum(-1), dist.entropy().sum(-1)
