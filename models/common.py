"""Pieces shared by the small policies: running observation normalisation, MLPs, Gaussian heads.

What a policy must offer is the Policy protocol in ``embodied_async/contracts.py``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Sequence, Tuple

import numpy as np
import torch
from torch import nn

from embodied_async.normalization import RunningNorm  # noqa: F401  (re-exported for the policies)
from models.activations import ACTIVATIONS as ACTIVATION_MODULES

ACTIVATIONS = {name: getattr(nn, module) for name, module in ACTIVATION_MODULES.items()}


def as_tensor(value, dtype=torch.float32, device=None) -> torch.Tensor:
    """Observation arrays (numpy from the env, or tensors) on the policy's device."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype)
    array = np.asarray(value)
    if not array.flags.writeable:  # arrays Ray hands over without a copy are read-only
        array = array.copy()
    return torch.as_tensor(array, dtype=dtype, device=device)


@contextlib.contextmanager
def inference(module: nn.Module):
    """No grad and eval mode (no dropout; HF models also skip their KV cache in checkpointed
    training mode) for the block; the module's mode is restored after it."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


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


# The log std is clamped to [LOG_STD_MIN, LOG_STD_MAX] (std 0.0067 to 7.4) wherever it is used:
# below, log-probs grow without bound and one near-deterministic action blows up the ratio;
# above, the sampled actions are all clipped by the env and carry no signal. Outside the range the
# clamp passes no gradient, so the parameter stays where the optimiser left it.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class GaussianHead(nn.Module):
    """Diagonal Gaussian over ``chunks x action_dim`` with a state-independent, clamped log std."""

    def __init__(self, num_chunks: int, action_dim: int, init_log_std: float):
        super().__init__()
        self.num_chunks, self.action_dim = num_chunks, action_dim
        self.log_std = nn.Parameter(torch.full((num_chunks * action_dim,), float(init_log_std)))

    def distribution(self, mean: torch.Tensor) -> torch.distributions.Normal:
        std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
        # no argument validation: it costs ~80 us per call (a tenth of a rollout decision), and a
        # non-finite mean is caught by the callers with an error that names the cause (the
        # rollout's divergence check, the update's non-finite loss guard)
        return torch.distributions.Normal(mean, std.expand_as(mean), validate_args=False)

    def sample(self, mean: torch.Tensor, deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(mean)
        flat = mean if deterministic else dist.sample()
        return flat.view(-1, self.num_chunks, self.action_dim), dist.log_prob(flat).sum(-1)

    def log_prob_entropy(self, mean: torch.Tensor, actions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(mean)
        flat = actions.reshape(mean.shape).to(mean.dtype)
        return dist.log_prob(flat).sum(-1), dist.entropy().sum(-1)


def head_output(head: nn.Sequential, features: torch.Tensor) -> torch.Tensor:
    """A scalar head (e.g. the value MLP) on ``features`` in the head's own dtype (the backbone may
    compute in bfloat16 while the head is float32); float32 out, trailing 1 dropped."""
    return head(features.to(head[0].weight.dtype)).squeeze(-1).float()


def zero_values(features: torch.Tensor) -> torch.Tensor:
    """The values [B] of a policy without a value head (a value-free run): zeros, float32."""
    return torch.zeros(features.shape[0], dtype=torch.float32, device=features.device)


def gaussian_supervised_loss(head: GaussianHead, mean: torch.Tensor, actions: torch.Tensor,
                             action_pad: torch.Tensor) -> Tuple[torch.Tensor, dict]:
    """Negative log-likelihood of the expert's actions under the Gaussian head, per sample: the
    mean over the chunk's actions that lie within the episode (``action_pad`` False)."""
    batch, chunks, dim = mean.shape[0], head.num_chunks, head.action_dim
    target = actions[:, :chunks].reshape(batch, chunks * dim).to(mean.dtype)
    valid = (~action_pad[:, :chunks].bool()).to(mean.dtype)
    logp = head.distribution(mean).log_prob(target).view(batch, chunks, dim).sum(-1)
    count = valid.sum(-1).clamp_min(1.0)
    losses = -(logp * valid).sum(-1) / count
    error = ((mean.detach() - target).view(batch, chunks, dim).pow(2).mean(-1) * valid).sum(-1) / count
    return losses, {"train/sft/action_mse": float(error.mean())}


@torch.no_grad()
def set_running_norm(norm: RunningNorm, stats: dict) -> None:
    """Take a dataset's mean / std / count of a feature as the normaliser's statistics."""
    mean = torch.as_tensor(np.asarray(stats["mean"], dtype=np.float64)).reshape(-1)
    std = torch.as_tensor(np.asarray(stats["std"], dtype=np.float64)).reshape(-1)
    if mean.numel() != norm.mean.numel():
        raise ValueError(f"the dataset's statistics have {mean.numel()} values, the policy's input {norm.mean.numel()}")
    norm.mean.copy_(mean.to(norm.mean.device))
    norm.var.copy_(std.pow(2).to(norm.var.device))
    norm.count.fill_(float(np.asarray(stats["count"]).reshape(-1)[0]))
