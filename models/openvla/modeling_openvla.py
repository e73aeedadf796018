"""Native OpenVLA (Prismatic DINOv2+SigLIP -> MLP projector -> Llama-2) without trust_remote_code.

Parameter names equal the official checkpoints' (``vision_backbone.featurizer.blocks.0.attn.qkv.weight``,
``projector.fc1.weight``, ``language_model.model.layers.0.self_attn.q_proj.weight`` ...), so their
safetensors load strictly without renaming.  The ViTs mirror timm's ``VisionTransformer`` layout
(timm itself is not importable next to this CPU torch); the LLM is transformers' ``LlamaForCausalLM``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from safetensors import safe_open
from torch import nn
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from .configuration_openvla import OpenVLAConfig, ViTConfig
from .processing_openvla import left_pad_batch, prepare_prompt_ids

# Llama-2 id of the bare "▁" piece that follows "Out:" in training prompts; predict_action re-adds it.
IGNORE_INDEX = -100

# ----------------------------------------------------------------------------- vision towers


class Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection (timm layout)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"ViT width {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    """fc1 -> exact GELU -> fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class LayerScale(nn.Module):
    """Per-channel residual scale.  Named ``scale_factor`` (not timm's ``gamma``) because the
    OpenVLA reference renames it so HF's loader does not mangle ``gamma`` keys."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale_factor = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale_factor


class Block(nn.Module):
    """Pre-norm transformer block, optional LayerScale on both residual branches."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        d = cfg.embed_dim
        self.norm1 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.attn = Attention(d, cfg.num_heads)
        self.ls1 = LayerScale(d) if cfg.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.mlp = Mlp(d, cfg.mlp_hidden)
        self.ls2 = LayerScale(d) if cfg.layer_scale else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class AttentionPoolLatent(nn.Module):
    """SigLIP MAP head.  Kept so checkpoints load strictly; OpenVLA never calls it."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        d = cfg.embed_dim
        self.num_heads = cfg.num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, d))
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.mlp = Mlp(d, cfg.mlp_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(self.latent.expand(b, -1, -1)).reshape(b, -1, h, c // h).transpose(1, 2)
        k, v = self.kv(x).reshape(b, n, 2, h, c // h).permute(2, 0, 3, 1, 4)
        out = self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, c))
        return (out + self.mlp(self.norm(out)))[:, 0]


class VisionTransformer(nn.Module):
    """timm-style ViT exposing OpenVLA's featurizer output via :meth:`forward`."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.embed_dim
        # timm's PatchEmbed holds only ``proj``; a ModuleDict reproduces the key names.
        conv = nn.Conv2d(3, d, kernel_size=cfg.patch_size, stride=cfg.patch_size, bias=True)
        self.patch_embed = nn.ModuleDict({"proj": conv})
        if cfg.class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        if cfg.reg_tokens:
            self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, d))
        # Position embeddings cover patches only ("no_embed_class" for DINOv2; SigLIP has no prefix).
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, d))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        # recompute each block in the backward pass (training only): keeps block inputs, not internals
        self.gradient_checkpointing = False
        self.norm = nn.LayerNorm(d, eps=cfg.norm_eps)  # in the checkpoint; unused by OpenVLA
        if cfg.attn_pool:
            self.attn_pool = AttentionPoolLatent(cfg)

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Tokens entering block 0: [cls, registers, patches + pos_embed]."""
        # Conv patches flattened row-major to (B, N, C), then position embeddings (patches only).
        x = self.patch_embed["proj"](pixel_values).flatten(2).transpose(1, 2) + self.pos_embed
        prefix = []
        if self.cfg.class_token:
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.cfg.reg_tokens:
            prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        return torch.cat(prefix + [x], dim=1) if prefix else x

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Patch features = output of block ``depth - 2`` without prefix tokens or final norm.

        The reference runs every block and then picks that output; the last block cannot
        influence it, so it is skipped here (same numbers, less compute).
        """
        x = self.embed(pixel_values)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks[: max(self.cfg.depth - 1, 1)]:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return x[:, self.cfg.num_prefix_tokens:]


class FusedVisionBackbone(nn.Module):
    """DINOv2 (``featurizer``, channels 0-2) + SigLIP (``fused_featurizer``, channels 3-5)."""

    def __init__(self, featurizer: ViTConfig, fused_featurizer: ViTConfig):
        super().__init__()
        if featurizer.num_patches != fused_featurizer.num_patches:
            raise ValueError("fused featurizers must produce the same number of patches")
        self.featurizer = VisionTransformer(featurizer)
        self.fused_featurizer = VisionTransformer(fused_featurizer)

    @property
    def embed_dim(self) -> int:
        return self.featurizer.cfg.embed_dim + self.fused_featurizer.cfg.embed_dim

    @property
    def num_patches(self) -> int:
        return self.featurizer.cfg.num_patches

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, 6, H, W) -> (B, num_patches, dino_dim + siglip_dim)."""
        if pixel_values.shape[1] != 6:
            raise ValueError(f"fused backbone expects 6 channels (DINOv2 | SigLIP), got {tuple(pixel_values.shape)}")
        return torch.cat([self.featurizer(pixel_values[:, :3]), self.fused_featurizer(pixel_values[:, 3:])], dim=2)

# ----------------------------------------------------------------------------- projector + model


class PrismaticProjector(nn.Module):
    """``no-align+fused-gelu-mlp`` projector: fc1 -> GELU -> fc2 -> GELU -> fc3 (fc1 widens 4x)."""

    def __init__(self, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)
        self.act_fn1 = nn.GELU()
        self.act_fn2 = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act_fn2(self.fc2(self.act_fn1(self.fc1(x)))))


@dataclasses.dataclass
class OpenVLAOutput:
    """Result of :meth:`OpenVLAModel.forward`.

    ``attention_mask`` is the multimodal mask (text mask with ``num_patches`` ones spliced in);
    pass it, extended by one per new token, to later cached steps.
    """

    logits: torch.Tensor
    past_key_values: Optional[Any] = None
    hidden_states: Optional[Tuple[torch.Tensor, ...]] = None
    attention_mask: Optional[torch.Tensor] = None
    loss: Optional[torch.Tensor] = None


class OpenVLACheckpointError(RuntimeError):
    """A checkpoint's keys or shapes do not match the model built from its config."""


class OpenVLAModel(nn.Module):
    """OpenVLA: fused ViT featurizers -> projector -> Llama-2 over [BOS, patches, rest of text]."""

    def __init__(self, config: OpenVLAConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        self.config = config
        self.vision_backbone = FusedVisionBackbone(config.featurizer, config.fused_featurizer)
        # A private copy with an explicit attention kernel, so numerics do not depend on what
        # transformers would auto-select and the caller's config is not mutated.
        text_config = copy.deepcopy(config.text_config)
        text_config._attn_implementation = attn_implementation
        self.projector = PrismaticProjector(self.vision_backbone.embed_dim, text_config.hidden_size)
        self.language_model = LlamaForCausalLM(text_config)
        # transformers 5.x names the cache argument ``cache``; older releases ``past_key_values``.
        params = inspect.signature(self.language_model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @property
    def num_patches(self) -> int:
        return self.vision_backbone.num_patches

    @staticmethod
    def _first_valid(mask: torch.Tensor) -> torch.Tensor:
        return mask.long().argmax(dim=1)

    @staticmethod
    def _last_valid(mask: torch.Tensor) -> torch.Tensor:
        return mask.shape[1] - 1 - mask.long().flip(1).argmax(dim=1)

    def _splice(self, text: torch.Tensor, patches: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """Insert ``patches`` right after each row's first real token (BOS).

        The reference always inserts after index 0; that is the same for unpadded and
        right-padded rows, and following BOS keeps left-padded rows equivalent to unpadded ones.
        """
        if bool((first == 0).all()):
            return torch.cat([text[:, :1], patches, text[:, 1:]], dim=1)
        rows = [torch.cat([text[b, : f + 1], patches[b], text[b, f + 1:]]) for b, f in enumerate(first.tolist())]
        return torch.stack(rows)

    def get_multimodal_embeddings(
        self, input_ids: torch.Tensor, pixel_values: torch.Tensor, attention_mask: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids + (B, 6, H, W) pixels -> ((B, T + P, D) embeddings, (B, T + P) mask)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        vision_dtype = self.projector.fc1.weight.dtype
        patches = self.projector(self.vision_backbone(pixel_values.to(vision_dtype)))
        text = self.language_model.get_input_embeddings()(input_ids)
        first = self._first_valid(attention_mask)
        embeds = self._splice(text, patches.to(text.dtype), first)
        ones = attention_mask.new_ones(attention_mask.shape[0], patches.shape[1], 1)
        mask = self._splice(attention_mask[..., None], ones, first)[..., 0]
        return embeds, mask

    def forward(
        self,
        input_ids: torch.Tensor,
        pixel_values: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        past_key_values: Optional[Any] = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        labels: Optional[torch.Tensor] = None,
    ) -> OpenVLAOutput:
        """Logits over the multimodal sequence.

        Without a (non-empty) cache this is the full multimodal pass and ``attention_mask`` is the
        TEXT mask (B, T).  With a cache only ``input_ids`` (the new tokens) go through the LLM and
        ``attention_mask`` must be the MULTIMODAL mask covering cached + new positions.
        ``labels`` (text-aligned, -100 = ignore) give the reference's shifted mean cross-entropy.
        """
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        mm_labels = None
        if past_len == 0:
            if pixel_values is None:
                raise ValueError("pixel_values are required for the first (multimodal) forward pass")
            embeds, mask = self.get_multimodal_embeddings(input_ids, pixel_values, attention_mask)
            if labels is not None:
                ignore = labels.new_full((labels.shape[0], self.num_patches, 1), IGNORE_INDEX)
                first = self._first_valid(attention_mask if attention_mask is not None else torch.ones_like(labels))
                mm_labels = self._splice(labels[..., None], ignore, first)[..., 0]
        else:
            embeds = self.language_model.get_input_embeddings()(input_ids)
            mask = attention_mask
            if mask is None:
                mask = input_ids.new_ones(input_ids.shape[0], past_len + input_ids.shape[1])
        # Positions count real tokens only: equal to the reference's 0..L-1 at every real position of
        # unpadded / right-padded rows, and keeps left-padded rows identical to unpadded ones.
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -embeds.shape[1]:]
        out = self.language_model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            **{self._cache_kwarg: past_key_values},
        )
        cache = getattr(out, "cache", None) if self._cache_kwarg == "cache" else getattr(out, "past_key_values", None)
        loss = None
        if mm_labels is not None:
            shift_logits = out.logits[:, :-1].float().reshape(-1, out.logits.shape[-1])
            loss = F.cross_entropy(shift_logits, mm_labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
        return OpenVLAOutput(
            logits=out.logits,
            past_key_values=cache if use_cache else None,
            hidden_states=out.hidden_states if output_hidden_states else None,
            attention_mask=mask,
            loss=loss,
        )

    @torch.no_grad()
    def generate_action_tokens(
        self,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        num_tokens: int = 7,
    ) -> torch.Tensor:
        """Greedy decoding of ``num_tokens`` ids per row with the KV cache -> (B, num_tokens).

        Step 1 is the multimodal pass over the prompt; later steps feed one token each, with
        positions continuing after the multimodal length.  Rows may be left- or right-padded
        (``attention_mask`` marks real tokens).  Unlike HF ``generate`` there is no EOS stop:
        an action always has exactly ``num_tokens`` tokens.  The prompt is used as given; see
        :func:`~models.openvla.processing_openvla.prepare_prompt_ids` / :meth:`predict_action_tokens`
        for the 29871 rule.
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        out = self.forward(input_ids, pixel_values, attention_mask, use_cache=True)
        mask = out.attention_mask
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        logits = out.logits[rows, self._last_valid(mask)]  # right-padded rows end before the pads
        cache, new_tokens = out.past_key_values, []
        for step in range(num_tokens):
            token = logits.argmax(dim=-1)
            new_tokens.append(token)
            if step + 1 == num_tokens:
                break
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            out = self.forward(token[:, None], None, mask, past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
        return torch.stack(new_tokens, dim=1)

    @torch.no_grad()
    def predict_action_tokens(
        self, prompts: Sequence[Sequence[int]], pixel_values: torch.Tensor, num_tokens: int = 7
    ) -> torch.Tensor:
        """Apply the 29871 prompt rule to each tokenised prompt, left-pad, and decode greedily."""
        ids, mask = left_pad_batch([prepare_prompt_ids(p) for p in prompts], int(self.config.pad_token_id))
        device = pixel_values.device
        return self.generate_action_tokens(ids.to(device), pixel_values, mask.to(device), num_tokens)


# ----------------------------------------------------------------------------- loading

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(folder: str) -> List[str]:
    """``model.safetensors``, or every shard named by ``model.safetensors.index.json``."""
    single, index = os.path.join(folder, SINGLE_FILE), os.path.join(folder, INDEX_FILE)
    if os.path.isfile(single):
        return [single]
    if not os.path.isfile(index):
        raise FileNotFoundError(f"no OpenVLA weights in {folder}: expected {SINGLE_FILE} or {INDEX_FILE} + its shards")
    with open(index) as f:
        weight_map: Dict[str, str] = json.load(f)["weight_map"]
    paths = [os.path.join(folder, shard) for shard in sorted(set(weight_map.values()))]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"shard {path} listed in {index} is missing")
    return paths


def read_openvla_state_dict(folder: str, device: Union[str, torch.device] = "cpu",
                            dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    """Tensors of the folder's weight files, each moved to ``device`` (floating ones cast to
    ``dtype``) as soon as it is read: the host holds one tensor at a time, not the model."""
    state: Dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                tensor = f.get_tensor(key)
                cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
                state[key] = tensor.to(device=device, dtype=cast)
    return state  # keys the index promises but the shards lack surface in check_state_dict


def check_state_dict(model: nn.Module, state: Dict[str, torch.Tensor]) -> None:
    """Raise :class:`OpenVLACheckpointError` unless keys and shapes match ``model`` exactly."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {expected[k]}"
              for k in sorted(set(expected) & set(state)) if tuple(state[k].shape) != expected[k]]
    if missing or unexpected or shapes:
        raise OpenVLACheckpointError(
            f"checkpoint does not match the model built from its config: "
            f"{len(missing)} missing (e.g. {missing[:5]}), {len(unexpected)} unexpected (e.g. {unexpected[:5]}), "
            f"{len(shapes)} shape mismatches (e.g. {shapes[:5]})"
        )


def load_openvla(
    folder: str, dtype: torch.dtype = torch.float32, device: Union[str, torch.device, None] = None,
    attn_implementation: str = "sdpa"
) -> OpenVLAModel:
    """Build an :class:`OpenVLAModel` from a local checkpoint folder and load its weights strictly.

    The folder holds ``config.json`` (+ optional ``vision_overrides.json``) and either
    ``model.safetensors`` or a sharded ``model-0000x-of-0000y.safetensors`` set with its index.
    ``device``: where the weights go (None: torch's default device, e.g. set by
    ``with torch.device("cuda:0")``); they are moved there one tensor at a time.
    """
    device = torch.get_default_device() if device is None else torch.device(device)
    config = OpenVLAConfig.from_pretrained(folder)
    state = read_openvla_state_dict(folder, device=device, dtype=dtype)
    # Build on the meta device: random init of a 7B model would take minutes and be overwritten.
    with torch.device("meta"):
        model = OpenVLAModel(config, attn_implementation=attn_implementation)
    check_state_dict(model, state)
    model.load_state_dict(state, strict=True, assign=True)
    # Non-persistent buffers (rotary inv_freq) are not in checkpoints: recompute them for real.
    llama = model.language_model.model
    with torch.device(device):
        llama.rotary_emb = LlamaRotaryEmbedding(config=llama.config)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise OpenVLACheckpointError(f"tensors left uninitialised after loading: {left[:5]}")
    return model.eval()
