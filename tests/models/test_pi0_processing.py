"""Pi0 inputs as LeRobot prepares them (the fixture's recorded model inputs), normalisation and prompts."""

import os

import numpy as np
import pytest
import torch
from conftest import FIXTURES, reference_fixture

from models.pi0.processing_pi0 import (
    Normalization,
    camera_images,
    normalization_from_config,
    pad_to,
    prompt_tokens,
    read_normalization,
    resize_with_pad,
)

FOLDER = os.path.join(FIXTURES, "pi0_tiny_lerobot")


@pytest.fixture(scope="module", autouse=True)
def pi0_fixture():
    return reference_fixture("pi0_tiny_lerobot")


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


def test_tiny_checkpoints_have_lerobots_processor_files_and_actions_use_the_postprocessor(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from models.pi0.tiny import make_tiny_pi0

    folder = make_tiny_pi0(str(tmp_path / "tiny"), state_dim=9, action_dim=7)
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):  # same steps, same statistics files
        ours, lerobot = (json.load(open(os.path.join(f, name))) for f in (folder, FOLDER))
        assert [s["registry_name"] for s in ours["steps"]] == [s["registry_name"] for s in lerobot["steps"]]
        assert [s.get("state_file") for s in ours["steps"]] == [s.get("state_file") for s in lerobot["steps"]]
    post = os.path.join(folder, "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
    stats = load_file(post)
    stats["action.mean"] = torch.full((7,), 0.25)  # the un-normaliser's own action statistics
    save_file(stats, post)
    normalization = read_normalization(folder)
    assert torch.equal(normalization.stats["action.mean"], torch.full((7,), 0.25))
    assert torch.equal(normalization.stats["observation.state.mean"], torch.zeros(9))  # from the normaliser


def test_statistics_of_another_size_or_missing_ones_are_refused_at_build(tmp_path):
    from embodied_async.contracts import EnvSpec
    from models.pi0.configuration_policy import Pi0PolicyConfig
    from models.pi0.policy_pi0 import build_pi0_policy

    spec = EnvSpec(obs_shapes={"states": (8,), "main_images": (32, 32, 3)},
                   obs_dtypes={"states": "float32", "main_images": "uint8"}, action_dim=7, num_action_chunks=5)
    base = dict(path=str(tmp_path / "tiny"), tiny_random_init=True, tokenizer="words")
    build_pi0_policy(Pi0PolicyConfig(**base), spec)  # its own statistics fit
    wrong = {"observation.state.mean": [0.0] * 9, "observation.state.std": [1.0] * 9,
             "action.mean": [0.0] * 7, "action.std": [1.0] * 7}
    with pytest.raises(ValueError, match=r"observation.state.\* \(model.normalization_stats\) have 9 values .* has 8"):
        build_pi0_policy(Pi0PolicyConfig(normalization_stats=wrong, **base), spec)
    no_actions = {k: v for k, v in wrong.items() if k.startswith("observation")}
    no_actions.update({"observation.state.mean": [0.0] * 8, "observation.state.std": [1.0] * 8})
    with pytest.raises(ValueError, match=r"action.mean.*normalization_stats"):
        build_pi0_policy(Pi0PolicyConfig(normalization_stats=no_actions, **base), spec)
    long_state = EnvSpec(obs_shapes={"states": (40,), "main_images": (32, 32, 3)},
                         obs_dtypes={"states": "float32", "main_images": "uint8"}, action_dim=7, num_action_chunks=5)
    with pytest.raises(ValueError, match="40 values, more than the 32"):
        build_pi0_policy(Pi0PolicyConfig(**base), long_state)
