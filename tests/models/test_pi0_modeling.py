"""Native Pi0 against LeRobot's numbers (../shared/fixtures/pi0_tiny_lerobot), loaded through the
same loader a real LeRobot checkpoint takes. Thresholds: the fixture README's section 9 (5-10x the
spread LeRobot itself shows across thread counts and attention kernels)."""

import os
import shutil

import numpy as np
import pytest
import torch
from conftest import FIXTURES, reference_fixture
from safetensors.torch import load_file, save_file

from models.pi0.configuration_pi0 import read_architecture
from models.pi0.modeling_pi0 import Pi0CheckpointError, attention_mask_2d, load_pi0, sinusoidal_time_embedding

FOLDER = os.path.join(FIXTURES, "pi0_tiny_lerobot")


@pytest.fixture(scope="module", autouse=True)
def pi0_fixture():
    return reference_fixture("pi0_tiny_lerobot")


@pytest.fixture(scope="module")
def ref():
    inputs, expected = np.load(os.path.join(FOLDER, "inputs.npz")), np.load(os.path.join(FOLDER, "expected.npz"))
    return {**{k: torch.from_numpy(inputs[k]) for k in inputs}, **{k: torch.from_numpy(expected[k]) for k in expected}}


@pytest.fixture(scope="module")
def run(ref):
    """The model's outputs on the fixture's inputs (prefix, cache, sampling, training loss)."""
    model = load_pi0(FOLDER)
    with torch.no_grad():
        images = [ref[f"model_in.image{i}"] for i in range(3)]
        masks = [ref[f"model_in.image{i}_mask"] for i in range(3)]
        embs, pad, blocks = model.embed_prefix(images, masks, ref["observation.language.tokens"],
                                               ref["observation.language.attention_mask"])
        cache, _ = model.run_prefix(embs, pad, blocks)
        sample = model.sample((cache, pad), ref["model_in.state_padded"], ref["noise_sample"])
        train = model.flow_loss((cache, pad), ref["model_in.state_padded"], ref["model_in.actions_padded"],
                                ref["noise_train"], ref["time_train"])
    return {"model": model, "embs": embs, "pad": pad, "blocks": blocks, "cache": cache, "sample": sample,
            "train": train}


def close(actual, expected, atol, rtol=0.0):
    diff = (actual - expected).abs().max().item()
    assert torch.allclose(actual, expected, atol=atol, rtol=rtol), f"max diff {diff:.3g} (atol {atol})"
    return diff


def test_architecture_is_read_from_the_tensors_and_meta(ref):
    arch = read_architecture(FOLDER)
    vlm = arch.vlm
    assert (vlm.width, vlm.depth, vlm.mlp_dim, vlm.num_kv_heads, vlm.head_dim) == (64, 2, 128, 1, 16)
    assert (arch.expert.width, arch.expert.mlp_dim) == (48, 96)
    assert (arch.vision.width, arch.vision.num_heads, arch.vision.num_patches, arch.vocab_size) == (32, 4, 256, 1024)
    assert arch.cameras == ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    assert (arch.state_dim, arch.action_dim, arch.chunk_size, arch.num_inference_steps) == (9, 7, 50, 10)


def test_prefix_layout_masks_and_cache(ref, run):
    valid = ref["prefix.pad_mask"]
    assert torch.equal(run["pad"], valid)
    assert torch.equal(torch.cumsum(run["pad"].long(), 1) - 1, ref["prefix.position_ids"])
    assert torch.equal(attention_mask_2d(run["pad"], run["blocks"]), ref["prefix.att_2d"])
    close(run["embs"][valid], ref["prefix.embs"][valid], atol=2e-5)
    for layer, (keys, values) in enumerate(run["cache"]):
        for b in range(2):  # only rows of valid tokens mean anything
            close(keys[b][:, valid[b]], ref[f"kv_cache.layer{layer}.key"][b][:, valid[b]], atol=1e-4)
            close(values[b][:, valid[b]], ref[f"kv_cache.layer{layer}.value"][b][:, valid[b]], atol=1e-4)


def test_flow_ode_matches_every_euler_step_and_the_chunk(ref, run):
    sample = run["sample"]
    times = torch.tensor(run["model"].denoising_times(10), dtype=torch.float32)
    assert torch.equal(times, ref["sample.time"])
    for step in range(10):
        close(sample["v_t"][step], ref["sample.v_t"][step], atol=1e-3, rtol=1e-4)
        close(sample["x_t"][step + 1], ref["sample.x_t"][step + 1], atol=2e-4)
    close(sample["actions"], ref["sample.actions_padded"], atol=2e-4)
    close(sample["actions"][..., :7], ref["policy.predict_action_chunk"], atol=2e-4)


def test_training_loss_at_the_fixture_times(ref, run):
    train = run["train"]
    close(sinusoidal_time_embedding(ref["time_train"], 48, 4e-3, 4.0), ref["train.time_emb"], atol=1e-6)
    close(train["x_t"], ref["train.x_t"], atol=1e-6)
    close(train["v_t"], ref["train.v_t"], atol=1e-3, rtol=1e-4)
    close(train["loss"], ref["train.loss_elementwise_padded"], atol=1e-3)
    close(train["loss"][..., :7].mean(), ref["train.loss_mean"], atol=2e-5)
    close(train["loss"][..., :7].mean(dim=(1, 2)), ref["policy.forward_loss_per_sample"], atol=2e-5)


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_loading_is_strict_naming_the_key(tmp_path, change):
    folder = tmp_path / "pi0"
    shutil.copytree(FOLDER, folder)
    state = load_file(str(folder / "model.safetensors"))
    victim = "model.action_out_proj.bias"
    if change == "missing":
        del state[victim]
    elif change == "unexpected":
        state["model.extra_head.weight"] = torch.zeros(2)
    else:
        state[victim] = torch.zeros(5)
    save_file(state, str(folder / "model.safetensors"))
    named = "model.extra_head.weight"[len("model."):] if change == "unexpected" else victim[len("model."):]
    with pytest.raises(Pi0CheckpointError, match=named.replace(".", r"\.")):
        load_pi0(str(folder))
