"""Tiny random-init OpenVLA checkpoints in the official on-disk format, for tests and smoke runs.

``make_tiny_openvla(folder)`` writes ``config.json`` (with ``norm_stats``), ``vision_overrides.json``,
``model.safetensors`` and ``preprocessor_config.json`` using the same tiny sizes as the golden
fixtures (DINOv2 48/3/2, SigLIP 32/3/2, Llama 48 wide, 2 layers, vocabulary 32064), so
:func:`~models.openvla.modeling_openvla.load_openvla` loads it back through the real loader.
No test downloads weights (LeRobot style).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict

import torch
from safetensors.torch import save_file

from .configuration_openvla import DINOV2_REG4_ID, SIGLIP_224_ID, VISION_OVERRIDES_FILE, OpenVLAConfig
from .modeling_openvla import OpenVLAModel

TINY_VISION = {DINOV2_REG4_ID: {"embed_dim": 48, "depth": 3, "num_heads": 2},
               SIGLIP_224_ID: {"embed_dim": 32, "depth": 3, "num_heads": 2}}
TINY_TEXT = {
    "model_type": "llama", "vocab_size": 32064, "hidden_size": 48, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 3, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 32000, "torch_dtype": "float32",
}


def _norm_stats(action_dim: int, generator: torch.Generator) -> Dict[str, Any]:
    """Plausible per-dimension action statistics; the last dimension is an un-normalised gripper."""
    low = (-0.2 - 0.8 * torch.rand(action_dim, generator=generator, dtype=torch.float64)).tolist()
    high = (0.2 + 0.8 * torch.rand(action_dim, generator=generator, dtype=torch.float64)).tolist()
    mask = [True] * action_dim
    mask[-1] = action_dim == 1  # gripper passes through, as in the released bridge statistics
    action = {"mask": mask, "q01": low, "q99": high, "min": [v - 0.1 for v in low], "max": [v + 0.1 for v in high],
              "mean": [(a + b) / 2 for a, b in zip(low, high)], "std": [(b - a) / 4 for a, b in zip(low, high)]}
    zeros = [0.0] * action_dim
    proprio = {k: zeros for k in ("mean", "std", "min", "max", "q01", "q99")}
    return {"action": action, "proprio": proprio, "num_trajectories": 1, "num_transitions": 1}


def tiny_config_dict(action_dim: int = 7, unnorm_key: str = "tiny", seed: int = 0,
                     image_size: int = 224) -> Dict[str, Any]:
    """The ``config.json`` contents of a tiny OpenVLA (official field names); ``image_size`` is
    the side both ViTs take (224 as released; smaller sizes give fewer patches, each 14 px)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "model_type": "openvla", "architectures": ["OpenVLAForActionPrediction"],
        "vision_backbone_id": "dinosiglip-vit-so-224px", "llm_backbone_id": "llama2-7b-pure",
        "arch_specifier": "no-align+fused-gelu-mlp", "use_fused_vision_backbone": True,
        "image_resize_strategy": "resize-naive", "image_sizes": [image_size, image_size],
        "timm_model_ids": [DINOV2_REG4_ID, SIGLIP_224_ID], "timm_override_act_layers": [None, None],
        "hf_llm_id": "meta-llama/Llama-2-7b-hf", "llm_max_length": 2048,
        "pad_token_id": 32000, "pad_to_multiple_of": 64, "n_action_bins": 256, "torch_dtype": "float32",
        "norm_stats": {unnorm_key: _norm_stats(action_dim, generator)},
        "text_config": dict(TINY_TEXT),
    }


# the Llama-2-7B language model of the released OpenVLA-7B
LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32}


def openvla_7b_config_dict(action_dim: int = 7, unnorm_key: str = "tiny") -> Dict[str, Any]:
    """A ``config.json`` of the OpenVLA-7B shape (full-size ViTs follow from the timm ids; the
    LLM is Llama-2-7B), for random-weight checks and memory plans without the real checkpoint."""
    raw = tiny_config_dict(action_dim=action_dim, unnorm_key=unnorm_key)
    raw["text_config"] = {**raw["text_config"], **LLAMA2_7B}
    return raw


def tiny_vision_overrides() -> Dict[str, Any]:
    """The ``vision_overrides.json`` that shrinks the ViTs of :func:`tiny_config_dict`'s config."""
    return {"note": "tiny ViT sizes (timm.create_model extra kwargs)", "timm_create_model_extra_kwargs": TINY_VISION}


def tiny_config(action_dim: int = 7, unnorm_key: str = "tiny", image_size: int = 224) -> OpenVLAConfig:
    """The tiny model's architecture (tiny LLM and tiny ViTs), as ``make_tiny_openvla`` saves it."""
    return OpenVLAConfig.from_dict(tiny_config_dict(action_dim, unnorm_key, image_size=image_size),
                                   tiny_vision_overrides())


def tiny_preprocessor_dict(image_size: int = 224) -> Dict[str, Any]:
    """``preprocessor_config.json`` of the fused backbone (bicubic, ImageNet / SigLIP stats)."""
    return {
        "image_processor_type": "PrismaticImageProcessor", "image_resize_strategy": "resize-naive",
        "input_sizes": [[3, image_size, image_size], [3, image_size, image_size]],
        "interpolations": ["bicubic", "bicubic"],
        "means": [[0.485, 0.456, 0.406], [0.5, 0.5, 0.5]], "stds": [[0.229, 0.224, 0.225], [0.5, 0.5, 0.5]],
        "use_fused_vision_backbone": True,
    }


@torch.no_grad()
def _init_weights(model: OpenVLAModel, generator: torch.Generator) -> None:
    """Well-conditioned random weights (the default init's LayerScale 1e-5 and zero position
    embeddings make a nearly image-blind network, which would hide bugs in tests)."""
    for name, param in model.named_parameters():
        if name.endswith("scale_factor"):
            param.uniform_(0.25, 1.0, generator=generator)
        elif param.dim() == 1 and "norm" in name:
            param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
        elif param.dim() == 1:
            param.copy_(0.05 * torch.randn(param.shape, generator=generator))
        elif name.endswith(("pos_embed", "cls_token", "reg_token", "latent", "embed_tokens.weight")):
            param.copy_(0.5 * torch.randn(param.shape, generator=generator))
        else:
            fan_in = math.prod(param.shape[1:])
            param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))


def make_tiny_openvla(folder: str, seed: int = 0, action_dim: int = 7, unnorm_key: str = "tiny",
                      image_size: int = 224) -> str:
    """Build a tiny random OpenVLA and save it to ``folder`` in the official format; returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    raw = tiny_config_dict(action_dim, unnorm_key, seed, image_size)
    overrides = tiny_vision_overrides()
    model = OpenVLAModel(OpenVLAConfig.from_dict(raw, overrides))
    _init_weights(model, torch.Generator().manual_seed(seed + 12345))
    files = {"config.json": raw, VISION_OVERRIDES_FILE: overrides,
             "preprocessor_config.json": tiny_preprocessor_dict(image_size)}
    for name, content in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f, indent=2)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return folder
