"""Every policy family learns from demonstrations: on a fixed small batch its supervised loss
falls at least tenfold (the tiny VLAs as the recipes build them, through the registry)."""

import numpy as np
import pytest
import torch

from embodied_async.contracts import EnvSpec, SupervisedPolicy
from embodied_async.registry import build_policy
from models.cnn.configuration_cnn import CNNConfig
from models.mlp.configuration_mlp import MLPConfig
from models.openvla.configuration_policy import OpenVLAPolicyConfig
from models.pi0.configuration_policy import Pi0PolicyConfig

pytestmark = pytest.mark.slow  # trains each family until it overfits (~20 s)

BATCH, STATE_DIM, ACTION_DIM = 6, 9, 7


def spec(chunks=1):
    return EnvSpec(obs_shapes={"main_images": (64, 64, 3), "states": (STATE_DIM,)},
                   obs_dtypes={"main_images": "uint8", "states": "float32"}, action_dim=ACTION_DIM,
                   num_action_chunks=chunks, action_low=(-1.0,) * ACTION_DIM, action_high=(1.0,) * ACTION_DIM)


def demonstrations(horizon, seed=0):
    rng = np.random.default_rng(seed)
    obs = {"main_images": rng.integers(0, 256, (BATCH, 64, 64, 3), dtype=np.uint8),
           "states": rng.normal(size=(BATCH, STATE_DIM)).astype(np.float32),
           "task_descriptions": ["push the cube to the goal"] * BATCH}
    actions = rng.uniform(-0.9, 0.9, size=(BATCH, horizon, ACTION_DIM)).astype(np.float32)
    pad = np.zeros((BATCH, horizon), dtype=bool)
    pad[0, horizon // 2:] = horizon > 1  # one sample's episode ended mid-chunk
    return obs, torch.as_tensor(actions), torch.as_tensor(pad)


FAMILIES = {
    "mlp": (lambda tmp: MLPConfig(hidden_sizes=[64, 64]), 1, 3e-3, 300, "train/sft/action_mse"),
    "cnn": (lambda tmp: CNNConfig(hidden_sizes=[64]), 1, 3e-3, 300, "train/sft/action_mse"),
    "openvla": (lambda tmp: OpenVLAPolicyConfig(path=str(tmp / "tiny_openvla"), tiny_random_init=True,
                                                unnorm_key="tiny", value_head_hidden_sizes=[16]), 1, 4e-3, 35, None),
    "pi0": (lambda tmp: Pi0PolicyConfig(path=str(tmp / "tiny_pi0"), tiny_random_init=True, tokenizer="words",
                                        value_head_hidden_sizes=[16], camera_keys=["main_images"]), 5, 1e-3, 80,
            None),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_supervised_loss_overfits_a_fixed_batch(family, tmp_path):
    make_cfg, chunks, lr, steps, metric = FAMILIES[family]
    torch.manual_seed(0)
    policy = build_policy(make_cfg(tmp_path), spec(chunks))
    assert isinstance(policy, SupervisedPolicy)
    obs, actions, pad = demonstrations(policy.supervised_horizon)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=lr)
    history = []
    for _ in range(steps):
        torch.manual_seed(1)  # the same noise and flow times every step: a fixed objective
        losses, metrics = policy.supervised_loss(obs, actions, pad)
        assert losses.shape == (BATCH,)
        optimizer.zero_grad()
        losses.mean().backward()
        optimizer.step()
        history.append(metrics[metric] if metric else float(losses.detach().mean()))
    assert history[-1] < history[0] / 10, (family, history[0], history[-1])
