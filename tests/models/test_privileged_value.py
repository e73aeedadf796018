"""model.value_input=privileged_states (OpenVLA): an asymmetric critic. The value head reads the
env's privileged state vector while actions come from the image and instruction alone; rollout,
actor and bootstrap compute the same values."""

import numpy as np
import pytest
import torch

from embodied_async.contracts import EnvSpec
from embodied_async.registry import build_policy
from models.openvla.configuration_policy import OpenVLAPolicyConfig

STATE_DIM = 31


def spec(privileged=True):
    shapes = {"main_images": (64, 64, 3), **({"privileged_states": (STATE_DIM,)} if privileged else {})}
    dtypes = {"main_images": "uint8", **({"privileged_states": "float32"} if privileged else {})}
    return EnvSpec(obs_shapes=shapes, obs_dtypes=dtypes, action_dim=4, action_low=(-1.0,) * 4,
                   action_high=(1.0,) * 4)


def config(folder, value_input="privileged_states"):
    cfg = OpenVLAPolicyConfig(path=folder, tiny_random_init=True, unnorm_key="tiny", value_head_hidden_sizes=[16],
                              tiny_image_size=112, value_input=value_input)
    cfg.lora.enabled = False
    return cfg


def observations(seed, batch=3):
    rng = np.random.default_rng(seed)
    return {"main_images": rng.integers(0, 256, (batch, 64, 64, 3), dtype=np.uint8),
            "privileged_states": rng.normal(size=(batch, STATE_DIM)).astype(np.float32),
            "task_descriptions": ["push the cube to the goal"] * batch}


def test_values_read_the_privileged_states_and_actions_do_not(tmp_path):
    policy = build_policy(config(str(tmp_path / "tiny")), spec())
    obs = observations(0)
    torch.manual_seed(0)
    out = policy.predict(obs)
    logprobs, _, values = policy.evaluate(out.forward_inputs)
    assert torch.allclose(logprobs, out.logprobs, atol=1e-4)
    assert torch.allclose(values, out.values, atol=1e-5) and torch.allclose(policy.value(obs), out.values, atol=1e-5)
    other = dict(obs, privileged_states=observations(1)["privileged_states"])
    torch.manual_seed(0)
    moved = policy.predict(other)
    assert torch.equal(moved.forward_inputs["action_tokens"], out.forward_inputs["action_tokens"])
    assert not torch.allclose(moved.values, out.values)
    # value-head parameters are the ones the value learning rate and the critic warm-up act on
    heads = [n for n, _ in policy.named_parameters() if n.startswith(policy.value_parameter_prefixes)]
    assert heads and all("vla." not in n for n in heads)


def test_privileged_values_without_privileged_states_are_refused_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match="env.privileged_states=true"):
        build_policy(config(str(tmp_path / "tiny")), spec(privileged=False))
