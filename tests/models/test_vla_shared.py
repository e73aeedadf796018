"""What the VLA families share (models/vla.py): dtypes, LoRA in place, tiny checkpoints, the
env's action chunk against the checkpoint's."""

import pytest
import torch
from torch import nn

from embodied_async.contracts import EnvSpec
from models.vla import check_action_chunk, check_tiny_image_size, compute_dtype, inject_lora


def test_precision_names_are_torch_dtypes():
    assert compute_dtype("bfloat16") is torch.bfloat16 and compute_dtype("float32") is torch.float32
    with pytest.raises(ValueError, match=r"model.precision='fp8'; use one of \['float32', 'bfloat16'\]"):
        compute_dtype("fp8")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.mlp = nn.Linear(4, 4), nn.Linear(4, 4)


def test_lora_goes_into_the_roots_in_place_and_freezes_everything_else():
    model = nn.Module()
    model.tower, model.head = Block(), Block()
    inject_lora(model, [model.tower], rank=2, alpha=4, targets=["q_proj"])
    trainable = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    assert trainable and all(name.startswith("tower.q_proj.lora_") for name in trainable)
    assert isinstance(model.tower.q_proj.base_layer, nn.Linear)  # same path, wrapped in place
    assert not hasattr(model.head.q_proj, "lora_A")


def spec(chunks, action_dim):
    return EnvSpec(obs_shapes={}, obs_dtypes={}, action_dim=action_dim, num_action_chunks=chunks)


def test_the_env_action_chunk_must_fit_the_checkpoint():
    check_action_chunk(spec(5, 7), "Pi0", chunk=50, action_dim=32, exact=False, source="x")  # padded
    check_action_chunk(None, "OpenVLA", chunk=1, action_dim=7, exact=True, source="x")  # no env yet
    with pytest.raises(ValueError, match="env.num_action_chunks=2: OpenVLA emits 1 action"):
        check_action_chunk(spec(2, 7), "OpenVLA", chunk=1, action_dim=7, exact=True, source="x")
    with pytest.raises(ValueError, match="the env's actions have 6 values, OpenVLA's 7"):
        check_action_chunk(spec(1, 6), "OpenVLA", chunk=1, action_dim=7, exact=True, source="x")
    with pytest.raises(ValueError, match="the env's actions have 40 values, Pi0's at most 32"):
        check_action_chunk(spec(5, 40), "Pi0", chunk=50, action_dim=32, exact=False, source="x")


def test_a_tiny_checkpoint_of_another_image_size_is_refused():
    check_tiny_image_size("/tmp/tiny", 64, 64)
    check_tiny_image_size("/tmp/tiny", None, 64)  # no size recorded: nothing to compare
    with pytest.raises(ValueError, match="takes 112 px images, not model.tiny_image_size=64"):
        check_tiny_image_size("/tmp/tiny", 112, 64)
