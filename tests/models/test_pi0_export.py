"""A trained Pi0 exported in LeRobot's policy layout: it loads back through our LeRobot-checkpoint
loader and acts as the trained policy did (its weights, its statistics, LoRA merged), and its files
are those LeRobot's own code wrote for the reference fixture, field by field."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import FIXTURES, reference_fixture
from safetensors import safe_open
from safetensors.torch import load_file

from embodied_async.contracts import EnvSpec
from embodied_async.export import ExportRequest
from models.pi0.configuration_pi0 import read_shapes
from models.pi0.configuration_policy import Pi0PolicyConfig
from models.pi0.export import export_pi0
from models.pi0.policy_pi0 import build_pi0_policy

FIXTURE = os.path.join(FIXTURES, "pi0_tiny_lerobot")
FIXTURE_TEST_DATA = {"expected.npz", "inputs.npz", "meta.json", "README.md"}
STATE_DIM, ACTION_DIM, EXECUTED = 8, 7, 5


@pytest.fixture(scope="module", autouse=True)
def pi0_fixture():
    return reference_fixture("pi0_tiny_lerobot")


def env_spec():
    return EnvSpec(obs_shapes={"states": (STATE_DIM,), "main_images": (64, 64, 3), "wrist_images": (48, 64, 3)},
                   obs_dtypes={"states": "float32", "main_images": "uint8", "wrist_images": "uint8"},
                   action_dim=ACTION_DIM, num_action_chunks=EXECUTED)


def config(path, **changes):
    return Pi0PolicyConfig(path=str(path), tokenizer="words", value_head_hidden_sizes=[16], tiny_image_size=112,
                           **changes)


def observations(batch=2, seed=0):
    rng = np.random.default_rng(seed)
    return {"main_images": rng.integers(0, 256, (batch, 64, 64, 3), dtype=np.uint8),
            "wrist_images": rng.integers(0, 256, (batch, 48, 64, 3), dtype=np.uint8),
            "states": rng.normal(size=(batch, STATE_DIM)).astype(np.float32),
            "task_descriptions": ["push the cube"] * batch}


def trained_policy(tmp_path, lora_rank=0):
    """A tiny Pi0 whose weights and statistics moved away from its base checkpoint's, as training
    moves them (3 denoising steps where the base says 4)."""
    cfg = config(tmp_path / "base", tiny_random_init=True, num_steps=3)
    cfg.lora.enabled, cfg.lora.rank = lora_rank > 0, lora_rank or cfg.lora.rank
    torch.manual_seed(0)
    policy = build_pi0_policy(cfg, env_spec()).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            scale = 0.1 if "lora_B" in name else 0.02  # adapters start as a no-op (B = 0): make them matter
            param.add_(scale * torch.randn(param.shape, generator=gen))
    rng = np.random.default_rng(2)
    policy.set_input_statistics({
        "states": {"mean": rng.normal(size=STATE_DIM), "std": rng.uniform(0.5, 2.0, STATE_DIM)},
        "actions": {"mean": rng.normal(size=ACTION_DIM), "std": rng.uniform(0.5, 2.0, ACTION_DIM)}})
    return cfg, policy


def eval_actions(policy, seed=5):
    torch.manual_seed(seed)  # the same starting noise for every policy asked
    return policy.predict(observations(), mode="eval").actions


def export(tmp_path, cfg, policy):
    folder = tmp_path / "export"
    folder.mkdir()
    result = export_pi0(ExportRequest(policy=policy, model_cfg=cfg, base_folder=cfg.path, folder=str(folder),
                                      stats_key="", dataset_stats=None, env_spec=env_spec()))
    return str(folder), result


@pytest.fixture(scope="module")
def plain_export(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("plain")
    cfg, policy = trained_policy(tmp_path)
    before = eval_actions(policy)
    folder, result = export(tmp_path, cfg, policy)
    return cfg, policy, before, folder, result


def test_the_export_loads_through_our_lerobot_loader_and_acts_as_the_trained_policy(plain_export):
    cfg, policy, before, folder, result = plain_export
    loaded = build_pi0_policy(config(folder, camera_keys=policy.camera_keys), env_spec()).eval()
    assert loaded.settings.steps == 3 and loaded.settings.executed_actions == EXECUTED
    torch.testing.assert_close(eval_actions(loaded), before, atol=1e-5, rtol=0)
    for key, value in policy.normalization.stats.items():  # the trained statistics, not the base's
        torch.testing.assert_close(loaded.normalization.stats[key].float(), value.float(), atol=0, rtol=0)
    base = build_pi0_policy(config(cfg.path, num_steps=3, camera_keys=policy.camera_keys), env_spec()).eval()
    assert (eval_actions(base) - before).abs().max() > 1e-2  # the base acts otherwise: nothing was copied
    assert "PI0Policy.from_pretrained" in result.load_with and "make_pre_post_processors" in result.load_with
    assert any("value_head" in note for note in result.notes)


def _structure(value):
    """A JSON value's shape: dicts by key, lists by their first item, scalars by type (None kept apart)."""
    if isinstance(value, dict):
        return {key: _structure(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_structure(value[0])] if value else []
    return type(value).__name__


def _read(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def test_the_files_and_config_fields_are_those_lerobot_wrote_for_the_fixture(plain_export):
    *_, folder, _ = plain_export
    assert set(os.listdir(folder)) - {"meta.json"} == set(os.listdir(FIXTURE)) - FIXTURE_TEST_DATA
    ours, lerobot = _read(folder, "config.json"), _read(FIXTURE, "config.json")
    assert list(ours) == list(lerobot)  # the same fields, in LeRobot's order
    assert {k: _structure(v) for k, v in ours.items() if k not in ("input_features",)} == \
        {k: _structure(v) for k, v in lerobot.items() if k not in ("input_features",)}
    feature = _structure(lerobot["input_features"]["observation.state"])
    assert all(_structure(spec) == feature for spec in ours["input_features"].values())
    assert list(ours["input_features"]) == ["observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb",
                                            "observation.state"]
    assert ours["input_features"]["observation.state"]["shape"] == [STATE_DIM]
    assert ours["output_features"]["action"]["shape"] == [ACTION_DIM]
    assert (ours["n_action_steps"], ours["num_inference_steps"], ours["image_resolution"]) == (EXECUTED, 3, [112, 112])
    assert ours["use_peft"] is False and ours["type"] == "pi0"


def test_the_processor_files_have_lerobots_steps_fields_and_statistics_keys(plain_export):
    _, policy, _, folder, _ = plain_export
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        ours, lerobot = _read(folder, name), _read(FIXTURE, name)
        assert ours["name"] == lerobot["name"] and len(ours["steps"]) == len(lerobot["steps"])
        for step, reference in zip(ours["steps"], lerobot["steps"]):
            assert list(step) == list(reference) and step["registry_name"] == reference["registry_name"]
            assert list(step["config"]) == list(reference["config"]) and step.get("state_file") == \
                reference.get("state_file")
            if "features" in step["config"]:
                kinds = [spec["type"] for spec in step["config"]["features"].values()]
                assert set(kinds) == {spec["type"] for spec in reference["config"]["features"].values()}
                assert step["config"]["norm_map"] == reference["config"]["norm_map"]
    for name in [f for f in os.listdir(FIXTURE) if f.endswith("processor.safetensors")]:
        ours, lerobot = load_file(os.path.join(folder, name)), load_file(os.path.join(FIXTURE, name))
        assert sorted(ours) == sorted(lerobot) and all(v.dtype == torch.float32 for v in ours.values())
        for key, value in ours.items():
            assert torch.equal(value, policy.normalization.stats[key].float())


def test_the_weights_have_lerobots_names_and_the_bases_shapes_and_dtype(plain_export):
    cfg, *_, folder, _ = plain_export
    path = os.path.join(folder, "model.safetensors")
    ours, base = read_shapes(path), read_shapes(os.path.join(cfg.path, "model.safetensors"))
    assert sorted(ours) == sorted(read_shapes(os.path.join(FIXTURE, "model.safetensors")))
    assert ours == base
    with safe_open(path, framework="pt") as f, safe_open(os.path.join(FIXTURE, "model.safetensors"), "pt") as ref:
        assert f.metadata() == ref.metadata()  # the tied token embedding named as transformers saves it
        assert {f.get_slice(key).get_dtype() for key in f.keys()} == {"F32"}
    assert not any(key.startswith(("value_head", "noise_head")) or "statistics" in key for key in ours)


def test_a_lora_policy_exports_merged_and_acts_as_before(tmp_path):
    cfg, policy = trained_policy(tmp_path, lora_rank=4)
    assert any("lora_B" in name for name, _ in policy.named_parameters())
    before = eval_actions(policy)
    folder, result = export(tmp_path, cfg, policy)
    assert not any("lora_" in key for key in read_shapes(os.path.join(folder, "model.safetensors")))
    assert not any("lora_" in name for name, _ in policy.named_parameters())  # merged in place
    merged = eval_actions(policy)
    # W x + B A x and (W + B A) x round differently in float32 (in float64 the two agree exactly);
    # the random tiny network amplifies that to 1e-4..6e-4 in the actions (with the machine's
    # threads and rounding); the adapters themselves move the actions by far more (trained_policy)
    torch.testing.assert_close(merged, before, atol=2e-3, rtol=0)
    loaded = build_pi0_policy(config(folder, camera_keys=policy.camera_keys), env_spec()).eval()
    torch.testing.assert_close(eval_actions(loaded), merged, atol=1e-5, rtol=0)
    assert any("LoRA adapters merged" in note for note in result.notes)
    assert _read(folder, "config.json")["use_peft"] is False


def test_the_family_config_names_this_exporter():
    import importlib

    module, name = Pi0PolicyConfig.exporter.split(":")
    assert getattr(importlib.import_module(module), name) is export_pi0
