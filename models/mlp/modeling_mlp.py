"""MLP actor-critic on the ``states`` vector: separate policy and value networks."""

from __future__ import annotations

import torch
from torch import nn

from embodied_async.contracts import EnvSpec
from embodied_async.data import PolicyOutput
from models.common import (
    GaussianHead,
    RunningNorm,
    as_tensor,
    gaussian_supervised_loss,
    make_mlp,
    set_running_norm,
    zero_values,
)
from models.mlp.configuration_mlp import MLPConfig


class MLPPolicy(nn.Module):
    """``states -> Gaussian actions [B, C, A]`` and ``states -> value``."""

    value_parameter_prefixes = ("critic.",)

    def __init__(self, cfg: MLPConfig, env_spec: EnvSpec):
        super().__init__()
        if "states" not in env_spec.obs_shapes:
            raise ValueError("model.name=mlp needs a 'states' observation; this env gives "
                             f"{sorted(env_spec.obs_shapes)}")
        state_dim = int(env_spec.obs_shapes["states"][0])
        chunks, action_dim = env_spec.num_action_chunks, env_spec.action_dim
        self.normalizer = RunningNorm(state_dim) if cfg.normalize_obs else None
        hidden = list(cfg.hidden_sizes)
        self.actor = make_mlp(state_dim, hidden, chunks * action_dim, cfg.activation, out_std=0.01 * 2**0.5)
        # no critic in a value-free run (algorithm.adv_type=grpo): its values are zeros
        self.critic = make_mlp(state_dim, hidden, 1, cfg.activation, out_std=1.0) if cfg.builds_value_head() else None
        self.head = GaussianHead(chunks, action_dim, cfg.init_log_std)
        self.supervised_horizon = chunks

    def _raw_states(self, obs, observe: bool) -> torch.Tensor:
        states = as_tensor(obs["states"], device=self.head.log_std.device)
        if observe and self.normalizer is not None:
            self.normalizer.observe(states)
        return states

    def _normalised(self, states: torch.Tensor) -> torch.Tensor:
        return states if self.normalizer is None else self.normalizer(states)

    @torch.no_grad()
    def predict(self, obs, mode: str = "train") -> PolicyOutput:
        raw = self._raw_states(obs, observe=(mode == "train"))
        states = self._normalised(raw)
        actions, logprobs = self.head.sample(self.actor(states), deterministic=(mode == "eval"))
        values = self._value(states)
        # the raw states travel: the actor normalises them with the statistics it has just merged,
        # the ones it publishes with the weights it trains (and the rollout acts with next)
        return PolicyOutput(actions=actions, logprobs=logprobs, values=values, forward_inputs={"states": raw})

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor:
        return self._value(self._normalised(self._raw_states(obs, observe=False)))

    def evaluate(self, forward_inputs, actions):
        states = self._normalised(forward_inputs["states"])
        logprobs, entropy = self.head.log_prob_entropy(self.actor(states), actions)
        return logprobs, entropy, self._value(states)

    def _value(self, states: torch.Tensor) -> torch.Tensor:
        return zero_values(states) if self.critic is None else self.critic(states).squeeze(-1)

    def supervised_loss(self, obs, actions, action_pad):
        """Gaussian negative log-likelihood of the expert's actions (``SupervisedPolicy``)."""
        # in the weights' dtype: under bf16 compute FSDP casts tensor arguments, not an obs dict
        states = self._normalised(self._raw_states(obs, observe=False)).to(self.actor[0].weight.dtype)
        return gaussian_supervised_loss(self.head, self.actor(states), as_tensor(actions, device=states.device),
                                        as_tensor(action_pad, dtype=torch.bool, device=states.device))

    def set_input_statistics(self, stats) -> None:
        if self.normalizer is not None and "states" in stats:
            set_running_norm(self.normalizer, stats["states"])


def build_mlp_policy(cfg, env_spec: EnvSpec) -> MLPPolicy:
    """The family's builder: a fresh policy, or (``model.path``) one exported by scripts/export.py."""
    if cfg.path:
        from models.mlp.published import build_from_folder

        return build_from_folder(MLPPolicy, cfg, env_spec)
    return MLPPolicy(cfg, env_spec)
