"""Native OpenVLA (DINOv2+SigLIP -> projector -> Llama-2) loading official checkpoints as-is.

No ``trust_remote_code`` and no timm: parameter names equal the released safetensors keys, so
``load_openvla(folder)`` loads them strictly.  Not registered as a policy yet (no value head).
"""

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

OpenVLAForActionPrediction = OpenVLAModel  # the official class name, for familiarity

__all__ = [
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
