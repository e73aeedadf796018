"""Pi0 inputs as LeRobot prepares them (the fixture's recorded model inputs), normalisation and prompts."""

import os

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from models.pi0.processing_pi0 import (Normalization, camera_images, normalization_from_config, pad_to,
                                       prompt_tokens, read_normalization, resize_with_pad)

FOLDER = os.path.join(FIXTURES, "pi0_tiny_lerobot")
pytestmark = pytest.mark.skipif(not os.path.isdir(FOLDER), reason="Pi0 fixture not available")


@pytest.fixture(scope="module")
def ref():
    return np.load(os.path.join(FOLDER, "inputs.npz")), np.load(os.path.join(FOLDER, "expected.npz"))


@pytest.mark.parametrize("index,camera", [(0, "base_0_rgb"), (1, "left_wrist_0_rgb")])
def test_images_match_lerobot_from_float_and_from_uint8_frames(ref, index, camera):
    inputs, expected = ref
    target = torch.from_numpy(expected[f"model_in.image{index}"])
    from_float = resize_with_pad(torch.from_numpy(inputs[f"observation.images.{camera}.float01"]), 224, 224)
    torch.testing.assert_close(from_float, target, atol=1e-6, rtol=0)
    frames = inputs[f"observation.images.{camera}.uint8"].transpose(0, 2, 3, 1)  # as envs give them: [B, H, W, 3]
    torch.testing.assert_close(camera_images(frames, 224, 224), target, atol=1e-6, rtol=0)


def test_padding_follows_lerobot_unless_asked_otherwise(ref):
    inputs, _ = ref
    wrist = torch.from_numpy(inputs["observation.images.left_wrist_0_rgb.float01"])  # 240x320 -> 168x224 + pad
    lerobot = resize_with_pad(wrist, 224, 224)
    assert (lerobot[:, :, :28] == -3.0).all() and (lerobot[:, :, 196:] == -3.0).all()
    openpi = resize_with_pad(wrist, 224, 224, pad_after_scaling=True)
    assert (openpi[:, :, :28] == -1.0).all() and torch.equal(openpi[:, :, 28:196], lerobot[:, :, 28:196])


def test_statistics_saved_beside_the_checkpoint_are_read():
    normalization = read_normalization(FOLDER)
    assert normalization.modes == {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    assert normalization.stats["observation.state.mean"].shape == (9,) and normalization.eps == 1e-8


@pytest.mark.parametrize("mode", ["MEAN_STD", "MIN_MAX"])
def test_normalisation_round_trips(mode):
    stats = {"action.mean": [1.0, -2.0], "action.std": [0.5, 4.0], "action.min": [-1.0, 0.0], "action.max": [3.0, 2.0]}
    normalization = normalization_from_config(stats, {"ACTION": mode})
    x = torch.tensor([[0.2, 1.5], [2.0, -3.0]])
    normed = normalization.normalize(x, "action", "ACTION")
    torch.testing.assert_close(normalization.unnormalize(normed, "action", "ACTION"), x)
    expected = (x - torch.tensor([1.0, -2.0])) / torch.tensor([0.5, 4.0]) if mode == "MEAN_STD" else \
        (x - torch.tensor([-1.0, 0.0])) / torch.tensor([4.0, 2.0]) * 2 - 1
    torch.testing.assert_close(normed, expected)
    with pytest.raises(KeyError, match="observation.state.mean"):
        Normalization(modes={"STATE": "MEAN_STD"}).normalize(x, "observation.state", "STATE")


def test_prompts_end_with_a_newline_and_are_right_padded():
    seen = []
    tokenize = lambda text: seen.append(text) or [2] + [3 + len(w) for w in text.split()] + [108]  # noqa: E731
    ids, mask = prompt_tokens(["pick up the cube", "go"], tokenize, max_length=6)
    assert seen == ["pick up the cube\n", "go\n"]
    assert ids.tolist() == [[2, 7, 5, 6, 7, 108], [2, 5, 108, 0, 0, 0]]
    assert mask.tolist() == [[True] * 6, [True] * 3 + [False] * 3]
    assert pad_to(torch.ones(2, 3), 5).tolist() == [[1, 1, 1, 0, 0]] * 2
