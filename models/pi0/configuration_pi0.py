"""The architecture of a LeRobot-format Pi0 checkpoint (what ``config.json`` + the weights say).

LeRobot's ``config.json`` names the sizes only by variant (``paligemma_variant: gemma_2b``,
``action_expert_variant: gemma_300m``) and hard-codes SigLIP-so400m and the vocabulary. The sizes
are therefore read from the tensors themselves (widths, depths, MLP widths, head layout with
LeRobot's fixed 8 query heads, vocabulary, patch size, image tokens); the one size a tensor does
not show, SigLIP's head count, comes from ``meta.json["tiny_architecture"]`` when the folder has
one (tiny test checkpoints) and is otherwise SigLIP-so400m's 16.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
META_FILE = "meta.json"
QUERY_HEADS = 8  # LeRobot's joint attention reshapes with a hard-coded 8 heads
SIGLIP_SO400M_HEADS = 16

VLM = "model.paligemma_with_expert.paligemma.model"
EXPERT = "model.paligemma_with_expert.gemma_expert.model"
VISION = f"{VLM}.vision_tower.vision_model"


@dataclass(frozen=True)
class GemmaSize:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SiglipSize:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    num_patches: int


@dataclass(frozen=True)
class Pi0Architecture:
    vlm: GemmaSize
    expert: GemmaSize
    vision: SiglipSize
    vocab_size: int
    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_inference_steps: int = 10
    image_size: Tuple[int, int] = (224, 224)
    tokenizer_max_length: int = 48
    min_period: float = 4e-3
    max_period: float = 4.0
    # camera feature names in config order (LeRobot: observation.images.<name>)
    cameras: List[str] = field(default_factory=list)
    state_dim: int = 0  # the dataset's real state / action dims (config input/output features)
    action_dim: int = 0
    rms_norm_eps: float = 1e-6
    layer_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


def read_shapes(path: str) -> Dict[str, Tuple[int, ...]]:
    """Tensor name -> shape from a safetensors header (no tensor data is read)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}


def _gemma_size(shapes: Dict[str, Tuple[int, ...]], prefix: str) -> GemmaSize:
    layers = {int(m.group(1)) for k in shapes if (m := re.match(re.escape(prefix) + r"\.layers\.(\d+)\.", k))}
    if not layers:
        raise ValueError(f"no decoder layers under {prefix}.layers.* in the checkpoint")
    first = f"{prefix}.layers.0"
    query, width = shapes[f"{first}.self_attn.q_proj.weight"]
    head_dim = query // QUERY_HEADS
    return GemmaSize(width=width, depth=len(layers), mlp_dim=shapes[f"{first}.mlp.gate_proj.weight"][0],
                     num_heads=QUERY_HEADS, num_kv_heads=shapes[f"{first}.self_attn.k_proj.weight"][0] // head_dim,
                     head_dim=head_dim)


def _siglip_heads(folder: str, width: int) -> int:
    meta_path = os.path.join(folder, META_FILE)
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            tiny = json.load(f).get("tiny_architecture", {})
        if "siglip_vision" in tiny:
            return int(tiny["siglip_vision"]["num_attention_heads"])
    if width % SIGLIP_SO400M_HEADS:
        raise ValueError(f"cannot tell the SigLIP head count of width {width}: add meta.json with "
                         "tiny_architecture.siglip_vision.num_attention_heads beside the checkpoint")
    return SIGLIP_SO400M_HEADS


def _siglip_size(shapes: Dict[str, Tuple[int, ...]], folder: str) -> SiglipSize:
    width, _, patch, _ = shapes[f"{VISION}.embeddings.patch_embedding.weight"]
    layers = {k.split(".encoder.layers.")[1].split(".")[0] for k in shapes if ".encoder.layers." in k and VISION in k}
    depth = len(layers)
    return SiglipSize(width=width, depth=depth, mlp_dim=shapes[f"{VISION}.encoder.layers.0.mlp.fc1.weight"][0],
                      num_heads=_siglip_heads(folder, width), patch_size=patch,
                      num_patches=shapes[f"{VISION}.embeddings.position_embedding.weight"][0])


def _vocab_size(shapes: Dict[str, Tuple[int, ...]]) -> int:
    """The token table's rows: saved as PaliGemma's lm_head or as the (tied) embedding."""
    for key in ("model.paligemma_with_expert.paligemma.lm_head.weight", f"{VLM}.language_model.embed_tokens.weight"):
        if key in shapes:
            return shapes[key][0]
    raise ValueError("the checkpoint holds no token table (paligemma.lm_head or language_model.embed_tokens)")


def _features(config: dict, kind: str) -> Dict[str, dict]:
    return {name: spec for name, spec in (config.get("input_features") or {}).items() if spec.get("type") == kind}


def read_architecture(folder: str) -> Pi0Architecture:
    """The architecture of the LeRobot Pi0 checkpoint in ``folder``."""
    with open(os.path.join(folder, CONFIG_FILE)) as f:
        config = json.load(f)
    if config.get("type") not in ("pi0", None):
        raise ValueError(f"{folder}/config.json is a LeRobot '{config.get('type')}' policy, not 'pi0'")
    shapes = read_shapes(os.path.join(folder, WEIGHTS_FILE))
    state = next(iter(_features(config, "STATE").values()), {"shape": [0]})
    action = next(iter((config.get("output_features") or {}).values()), {"shape": [0]})
    cameras = [name.split(".")[-1] for name in _features(config, "VISUAL")]
    return Pi0Architecture(
        vlm=_gemma_size(shapes, f"{VLM}.language_model"), expert=_gemma_size(shapes, EXPERT),
        vision=_siglip_size(shapes, folder), vocab_size=_vocab_size(shapes),
        chunk_size=int(config.get("chunk_size", 50)), max_state_dim=int(config.get("max_state_dim", 32)),
        max_action_dim=int(config.get("max_action_dim", 32)),
        num_inference_steps=int(config.get("num_inference_steps", 10)),
        image_size=tuple(int(v) for v in config.get("image_resolution", (224, 224))),
        tokenizer_max_length=int(config.get("tokenizer_max_length", 48)),
        min_period=float(config.get("min_period", 4e-3)), max_period=float(config.get("max_period", 4.0)),
        cameras=cameras, state_dim=int(state["shape"][0]), action_dim=int(action["shape"][0]))


# The sizes LeRobot's variant names stand for (its get_gemma_config) and SigLIP-so400m at 224 px
GEMMA_VARIANTS = {
    "gemma_2b": GemmaSize(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
}
SIGLIP_SO400M = SiglipSize(width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14, num_patches=256)


def pi0_base_architecture(state_dim: int = 0, action_dim: int = 0) -> Pi0Architecture:
    """The released Pi0's shape (PaliGemma 3B + a 300M expert, three cameras), for plans made
    without the checkpoint at hand."""
    return Pi0Architecture(vlm=GEMMA_VARIANTS["gemma_2b"], expert=GEMMA_VARIANTS["gemma_300m"], vision=SIGLIP_SO400M,
                           vocab_size=257152, cameras=["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"],
                           state_dim=state_dim, action_dim=action_dim)
