"""A tiny random-init Pi0 written in LeRobot's checkpoint format (config.json, model.safetensors with
LeRobot's key names, meta.json with the sizes config.json cannot hold, identity normalisation
statistics), for CPU runs and tests: loaded back through the same loader a real checkpoint takes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Sequence

import torch
from safetensors.torch import save_file

from .configuration_pi0 import CONFIG_FILE, META_FILE, WEIGHTS_FILE, GemmaSize, Pi0Architecture, SiglipSize
from .modeling_pi0 import TIED_EMBEDDING, UNUSED_KEYS, Pi0Model
from .processing_pi0 import (
    ACTION_KEY,
    NORMALIZER_FILE,
    POSTPROCESSOR_FILE,
    PREPROCESSOR_FILE,
    STATE_KEY,
    UNNORMALIZER_FILE,
    lerobot_pipelines,
)

TINY_VLM = GemmaSize(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
TINY_EXPERT = GemmaSize(width=48, depth=2, mlp_dim=96, num_heads=8, num_kv_heads=1, head_dim=16)
TINY_VISION = SiglipSize(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=14, num_patches=256)


def tiny_architecture(state_dim: int, action_dim: int, cameras: Sequence[str], chunk_size: int = 10,
                      num_steps: int = 4, image_size: int = 224) -> Pi0Architecture:
    """The tiny shape; ``image_size`` is the side of the images its SigLIP takes (224 as released,
    fewer 14 px patches below)."""
    vision = dataclasses.replace(TINY_VISION, num_patches=(image_size // TINY_VISION.patch_size) ** 2)
    return Pi0Architecture(vlm=TINY_VLM, expert=TINY_EXPERT, vision=vision, vocab_size=1024, chunk_size=chunk_size,
                           num_inference_steps=num_steps, cameras=list(cameras), state_dim=state_dim,
                           action_dim=action_dim, image_size=(image_size, image_size))


def _init(model: Pi0Model, generator: torch.Generator) -> None:
    """The values the LeRobot fixture was made with: embeddings 0.5 z, norm weights 1 + 0.2 z,
    biases 0.1 z, other weights z / sqrt(fan_in)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            z = torch.randn(param.shape, generator=generator)
            if name.endswith("lm_head.weight") or "position_embedding" in name:
                param.copy_(0.5 * z)
            elif name.endswith("bias"):
                param.copy_(0.1 * z)
            elif "norm" in name.rsplit(".", 2)[-2]:
                param.copy_(1 + 0.2 * z)
            else:
                param.copy_(z / math.sqrt(math.prod(param.shape[1:])))


def _features(arch: Pi0Architecture) -> dict:
    visual = {f"observation.images.{camera}": {"type": "VISUAL", "shape": [3, *arch.image_size]}
              for camera in arch.cameras}
    return {**visual, STATE_KEY: {"type": "STATE", "shape": [arch.state_dim]}}


def make_tiny_pi0(folder: str, state_dim: int, action_dim: int, cameras: Sequence[str] = ("base_0_rgb",),
                  chunk_size: int = 10, num_steps: int = 4, seed: int = 0, image_size: int = 224) -> str:
    """Write the tiny checkpoint into ``folder``; returns ``folder``."""
    arch = tiny_architecture(state_dim, action_dim, cameras, chunk_size, num_steps, image_size)
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # leaves the caller's RNG as it was
        torch.manual_seed(seed)
        model = Pi0Model(arch)
        _init(model, torch.Generator().manual_seed(seed + 12345))
    os.makedirs(folder, exist_ok=True)
    state = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    state[UNUSED_KEYS[0]] = torch.zeros(arch.vocab_size, arch.expert.width)  # LeRobot's orphan, kept for format
    save_file(state, os.path.join(folder, WEIGHTS_FILE), metadata={TIED_EMBEDDING[0]: TIED_EMBEDDING[1]})
    config = {"type": "pi0", "n_obs_steps": 1, "input_features": _features(arch),
              "output_features": {ACTION_KEY: {"type": "ACTION", "shape": [action_dim]}},
              "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m", "dtype": "float32",
              "chunk_size": chunk_size, "n_action_steps": chunk_size, "max_state_dim": arch.max_state_dim,
              "max_action_dim": arch.max_action_dim, "num_inference_steps": num_steps,
              "image_resolution": list(arch.image_size), "tokenizer_max_length": arch.tokenizer_max_length,
              "min_period": arch.min_period, "max_period": arch.max_period}
    meta = {"tiny_architecture": {"config_json_variant_names_are_NOT_the_sizes": True,
                                  "siglip_vision": {"num_attention_heads": TINY_VISION.num_heads}}}
    preprocessor, postprocessor = lerobot_pipelines(_features(arch), config["output_features"],
                                                    arch.tokenizer_max_length)
    for name, content in ((CONFIG_FILE, config), (META_FILE, meta), (PREPROCESSOR_FILE, preprocessor),
                          (POSTPROCESSOR_FILE, postprocessor)):
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f, indent=2)
    identity = {f"{STATE_KEY}.mean": torch.zeros(state_dim), f"{STATE_KEY}.std": torch.ones(state_dim),
                f"{ACTION_KEY}.mean": torch.zeros(action_dim), f"{ACTION_KEY}.std": torch.ones(action_dim)}
    save_file(identity, os.path.join(folder, NORMALIZER_FILE))
    save_file(identity, os.path.join(folder, UNNORMALIZER_FILE))
    return folder
