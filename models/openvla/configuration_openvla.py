"""OpenVLA configuration read from an official ``config.json`` (no ``trust_remote_code``).

The official checkpoints describe the vision towers only through timm model ids; the ViT
hyper-parameters are derived here from a small table of the known ids.  An optional
``vision_overrides.json`` beside ``config.json`` (as written by the tiny golden fixtures)
overrides width / depth / heads so that shrunken models of the same family can be built.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional

from transformers import LlamaConfig

DINOV2_REG4_ID = "vit_large_patch14_reg4_dinov2.lvd142m"
SIGLIP_224_ID = "vit_so400m_patch14_siglip_224"
SIGLIP_384_ID = "vit_so400m_patch14_siglip_384"

# SigLIP-so400m's MLP width is 4304 for width 1152; timm expresses it as mlp_ratio 3.7362.
SIGLIP_MLP_RATIO = 3.7362

SUPPORTED_VISION_BACKBONES = ("dinosiglip-vit-so-224px", "dinosiglip-vit-so-384px")
SUPPORTED_LLM_BACKBONES = ("llama2-7b-pure", "llama2-13b-pure", "llama2-7b-chat", "llama2-13b-chat")
SUPPORTED_ARCH_SPECIFIERS = ("no-align+fused-gelu-mlp",)
DATASET_STATISTICS_FILE = "dataset_statistics.json"
VISION_OVERRIDES_FILE = "vision_overrides.json"


@dataclasses.dataclass
class ViTConfig:
    """Hyper-parameters of one timm-style ViT featurizer (only what OpenVLA uses)."""

    timm_id: str
    embed_dim: int
    depth: int
    num_heads: int
    mlp_hidden: int
    img_size: int = 224
    patch_size: int = 14
    class_token: bool = False
    reg_tokens: int = 0
    layer_scale: bool = False
    attn_pool: bool = False  # SigLIP MAP head: present in checkpoints, unused by OpenVLA
    norm_eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.reg_tokens


def _mlp_hidden(timm_id: str, width: int) -> int:
    # DINOv2 uses ratio 4; SigLIP-so400m uses int(width * 3.7362) (timm's rule).
    return int(width * SIGLIP_MLP_RATIO) if "siglip" in timm_id else 4 * width


def vit_config_for(timm_id: str, img_size: int, overrides: Optional[Dict[str, int]] = None) -> ViTConfig:
    """Resolve a known timm id (+ optional embed_dim/depth/num_heads overrides) to a ViTConfig."""
    if timm_id == DINOV2_REG4_ID:
        base = dict(embed_dim=1024, depth=24, num_heads=16, class_token=True, reg_tokens=4, layer_scale=True)
    elif timm_id in (SIGLIP_224_ID, SIGLIP_384_ID):
        base = dict(embed_dim=1152, depth=27, num_heads=16, attn_pool=True)
    else:
        raise ValueError(
            f"timm_model_ids: unsupported id {timm_id!r}; supported: "
            f"{[DINOV2_REG4_ID, SIGLIP_224_ID, SIGLIP_384_ID]}"
        )
    for key in ("embed_dim", "depth", "num_heads"):
        if overrides and key in overrides:
            base[key] = int(overrides[key])
    return ViTConfig(timm_id=timm_id, mlp_hidden=_mlp_hidden(timm_id, base["embed_dim"]), img_size=img_size, **base)


def _llama_config(text_config: Dict[str, Any]) -> LlamaConfig:
    cfg = dict(text_config)
    cfg.pop("model_type", None)
    # transformers 5 renamed torch_dtype -> dtype; keep the value without the deprecation warning.
    if "torch_dtype" in cfg:
        cfg.setdefault("dtype", cfg.pop("torch_dtype"))
    return LlamaConfig(**cfg)


@dataclasses.dataclass
class OpenVLAConfig:
    """The fields of the official OpenVLA ``config.json`` that define the model.

    ``featurizer`` / ``fused_featurizer`` are the resolved ViT hyper-parameters
    (DINOv2-reg4 and SigLIP for the released ``dinosiglip`` backbones).
    """

    vision_backbone_id: str
    llm_backbone_id: str
    arch_specifier: str
    use_fused_vision_backbone: bool
    image_resize_strategy: str
    image_sizes: List[int]
    timm_model_ids: List[str]
    timm_override_act_layers: List[Optional[str]]
    text_config: LlamaConfig
    pad_token_id: int = 32000
    pad_to_multiple_of: int = 64
    n_action_bins: int = 256
    norm_stats: Optional[Dict[str, Any]] = None
    featurizer: Optional[ViTConfig] = None
    fused_featurizer: Optional[ViTConfig] = None

    @classmethod
    def from_dict(cls, raw: Dict[str, Any], vision_overrides: Optional[Dict[str, Any]] = None) -> "OpenVLAConfig":
        """Build from the parsed ``config.json`` dict (+ parsed ``vision_overrides.json``)."""
        for key in ("vision_backbone_id", "llm_backbone_id", "arch_specifier", "timm_model_ids", "text_config"):
            if key not in raw:
                raise ValueError(f"OpenVLA config is missing required key {key!r}")
        _check("vision_backbone_id", raw["vision_backbone_id"], SUPPORTED_VISION_BACKBONES)
        _check("llm_backbone_id", raw["llm_backbone_id"], SUPPORTED_LLM_BACKBONES)
        _check("arch_specifier", raw["arch_specifier"], SUPPORTED_ARCH_SPECIFIERS)
        fused = bool(raw.get("use_fused_vision_backbone", True))
        if not fused:
            raise ValueError("use_fused_vision_backbone: only True (dinosiglip) is supported")
        timm_ids = list(raw["timm_model_ids"])
        if len(timm_ids) != 2:
            raise ValueError(f"timm_model_ids: expected 2 ids for a fused backbone, got {timm_ids}")
        acts = list(raw.get("timm_override_act_layers", [None, None]))
        if any(a is not None for a in acts):
            raise ValueError(f"timm_override_act_layers: only [None, None] is supported, got {acts}")
        default_size = 384 if raw["vision_backbone_id"].endswith("384px") else 224
        sizes = list(raw.get("image_sizes", [default_size, default_size]))
        extra = (vision_overrides or {}).get("timm_create_model_extra_kwargs", {})
        vits = [vit_config_for(t, int(s), extra.get(t)) for t, s in zip(timm_ids, sizes)]
        return cls(
            vision_backbone_id=raw["vision_backbone_id"],
            llm_backbone_id=raw["llm_backbone_id"],
            arch_specifier=raw["arch_specifier"],
            use_fused_vision_backbone=fused,
            image_resize_strategy=raw.get("image_resize_strategy", "resize-naive"),
            image_sizes=sizes,
            timm_model_ids=timm_ids,
            timm_override_act_layers=acts,
            text_config=_llama_config(raw["text_config"]),
            pad_token_id=int(raw.get("pad_token_id", 32000)),
            pad_to_multiple_of=int(raw.get("pad_to_multiple_of", 64)),
            n_action_bins=int(raw.get("n_action_bins", 256)),
            norm_stats=raw.get("norm_stats"),
            featurizer=vits[0],
            fused_featurizer=vits[1],
        )

    @classmethod
    def from_json_file(cls, path: str) -> "OpenVLAConfig":
        """Read ``config.json`` at ``path``; picks up ``vision_overrides.json`` from the same folder."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"OpenVLA config not found: {path} (expected an official config.json)")
        with open(path) as f:
            raw = json.load(f)
        overrides_path = os.path.join(os.path.dirname(path), VISION_OVERRIDES_FILE)
        overrides = None
        if os.path.isfile(overrides_path):
            with open(overrides_path) as f:
                overrides = json.load(f)
        return cls.from_dict(raw, overrides)

    @classmethod
    def from_pretrained(cls, folder: str) -> "OpenVLAConfig":
        """Read ``folder/config.json`` (+ optional ``folder/vision_overrides.json``).

        A fine-tuned checkpoint ships the action statistics of its own dataset in
        ``dataset_statistics.json`` (the official fine-tuning script writes it; its config.json
        keeps the pre-training ones): its entries are merged into ``norm_stats`` and win over
        entries of the same name.
        """
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"OpenVLA checkpoint folder not found: {folder} (expected config.json + *.safetensors)"
            )
        config = cls.from_json_file(os.path.join(folder, "config.json"))
        statistics_path = os.path.join(folder, DATASET_STATISTICS_FILE)
        if os.path.isfile(statistics_path):
            with open(statistics_path) as f:
                statistics = json.load(f)
            if not isinstance(statistics, dict):
                raise ValueError(f"{statistics_path}: expected an object of dataset name -> statistics")
            config.norm_stats = {**(config.norm_stats or {}), **statistics}
        return config

    @property
    def vocab_size(self) -> int:
        return int(self.text_config.vocab_size)


def _check(key: str, value: Any, supported) -> None:
    if value not in supported:
        raise ValueError(f"{key}: unsupported value {value!r}; supported: {list(supported)}")
