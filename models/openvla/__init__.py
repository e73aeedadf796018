"""Native OpenVLA (DINOv2+SigLIP -> projector -> Llama-2) loading official checkpoints as-is.

No ``trust_remote_code`` and no timm: parameter names equal the released safetensors keys, so
``load_openvla(folder)`` loads them strictly. ``OpenVLAPolicy`` adds the RL side (value head,
sampling restricted to action tokens, LoRA); ``configuration_policy.OpenVLAPolicyConfig`` is the
family's config (``model.name: openvla``).

The names below are imported on first use: reading the family's config (every run does, to
type-check its YAML) must not import torch models and transformers.
"""

import importlib

_EXPORTS = {
    "configuration_openvla": ("OpenVLAConfig", "ViTConfig", "vit_config_for"),
    "configuration_policy": ("OpenVLAPolicyConfig",),
    "modeling_openvla": ("OpenVLACheckpointError", "OpenVLAModel", "OpenVLAOutput", "check_state_dict",
                         "load_openvla", "read_openvla_state_dict"),
    "action_tokenizer": ("ActionTokenizer", "get_action_stats"),
    "processing_openvla": ("OpenVLAImageProcessor", "OpenVLAProcessor", "build_prompt", "left_pad_batch",
                           "prepare_prompt_ids"),
    "policy_openvla": ("OpenVLAPolicy", "build_openvla_policy"),
    "tiny": ("make_tiny_openvla",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
_ALIASES = {"OpenVLAForActionPrediction": "OpenVLAModel"}  # the official class name, for familiarity

__all__ = sorted([*_MODULE_OF, *_ALIASES])


def __getattr__(name):
    target = _ALIASES.get(name, name)
    if target not in _MODULE_OF:
        raise AttributeError(f"module 'models.openvla' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[target]}"), target)
