"""A linear Gaussian actor-critic on the ``states`` vector (the Policy protocol)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from embodied_async.contracts import EnvSpec
from embodied_async.data import PolicyOutput

from .configuration import LinearPolicyConfig


class LinearGaussianPolicy(nn.Module):
    value_parameter_prefixes = ("critic.",)

    def __init__(self, cfg: LinearPolicyConfig, env_spec: EnvSpec):
        super().__init__()
        state_dim = env_spec.obs_shapes["states"][0]
        self.chunks, self.action_dim = env_spec.num_action_chunks, env_spec.action_dim
        self.actor = nn.Linear(state_dim, self.chunks * self.action_dim)
        self.critic = nn.Linear(state_dim, 1)
        self.log_std = nn.Parameter(torch.full((self.chunks * self.action_dim,), cfg.init_log_std))

    def _states(self, obs) -> torch.Tensor:
        return torch.as_tensor(np.array(obs["states"]), dtype=torch.float32, device=self.log_std.device)

    def _distribution(self, states: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.actor(states), self.log_std.exp().expand(states.shape[0], -1))

    @torch.no_grad()
    def predict(self, obs, mode: str = "train") -> PolicyOutput:
        states = self._states(obs)
        dist = self._distribution(states)
        flat = dist.mean if mode == "eval" else dist.sample()
        return PolicyOutput(actions=flat.view(-1, self.chunks, self.action_dim), logprobs=dist.log_prob(flat).sum(-1),
                            values=self.critic(states).squeeze(-1), forward_inputs={"states": states})

    def evaluate(self, forward_inputs, actions):
        states = forward_inputs["states"]
        dist = self._distribution(states)
        flat = actions.reshape(states.shape[0], -1)
        return dist.log_prob(flat).sum(-1), dist.entropy().sum(-1), self.critic(states).squeeze(-1)

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor:
        return self.critic(self._states(obs)).squeeze(-1)
