"""Native Pi0 (PaliGemma: SigLIP + Gemma, and a Gemma action expert), numerically as LeRobot runs it.

Module paths equal LeRobot's checkpoint keys without their leading ``model.``
(``paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight`` ...),
so a LeRobot ``model.safetensors`` loads strictly. Written natively rather than on transformers'
``PI0ForConditionalGeneration`` because matching LeRobot needs control of what that class fixes:
the time embedding in float64 (transformers computes it in float32, which moves velocities by
~1e-3), the prefix layout with masked missing cameras, the per-step velocities, and re-scoring a
stored denoising chain with gradients. Conventions (LeRobot 0.4.4):

- time runs from t=1 (noise) to t=0 (actions); ``x_t = t * noise + (1 - t) * actions``, the target
  velocity is ``noise - actions`` and Euler steps ``x <- x + dt * v`` use ``dt = -1 / steps``;
- the prefix [camera tokens | language tokens * sqrt(width)] attends bidirectionally among valid
  tokens; the suffix [state | actions] sees the valid prefix, the state sees itself, the actions
  see the state and one another; position ids count valid tokens only;
- attention is eager (softmax in float32, masked scores at -2.3819763e38), Gemma's RMSNorm scales
  by ``1 + w`` in float32, MLPs use the tanh GELU.

The prefix never attends to the suffix, so it runs once through the PaliGemma language model and
its per-layer keys and values serve every denoising step of the expert.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from .configuration_pi0 import WEIGHTS_FILE, GemmaSize, Pi0Architecture, SiglipSize, read_architecture

MASKED = -2.3819763e38  # LeRobot's additive mask value (finite: a fully masked row stays finite)
KVCache = List[Tuple[torch.Tensor, torch.Tensor]]
# a LeRobot checkpoint holds the expert's lm_head, which pi0 never uses (LeRobot deletes the
# expert's token embedding and leaves this orphan): accepted and dropped when loading
UNUSED_KEYS = ("model.paligemma_with_expert.gemma_expert.lm_head.weight",)
# transformers ties PaliGemma's token embedding to its lm_head and saves one of the two names
TIED_EMBEDDING = ("model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight",
                  "model.paligemma_with_expert.paligemma.lm_head.weight")


class Pi0CheckpointError(RuntimeError):
    """A checkpoint's keys or shapes do not match the model its config and shapes describe."""


# ----------------------------------------------------------------------------- Gemma


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class GemmaAttentionProjections(nn.Module):
    def __init__(self, size: GemmaSize):
        super().__init__()
        self.q_proj = nn.Linear(size.width, size.num_heads * size.head_dim, bias=False)
        self.k_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=False)
        self.v_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=False)
        self.o_proj = nn.Linear(size.num_heads * size.head_dim, size.width, bias=False)


class GemmaMLP(nn.Module):
    def __init__(self, size: GemmaSize):
        super().__init__()
        self.gate_proj = nn.Linear(size.width, size.mlp_dim, bias=False)
        self.up_proj = nn.Linear(size.width, size.mlp_dim, bias=False)
        self.down_proj = nn.Linear(size.mlp_dim, size.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(positions: torch.Tensor, head_dim: int, theta: float,
           dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [B, S, head_dim] of rotate-half RoPE, computed in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
                                / head_dim))
    freqs = positions[:, :, None].float() * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scaling: float) -> torch.Tensor:
    """q [B, H, S, D], k/v [B, KV, T, D], additive mask [B, 1, S, T] -> [B, S, H * D]."""
    repeat = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(repeat, dim=1)
    v = v.repeat_interleave(repeat, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, v).transpose(1, 2)
    return out.reshape(out.shape[0], out.shape[1], -1)


class GemmaLayer(nn.Module):
    def __init__(self, size: GemmaSize, eps: float):
        super().__init__()
        self.size = size
        self.input_layernorm = GemmaRMSNorm(size.width, eps)
        self.self_attn = GemmaAttentionProjections(size)
        self.post_attention_layernorm = GemmaRMSNorm(size.width, eps)
        self.mlp = GemmaMLP(size)

    def forward(self, hidden: torch.Tensor, rope: Tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
                past: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
        """-> (hidden, (keys, values) of these tokens after RoPE). ``past``: keys and values of
        earlier tokens (the prefix) these tokens also attend to."""
        size, attn = self.size, self.self_attn
        batch, length = hidden.shape[:2]
        x = self.input_layernorm(hidden)
        q = attn.q_proj(x).view(batch, length, size.num_heads, size.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(batch, length, size.num_kv_heads, size.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(batch, length, size.num_kv_heads, size.head_dim).transpose(1, 2)
        cos, sin = (t[:, None] for t in rope)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        hidden = hidden + attn.o_proj(eager_attention(q, keys, values, mask, size.head_dim ** -0.5))
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, (k, v)


class GemmaStack(nn.Module):
    """Decoder layers + final norm (no token embedding: pi0 feeds embeddings)."""

    def __init__(self, size: GemmaSize, eps: float):
        super().__init__()
        self.layers = nn.ModuleList(GemmaLayer(size, eps) for _ in range(size.depth))
        self.norm = GemmaRMSNorm(size.width, eps)


# ----------------------------------------------------------------------------- SigLIP


class SiglipAttention(nn.Module):
    def __init__(self, size: SiglipSize):
        super().__init__()
        self.num_heads = size.num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(size.width, size.width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        split = lambda t: t.view(batch, length, self.num_heads, -1).transpose(1, 2)  # noqa: E731
        head_dim = width // self.num_heads
        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)),
                                             scale=head_dim ** -0.5)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, width))


class SiglipMLP(nn.Module):
    def __init__(self, size: SiglipSize):
        super().__init__()
        self.fc1 = nn.Linear(size.width, size.mlp_dim)
        self.fc2 = nn.Linear(size.mlp_dim, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipLayer(nn.Module):
    def __init__(self, size: SiglipSize, eps: float):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(size.width, eps=eps)
        self.self_attn = SiglipAttention(size)
        self.layer_norm2 = nn.LayerNorm(size.width, eps=eps)
        self.mlp = SiglipMLP(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, size: SiglipSize):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, size.width, kernel_size=size.patch_size, stride=size.patch_size)
        self.position_embedding = nn.Embedding(size.num_patches, size.width)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight[None]


class SiglipEncoder(nn.Module):
    def __init__(self, size: SiglipSize, eps: float):
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(size, eps) for _ in range(size.depth))


class SiglipVisionTransformer(nn.Module):
    def __init__(self, size: SiglipSize, eps: float):
        super().__init__()
        self.embeddings = SiglipEmbeddings(size)
        self.encoder = SiglipEncoder(size, eps)
        self.post_layernorm = nn.LayerNorm(size.width, eps=eps)

    def forward(self, pixels: torch.Tensor, recompute: bool = False) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = _checkpointed(layer, x) if recompute else layer(x)
        return self.post_layernorm(x)


def _checkpointed(module: nn.Module, *args, **kwargs):
    """Run ``module`` keeping only its inputs for the backward pass (recomputed then)."""
    return torch.utils.checkpoint.checkpoint(module, *args, use_reentrant=False, **kwargs)


# ----------------------------------------------------------------------------- containers (checkpoint paths)


class _Module(nn.Module):
    """A named container: its children are the path segments of the checkpoint keys."""

    def __init__(self, **children: nn.Module):
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


def _make_lerobot_tree(arch: Pi0Architecture) -> nn.Module:
    vlm, vision = arch.vlm, arch.vision
    paligemma = _Module(
        model=_Module(vision_tower=_Module(vision_model=SiglipVisionTransformer(vision, arch.layer_norm_eps)),
                      multi_modal_projector=_Module(linear=nn.Linear(vision.width, vlm.width)),
                      language_model=GemmaStack(vlm, arch.rms_norm_eps)),
        lm_head=nn.Linear(vlm.width, arch.vocab_size, bias=False))  # also the token embedding (tied)
    return _Module(paligemma=paligemma, gemma_expert=_Module(model=GemmaStack(arch.expert, arch.rms_norm_eps)))


def sinusoidal_time_embedding(time: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """[B] times -> [B, dim] ``[sin | cos]`` features, computed in float64 and cast to ``time``'s
    dtype (in float32 the arguments, up to ~1.6e3 rad, lose enough to move velocities by ~1e-3)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    scaling = 1.0 / period * 2 * math.pi
    angles = scaling[None, :] * time[:, None].to(torch.float64)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).to(time.dtype)


def attention_mask_2d(pad: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Query i may attend key j when both are valid and j's block does not start after i's."""
    starts = torch.cumsum(blocks, dim=1)
    return (starts[:, None, :] <= starts[:, :, None]) & (pad[:, None, :] & pad[:, :, None])


def additive(mask_2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(mask_2d[:, None], torch.tensor(0.0, dtype=dtype, device=mask_2d.device),
                       torch.tensor(MASKED, dtype=dtype, device=mask_2d.device))


class Pi0Model(nn.Module):
    """The Pi0 network: prefix (cameras + language) through PaliGemma, suffix (state + noisy
    action chunk + time) through the action expert, velocities out."""

    def __init__(self, arch: Pi0Architecture):
        super().__init__()
        self.arch = arch
        width, expert = arch.vlm.width, arch.expert.width
        self.paligemma_with_expert = _make_lerobot_tree(arch)
        self.state_proj = nn.Linear(arch.max_state_dim, expert)
        self.action_in_proj = nn.Linear(arch.max_action_dim, expert)
        self.action_time_mlp_in = nn.Linear(2 * expert, expert)
        self.action_time_mlp_out = nn.Linear(expert, expert)
        self.action_out_proj = nn.Linear(expert, arch.max_action_dim)
        self.lang_scale = math.sqrt(width)
        # recompute every SigLIP and Gemma layer in the backward pass (training only)
        self.gradient_checkpointing = False

    def _recompute(self) -> bool:
        return self.gradient_checkpointing and self.training and torch.is_grad_enabled()

    @property
    def paligemma(self) -> nn.Module:
        return self.paligemma_with_expert.paligemma

    @property
    def language_model(self) -> GemmaStack:
        return self.paligemma.model.language_model

    @property
    def expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    # ---- prefix ----------------------------------------------------------------------------
    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [-1, 1] -> tokens [B, patches, width] (SigLIP + projector)."""
        model = self.paligemma.model
        return model.multi_modal_projector.linear(model.vision_tower.vision_model(pixels, self._recompute()))

    def embed_prefix(self, images: Sequence[torch.Tensor], image_masks: Sequence[torch.Tensor],
                     tokens: torch.Tensor, token_mask: torch.Tensor):
        """-> (embeddings [B, L, width], valid [B, L], block starts [B, L]) of
        [camera tokens per camera (a camera's mask covers its tokens) | language * sqrt(width)]."""
        embs, pads = [], []
        for pixels, valid in zip(images, image_masks):
            emb = self.embed_images(pixels)
            embs.append(emb)
            pads.append(valid[:, None].expand(emb.shape[0], emb.shape[1]))
        lang = F.embedding(tokens, self.paligemma.lm_head.weight)
        embs.append(lang * self.lang_scale)
        pads.append(token_mask.bool())
        pad = torch.cat(pads, dim=1)
        return torch.cat(embs, dim=1), pad, torch.zeros_like(pad, dtype=torch.long)

    def run_prefix(self, embs: torch.Tensor, pad: torch.Tensor, blocks: torch.Tensor) -> Tuple[KVCache, torch.Tensor]:
        """The prefix through the PaliGemma language model -> (per-layer keys/values, final
        normed hidden states [B, L, width])."""
        mask = additive(attention_mask_2d(pad, blocks), embs.dtype)
        positions = torch.cumsum(pad.long(), dim=1) - 1
        rope = rotary(positions, self.arch.vlm.head_dim, self.arch.rope_theta, embs.dtype)
        hidden, cache = embs, []
        for layer in self.language_model.layers:
            hidden, kv = _checkpointed(layer, hidden, rope, mask) if self._recompute() else layer(hidden, rope, mask)
            cache.append(kv)
        return cache, self.language_model.norm(hidden)

    # ---- suffix ----------------------------------------------------------------------------
    def embed_suffix(self, state: torch.Tensor, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """[state token | one token per action of the chunk, with the time mixed in]. The time
        embedding is computed from float32 times in float64 whatever the model's dtype (in
        bfloat16, t = 0.9 would already read as 0.898) and only then cast."""
        dtype = self.action_in_proj.weight.dtype
        state_token = self.state_proj(state.to(dtype))[:, None]
        time_emb = sinusoidal_time_embedding(time.float(), self.action_in_proj.out_features, self.arch.min_period,
                                             self.arch.max_period).to(dtype)
        actions = self.action_in_proj(x_t.to(dtype))
        mixed = torch.cat([actions, time_emb[:, None, :].expand_as(actions)], dim=2)
        action_tokens = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))
        return torch.cat([state_token, action_tokens], dim=1)

    def run_suffix(self, cache: KVCache, prefix_pad: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor,
                   time: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """-> (velocity [B, chunk, max_action_dim], expert output of the action tokens [B, chunk, width])."""
        embs = self.embed_suffix(state, x_t, time)
        batch, length = embs.shape[:2]
        pad = torch.ones(batch, length, dtype=torch.bool, device=embs.device)
        blocks = torch.zeros(batch, length, dtype=torch.long, device=embs.device)
        blocks[:, :2] = 1  # the state starts a block, the first action the next
        own = attention_mask_2d(pad, blocks)
        sees_prefix = prefix_pad[:, None, :].expand(batch, length, prefix_pad.shape[1])
        mask = additive(torch.cat([sees_prefix, own], dim=2), embs.dtype)
        positions = prefix_pad.long().sum(-1, keepdim=True) + torch.cumsum(pad.long(), dim=1) - 1
        rope = rotary(positions, self.arch.expert.head_dim, self.arch.rope_theta, embs.dtype)
        hidden = embs
        for layer, past in zip(self.expert.layers, cache):
            run = _checkpointed if self._recompute() else (lambda module, *args, **kw: module(*args, **kw))
            hidden, _ = run(layer, hidden, rope, mask, past=past)
        out = self.expert.norm(hidden)[:, -self.arch.chunk_size:]
        return self.action_out_proj(out), out

    # ---- flow matching ---------------------------------------------------------------------
    def denoising_times(self, steps: int) -> List[float]:
        """t_k = 1 + k * dt, dt = -1 / steps (k = 0 .. steps): the times of the Euler chain."""
        dt = -1.0 / steps
        return [1.0 + k * dt for k in range(steps + 1)]

    def sample(self, prefix: Tuple[KVCache, torch.Tensor], state: torch.Tensor, noise: torch.Tensor,
               steps: Optional[int] = None) -> Dict[str, torch.Tensor]:
        """Deterministic Euler sampling from ``noise`` -> {"actions", "x_t" [steps+1, ...], "v_t" [steps, ...]}."""
        steps = steps or self.arch.num_inference_steps
        cache, prefix_pad = prefix
        dt = torch.tensor(-1.0 / steps, dtype=noise.dtype, device=noise.device)
        x, chain, velocities = noise, [noise], []
        for t in self.denoising_times(steps)[:-1]:
            time = torch.full((noise.shape[0],), t, dtype=noise.dtype, device=noise.device)
            v, _ = self.run_suffix(cache, prefix_pad, state, x, time)
            x = x + dt * v
            chain.append(x)
            velocities.append(v)
        return {"actions": x, "x_t": torch.stack(chain), "v_t": torch.stack(velocities)}

    def flow_loss(self, prefix: Tuple[KVCache, torch.Tensor], state: torch.Tensor, actions: torch.Tensor,
                  noise: torch.Tensor, time: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The flow-matching training loss at ``time`` [B] -> {"loss" elementwise [B, chunk, max_action_dim],
        "v_t", "u_t", "x_t"}."""
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        u_t = noise - actions
        v_t, _ = self.run_suffix(*prefix, state, x_t, time)
        # in float32: the velocity comes out in the compute dtype (bf16 on a GPU), the target in float32
        return {"loss": F.mse_loss(u_t.float(), v_t.float(), reduction="none"), "v_t": v_t, "u_t": u_t, "x_t": x_t}


def load_pi0(folder: str, dtype: torch.dtype = torch.float32,
             device: Union[str, torch.device, None] = None) -> Pi0Model:
    """Build a :class:`Pi0Model` from a LeRobot Pi0 folder and load its weights strictly, one
    tensor at a time onto ``device`` (None: torch's default device)."""
    from safetensors import safe_open

    device = torch.get_default_device() if device is None else torch.device(device)
    arch = read_architecture(folder)
    with torch.device("meta"):
        model = Pi0Model(arch)
    state = {}
    with safe_open(os.path.join(folder, WEIGHTS_FILE), framework="pt") as f:
        for key in f.keys():
            if key in UNUSED_KEYS:
                continue
            name = TIED_EMBEDDING[1] if key == TIED_EMBEDDING[0] else key
            if not name.startswith("model."):
                raise Pi0CheckpointError(f"{folder}/{WEIGHTS_FILE}: key {key!r} is not under 'model.' "
                                         "(not a LeRobot Pi0)")
            tensor = f.get_tensor(key)
            state[name[len("model."):]] = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    shapes = [f"{k}: {tuple(state[k].shape)} vs {expected[k]}" for k in set(expected) & set(state)
              if tuple(state[k].shape) != expected[k]]
    if missing or unexpected or shapes:
        raise Pi0CheckpointError(f"{folder}/{WEIGHTS_FILE} does not match the Pi0 its config and shapes describe: "
                                 f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected "
                                 f"(e.g. {unexpected[:3]}), {len(shapes)} shape mismatches (e.g. {shapes[:3]})")
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
