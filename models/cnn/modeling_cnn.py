"""CNN actor-critic: a shared conv encoder on ``main_images`` plus normalised ``states``."""

from __future__ import annotations

import torch
from torch import nn

from embodied_async.contracts import EnvSpec
from embodied_async.data import PolicyOutput
from models.cnn.configuration_cnn import CNNConfig
from models.common import (
    GaussianHead,
    RunningNorm,
    as_tensor,
    gaussian_supervised_loss,
    layer_init,
    make_mlp,
    set_running_norm,
    zero_values,
)


class ImageEncoder(nn.Module):
    """Strided 3x3 convs -> flatten -> linear feature (uint8 HWC images in, features out)."""

    def __init__(self, image_shape, channels, feature_dim: int):
        super().__init__()
        height, width, in_ch = image_shape
        layers = []
        for out_ch in channels:
            layers += [nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=2, padding=1), nn.ReLU()]
            in_ch = out_ch
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, image_shape[2], height, width)).shape[-1]
        self.proj = nn.Sequential(layer_init(nn.Linear(flat, feature_dim)), nn.ReLU())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # in the weights' dtype: under bf16 compute FSDP casts floating inputs, not uint8 images
        x = images.permute(0, 3, 1, 2).to(self.proj[0].weight.dtype) / 255.0
        return self.proj(self.convs(x))


class CNNPolicy(nn.Module):
    value_parameter_prefixes = ("critic.",)

    def __init__(self, cfg: CNNConfig, env_spec: EnvSpec):
        super().__init__()
        shapes = env_spec.obs_shapes
        if "main_images" not in shapes:
            raise ValueError("model.name=cnn needs image observations ('main_images'); this env gives "
                             f"{sorted(shapes)}: configure the env for rgb observations (e.g. env.obs_mode=rgb)")
        chunks, action_dim = env_spec.num_action_chunks, env_spec.action_dim
        state_dim = int(shapes["states"][0]) if "states" in shapes else 0
        self.encoder = ImageEncoder(tuple(shapes["main_images"]), list(cfg.cnn_channels), cfg.cnn_feature_dim)
        self.normalizer = RunningNorm(state_dim) if (cfg.normalize_obs and state_dim) else None
        feature_dim = cfg.cnn_feature_dim + state_dim
        hidden = list(cfg.hidden_sizes)
        self.actor = make_mlp(feature_dim, hidden, chunks * action_dim, cfg.activation, out_std=0.01 * 2**0.5)
        # no critic in a value-free run (algorithm.adv_type=grpo): its values are zeros
        self.critic = make_mlp(feature_dim, hidden, 1, cfg.activation, out_std=1.0) if cfg.builds_value_head() \
            else None
        self.head = GaussianHead(chunks, action_dim, cfg.init_log_std)
        self.state_dim = state_dim
        self.supervised_horizon = chunks

    def _inputs(self, obs, observe: bool) -> dict:
        """The raw inputs (states un-normalised: they travel in trajectories, and the actor
        normalises them with the statistics it publishes next); ``observe`` records the states'
        moments for the actor."""
        device = self.head.log_std.device
        inputs = {"images": as_tensor(obs["main_images"], torch.uint8, device)}
        if self.state_dim:
            states = as_tensor(obs["states"], device=device)
            if observe and self.normalizer is not None:
                self.normalizer.observe(states)
            inputs["states"] = states
        return inputs

    def _features(self, inputs: dict) -> torch.Tensor:
        features = self.encoder(inputs["images"])
        if self.state_dim:
            states = inputs["states"] if self.normalizer is None else self.normalizer(inputs["states"])
            # in the encoder's dtype: under bf16 compute FSDP casts tensor arguments, not an obs dict
            features = torch.cat([features, states.to(features.dtype)], dim=-1)
        return features

    @torch.no_grad()
    def predict(self, obs, mode: str = "train") -> PolicyOutput:
        inputs = self._inputs(obs, observe=(mode == "train"))
        features = self._features(inputs)
        actions, logprobs = self.head.sample(self.actor(features), deterministic=(mode == "eval"))
        return PolicyOutput(actions=actions, logprobs=logprobs, values=self._value(features),
                            forward_inputs=inputs)

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor:
        return self._value(self._features(self._inputs(obs, observe=False)))

    def evaluate(self, forward_inputs, actions):
        features = self._features(forward_inputs)
        logprobs, entropy = self.head.log_prob_entropy(self.actor(features), actions)
        return logprobs, entropy, self._value(features)

    def _value(self, features: torch.Tensor) -> torch.Tensor:
        return zero_values(features) if self.critic is None else self.critic(features).squeeze(-1)

    def supervised_loss(self, obs, actions, action_pad):
        """Gaussian negative log-likelihood of the expert's actions (``SupervisedPolicy``)."""
        features = self._features(self._inputs(obs, observe=False))
        device = features.device
        return gaussian_supervised_loss(self.head, self.actor(features), as_tensor(actions, device=device),
                                        as_tensor(action_pad, dtype=torch.bool, device=device))

    def set_input_statistics(self, stats) -> None:
        if self.normalizer is not None and "states" in stats:
            set_running_norm(self.normalizer, stats["states"])


def build_cnn_policy(cfg, env_spec: EnvSpec) -> CNNPolicy:
    """The family's builder: a fresh policy, or (``model.path``) one exported by scripts/export.py."""
    if cfg.path:
        from models.mlp.published import build_from_folder

        return build_from_folder(CNNPolicy, cfg, env_spec)
    return CNNPolicy(cfg, env_spec)
