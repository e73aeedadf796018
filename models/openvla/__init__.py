"""Native OpenVLA (DINOv2+SigLIP -> projector -> Llama-2) loading official checkpoints as-is.

No ``trust_remote_code`` and no timm: parameter names equal the released safetensors keys, so
``load_openvla(folder)`` loads them strictly. ``OpenVLAPolicy`` adds the RL side (value head,
sampling restricted to action tokens, LoRA) and is registered as model ``openvla``.
"""

from embodied_async.registry import register_model

from .configuration_openvla import OpenVLAConfig, ViTConfig, vit_config_for
from .modeling_openvla import (
    OpenVLACheckpointError,
    OpenVLAModel,
    OpenVLAOutput,
    check_state_dict,
    load_openvla,
    read_openvla_state_dict,
)

from .action_tokenizer import ActionTokenizer, get_action_stats
from .processing_openvla import OpenVLAImageProcessor, OpenVLAProcessor, build_prompt, left_pad_batch, prepare_prompt_ids

from .policy_openvla import OpenVLAPolicy, build_openvla_policy
from .tiny import make_tiny_openvla

register_model("openvla", module="models.openvla")(build_openvla_policy)

OpenVLAForActionPrediction = OpenVLAModel  # the official class name, for familiarity

__all__ = [
    "OpenVLAPolicy",
    "build_openvla_policy",
    "make_tiny_openvla",
    "ActionTokenizer",
    "OpenVLAImageProcessor",
    "OpenVLAProcessor",
    "build_prompt",
    "get_action_stats",
    "left_pad_batch",
    "prepare_prompt_ids",
    "OpenVLACheckpointError",
    "OpenVLAConfig",
    "OpenVLAForActionPrediction",
    "OpenVLAModel",
    "OpenVLAOutput",
    "ViTConfig",
    "check_state_dict",
    "load_openvla",
    "read_openvla_state_dict",
    "vit_config_for",
]
