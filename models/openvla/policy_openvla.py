"""OpenVLA as an RL policy: action-token sampling, log-probs, a value head, LoRA.

One decision = ``action_dim`` action tokens generated after the prompt ``[BOS, image patches,
"In: What action should the robot take to ...?\\nOut:", 29871]``.  Every token is drawn from the
model's logits *restricted to the 256 action-bin ids* (all other ids have probability 0), divided
by ``temperature`` and optionally truncated to the ``top_k`` best bins.  The decision's log-prob
(and entropy) is the sum over its tokens under exactly that distribution; ``evaluate`` recomputes
it with one teacher-forced pass over prompt + stored tokens.  The value head reads the LLM's
last-layer (post-norm) hidden state at the last prompt position, i.e. the one that predicts the
first action token, so it sees image and instruction but no action.

Prompts are left-padded, so in every row the prompt ends in the same column and the action
tokens are the last ``action_dim`` positions of the teacher-forced sequence.

Tokenisation: real checkpoints ship the Llama-2 tokenizer and are tokenised with it through
:class:`~models.openvla.processing_openvla.OpenVLAProcessor`.  Folders without a tokenizer (the
tiny test checkpoints) use :func:`hash_prompt_ids`, a deterministic stand-in; any
``prompt_ids_fn(instruction) -> ids`` may be passed instead.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embodied_async.contracts import EnvSpec
from embodied_async.data import PolicyOutput
from embodied_async.normalization import InputStatistics
from models.checkpoints import resolve_checkpoint
from models.common import as_tensor, head_output, inference, make_mlp, zero_values
from models.vla import (
    PrivilegedValueHead,
    check_action_chunk,
    check_tiny_image_size,
    compute_dtype,
    inject_lora,
    make_tiny_once,
    privileged_states_input,
    privileged_value_dim,
)

from .action_tokenizer import ActionTokenizer, get_action_stats
from .configuration_policy import OpenVLAPolicyConfig
from .modeling_openvla import OpenVLAModel, load_openvla
from .processing_openvla import (
    OpenVLAImageProcessor,
    OpenVLAProcessor,
    build_prompt,
    left_pad_batch,
    prepare_prompt_ids,
)

BOS_TOKEN_ID = 1
IMAGE_PREPROCESSING = ("auto", "torch", "pil")


def hash_prompt_ids(instruction: str) -> List[int]:
    """Tokenizer stand-in: BOS, then one stable hashed id in [3, 31000) per word / punctuation
    mark / newline of the OpenVLA prompt text (which ends with ``?\\nOut:``)."""
    pieces = re.findall(r"\w+|[^\w\s]|\n", build_prompt(instruction))
    ids = [3 + int.from_bytes(hashlib.blake2b(p.encode(), digest_size=8).digest(), "little") % (31000 - 3)
           for p in pieces]
    return [BOS_TOKEN_ID] + ids


class OpenVLAPolicy(nn.Module):
    """``OpenVLAModel`` (``vla``) + value MLP (``value_head``) behind the Policy protocol.

    Args:
        vla: a loaded :class:`OpenVLAModel` (its ``config.norm_stats`` must hold ``unnorm_key``).
        unnorm_key: dataset statistics used to un-normalise actions (None: the only one).
        temperature, top_k: the sampling distribution (also the one log-probs are computed under).
        lora_rank: > 0 injects LoRA adapters (peft) and freezes every other parameter except the
            value head; ``lora_alpha``, ``lora_dropout``, ``lora_init`` (peft's
            ``init_lora_weights``) and ``lora_target_modules`` configure them: module names
            matched anywhere in the VLA, or "all-linear" (the language model's linear layers).
        eval_temperature: evaluation ("eval" mode) samples at this temperature; None: greedy.
        gradient_checkpointing: recompute the LLM's decoder layers and the ViT blocks in the
            backward pass.
        image_processor: defaults to the processor matching the model's image size.
        prompt_ids_fn: instruction -> token ids (with BOS); defaults to ``tokenizer`` when given,
            else :func:`hash_prompt_ids`.
        store_raw_images: put the resized uint8 images (``images``, [B, S, S, 3]) in
            ``forward_inputs`` instead of the float32 ``pixel_values`` (8x smaller;
            ``evaluate`` only normalises them, which is exact).  Default False.
        image_preprocessing: "torch" resizes on the policy device (GPU), "pil" with PIL (the
            reference, bit-exact to the official processor), "auto" torch on a GPU and PIL on a
            CPU. The two agree within 2 of 255 levels (OpenVLAImageProcessor.resize_tensor).
    """

    value_parameter_prefixes = ("value_head.",)
    # "token_level": one log-prob per action token (build_policy sets it from algorithm.logprob_type)
    logprob_type = "chunk_level"

    def __init__(self, vla: OpenVLAModel, unnorm_key: Optional[str] = None, temperature: float = 1.0,
                 top_k: Optional[int] = None, lora_rank: int = 0, lora_alpha: float = 32,
                 lora_dropout: float = 0.0, lora_target_modules: Union[str, Sequence[str]] = "all-linear",
                 lora_init: Union[bool, str] = True, eval_temperature: Optional[float] = None,
                 image_preprocessing: str = "auto",
                 gradient_checkpointing: bool = False, value_head_hidden_sizes: Sequence[int] = (1024, 512),
                 image_processor: Optional[OpenVLAImageProcessor] = None, tokenizer=None,
                 prompt_ids_fn: Optional[Callable[[str], List[int]]] = None, store_raw_images: bool = False,
                 privileged_value_dim: int = 0, value_head: bool = True):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use mode='eval' for greedy), got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        config = vla.config
        self.vla = vla
        self._set_action_space(config, unnorm_key)
        self.temperature, self.top_k = float(temperature), top_k
        if eval_temperature is not None and eval_temperature <= 0:
            raise ValueError(f"eval_temperature must be > 0 (None: greedy), got {eval_temperature}")
        self.eval_temperature = eval_temperature
        self.pad_token_id = int(config.pad_token_id)
        self.store_raw_images = store_raw_images
        self._set_image_processing(config, image_preprocessing, image_processor)
        if prompt_ids_fn is None and tokenizer is not None:
            processor = OpenVLAProcessor(self.image_processor, tokenizer, self.pad_token_id)
            prompt_ids_fn = lambda text: processor.tokenize(build_prompt(text))  # noqa: E731
        self.prompt_ids_fn = prompt_ids_fn or hash_prompt_ids
        # the value head reads the prompt's last hidden state, or (privileged_value_dim > 0) the env's
        # privileged state vector: an asymmetric critic, for simulators (the actor still sees images)
        self.privileged_value = value_head and privileged_value_dim > 0
        self.value_head = self._make_value_head(value_head, privileged_value_dim, value_head_hidden_sizes)
        self.lora_enabled = lora_rank > 0
        if self.lora_enabled:
            self._add_lora(lora_rank, lora_alpha, lora_dropout, lora_target_modules, lora_init)
        if gradient_checkpointing:
            self._enable_checkpointing(vla.language_model)
            for tower in (vla.vision_backbone.featurizer, vla.vision_backbone.fused_featurizer):
                tower.gradient_checkpointing = True
        params = inspect.signature(vla.language_model.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.supervised_horizon = 1  # one action per decision

    def _set_action_space(self, config, unnorm_key: Optional[str]) -> None:
        """The action statistics (``unnorm_key``'s of ``config.norm_stats``) and the action tokens."""
        stats = get_action_stats(config.norm_stats or {}, unnorm_key)
        low = np.asarray(stats["q01"], dtype=np.float64)
        # buffers: published and checkpointed, so fine-tuning on a dataset can bring its own range
        self.action_statistics = InputStatistics(
            q01=low, q99=np.asarray(stats["q99"], dtype=np.float64),
            mask=np.asarray(stats.get("mask", np.ones_like(low, dtype=bool)), dtype=bool))
        self.action_dim = len(low)
        self.action_tokenizer = ActionTokenizer.from_config(config)
        self.token_low, self.token_high = self.action_tokenizer.action_token_range()

    def _set_image_processing(self, config, image_preprocessing: str,
                              image_processor: Optional[OpenVLAImageProcessor]) -> None:
        """Where images are resized, and the processor (default: the one of the model's image size)."""
        if image_preprocessing not in IMAGE_PREPROCESSING:
            raise ValueError(f"image_preprocessing={image_preprocessing!r}; use one of {IMAGE_PREPROCESSING}")
        self.image_preprocessing = image_preprocessing
        if image_processor is None:
            size = int(config.image_sizes[0])
            image_processor = OpenVLAImageProcessor(config.image_resize_strategy, [(3, size, size)] * 2)
        self.image_processor = image_processor
        if image_preprocessing == "torch" and not image_processor.torch_resizable:
            raise ValueError("image_preprocessing='torch' resizes only with the bicubic or bilinear filter, and this "
                             "checkpoint's preprocessor_config.json names another: use 'pil' or 'auto'")

    def _make_value_head(self, value_head: bool, privileged_value_dim: int,
                         hidden_sizes: Sequence[int]) -> Optional[nn.Module]:
        """None for a value-free run (algorithm.adv_type=grpo: zero values, nothing to train), else an
        MLP on the prompt's last hidden state or on the privileged state vector, in the VLA's dtype."""
        dtype = self.vla.projector.fc1.weight.dtype
        if not value_head:
            return None
        if self.privileged_value:
            return PrivilegedValueHead(privileged_value_dim, hidden_sizes, dtype)
        hidden = int(self.vla.config.text_config.hidden_size)
        return make_mlp(hidden, list(hidden_sizes), 1, "gelu", out_std=1.0).to(dtype)

    @classmethod
    def from_pretrained(cls, folder: str, dtype: torch.dtype = torch.float32, device=None, **kwargs) -> "OpenVLAPolicy":
        """Load ``folder`` (official format) with its preprocessor config and tokenizer if present;
        the weights go to ``device`` (default: torch's default device) one tensor at a time."""
        vla = load_openvla(folder, dtype=dtype, device=device)
        if os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
            processor = OpenVLAProcessor.from_pretrained(folder, load_tokenizer=kwargs.get("prompt_ids_fn") is None)
            kwargs.setdefault("image_processor", processor.image_processor)
            kwargs.setdefault("tokenizer", processor.tokenizer)
        return cls(vla, **kwargs)

    def _add_lora(self, rank: int, alpha: float, dropout: float, targets: Union[str, Sequence[str]],
                  init_weights: Union[bool, str] = True) -> None:
        if not isinstance(targets, str):
            targets = list(targets)
            targets = "all-linear" if targets == ["all-linear"] else targets
        # "all-linear": the language model's linear layers (peft leaves its lm_head out). Names:
        # matched anywhere in the VLA (ViT blocks, projector, language model, lm_head), by suffix.
        root = self.vla.language_model if targets == "all-linear" else self.vla
        inject_lora(self.vla, [root], rank, alpha, targets, dropout, init_weights)

    def fsdp_units(self) -> List[nn.Module]:
        """Modules the actor shards as their own FSDP units: every ViT block and decoder layer
        (one gathered at a time; the root keeps embeddings, projector, lm_head, value head)."""
        vision = self.vla.vision_backbone
        towers = [vision.featurizer, vision.fused_featurizer]
        return [block for tower in towers for block in tower.blocks] + list(self.vla.language_model.model.layers)

    @staticmethod
    def _enable_checkpointing(lm: nn.Module) -> None:
        # Non-reentrant: works with frozen embeddings (LoRA) without forcing input grads.
        kwargs = {"use_reentrant": False}
        if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.x name
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    @property
    def action_stats(self) -> Dict[str, np.ndarray]:
        """The q01 / q99 / mask actions are (un)normalised with (``unnorm_key``'s, or a dataset's)."""
        stats = self.action_statistics
        return {"q01": stats.q01.cpu().numpy(), "q99": stats.q99.cpu().numpy(), "mask": stats.mask.cpu().numpy()}

    def set_input_statistics(self, stats) -> None:
        """Fine-tuning on a dataset: its actions' q01 / q99 become the bins' range (as OpenVLA's
        own fine-tuning computes them from the dataset); the mask stays the checkpoint's."""
        if "actions" in stats:
            self.action_statistics.assign("q01", stats["actions"]["q01"])
            self.action_statistics.assign("q99", stats["actions"]["q99"])

    # ------------------------------------------------------------------------------ inputs
    @property
    def device(self) -> torch.device:
        return self.vla.projector.fc1.weight.device

    def prompt_batch(self, task_descriptions: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Instructions -> left-padded ``(input_ids, attention_mask)`` [B, L] on the policy device."""
        prompts = [prepare_prompt_ids(self.prompt_ids_fn(text)) for text in task_descriptions]
        ids, mask = left_pad_batch(prompts, self.pad_token_id)
        return ids.to(self.device), mask.to(self.device)

    def _torch_resize(self) -> bool:
        if self.image_preprocessing == "auto":  # PIL is the faster of the two on a CPU
            return self.device.type != "cpu" and self.image_processor.torch_resizable
        return self.image_preprocessing == "torch"

    def resize_images(self, images) -> torch.Tensor:
        """uint8 images [B, H, W, 3] (numpy or tensor) -> uint8 [B, S, S, 3] at the model's
        resolution, on the policy device (``image_preprocessing``: torch on the device or PIL)."""
        if self._torch_resize():
            return self.image_processor.resize_tensor(as_tensor(images, dtype=torch.uint8, device=self.device))
        if isinstance(images, torch.Tensor):
            images = images.detach().cpu().numpy()
        return torch.from_numpy(self.image_processor.resize_pil(np.asarray(images))).to(self.device)

    def pixel_values(self, images) -> torch.Tensor:
        """uint8 images [B, H, W, 3] -> float32 pixel values [B, 6, S, S] on the policy device."""
        return self.image_processor.normalize(self.resize_images(images))

    def _inputs(self, obs, critic: bool = True) -> Dict[str, torch.Tensor]:
        """The model's inputs; ``critic``: the value head's too (a privileged critic's state is
        needed in training only: evaluation and the supervised loss run without it)."""
        resized = self.resize_images(obs["main_images"])
        ids, mask = self.prompt_batch(list(obs["task_descriptions"]))
        inputs = {"input_ids": ids, "attention_mask": mask, "pixel_values": self.image_processor.normalize(resized)}
        if self.store_raw_images:  # the resized images: what the actor needs, ~6x less than a 640x480 frame
            inputs["images"] = resized
        if self.privileged_value and (critic or "privileged_states" in obs):
            inputs["privileged_states"] = privileged_states_input(obs, self.device)
        return inputs

    # ------------------------------------------------------------------------------ model pieces
    def _llm(self, embeds: torch.Tensor, mask: torch.Tensor, cache=None, use_cache: bool = False):
        """Llama decoder (no lm_head) -> (post-norm last hidden states [B, n, H], cache)."""
        # Positions count real tokens only, as in OpenVLAModel.forward (left padding is invisible).
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -embeds.shape[1]:]
        out = self.vla.language_model.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                                            use_cache=use_cache, **{self._cache_kwarg: cache})
        return out.last_hidden_state, getattr(out, self._cache_kwarg, None)

    def _prefill(self, input_ids, attention_mask, pixel_values, use_cache: bool = False):
        if not bool(attention_mask[:, -1].all()):
            raise ValueError("prompts must be left-padded (attention_mask[:, -1] all ones)")
        embeds, mask = self.vla.get_multimodal_embeddings(input_ids, pixel_values, attention_mask)
        hidden, cache = self._llm(embeds, mask, use_cache=use_cache)
        return hidden, mask, cache

    def _action_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [..., H] -> log-probs [..., n_bins] over the action ids (float32),
        restricted to the action range, tempered and top-k truncated (outside ids: prob 0)."""
        logits = self.vla.language_model.lm_head(hidden)[..., self.token_low:self.token_high + 1].float()
        logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.log_softmax(logits, dim=-1)

    def _choose(self, logp: torch.Tensor, mode: str) -> torch.Tensor:
        """Bin indices: sampled from ``logp`` ("train"); greedy, or sampled at ``eval_temperature``
        ("eval")."""
        if mode == "train":
            return torch.multinomial(logp.exp(), 1).squeeze(-1)
        if self.eval_temperature is None:
            return logp.argmax(-1)
        # logp = log_softmax(logits / T): rescaling gives logits / T_eval up to a constant
        tempered = torch.log_softmax(logp * (self.temperature / self.eval_temperature), dim=-1)
        return torch.multinomial(tempered.exp(), 1).squeeze(-1)

    @staticmethod
    def _entropy(logp: torch.Tensor) -> torch.Tensor:
        p = logp.exp()
        return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)

    def _value(self, features: torch.Tensor) -> torch.Tensor:
        """The value head on the prompt's last hidden state or (privileged) the env's state vector."""
        if self.value_head is None:
            return zero_values(features)
        return self.value_head(features) if self.privileged_value else head_output(self.value_head, features)

    # ------------------------------------------------------------------------------ protocol
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor,
                 mode: str = "train") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """KV-cached decoding of ``action_dim`` tokens -> (tokens [B, A], logprobs [B] (token_level:
        [B, A]), entropy, values [B])."""
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        with inference(self):
            hidden, mask, cache = self._prefill(input_ids, attention_mask, pixel_values, use_cache=True)
            last = hidden[:, -1]
            values = None if self.privileged_value else self._value(last)
            tokens, token_logprobs, entropy = [], [], 0.0
            for step in range(self.action_dim):
                logp = self._action_log_probs(last)
                index = self._choose(logp, mode)
                token_logprobs.append(logp.gather(-1, index[:, None]).squeeze(-1))
                entropy = entropy + self._entropy(logp)
                token = index + self.token_low
                tokens.append(token)
                if step + 1 == self.action_dim:
                    break
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                embeds = self.vla.language_model.get_input_embeddings()(token[:, None])
                hidden, cache = self._llm(embeds, mask, cache=cache, use_cache=True)
                last = hidden[:, -1]
        return torch.stack(tokens, dim=1), self._decision_logprobs(torch.stack(token_logprobs, dim=1)), entropy, values

    def _decision_logprobs(self, token_logprobs: torch.Tensor) -> torch.Tensor:
        """[B, A] per action token -> [B] summed (chunk_level), or as they are (token_level)."""
        return token_logprobs if self.logprob_type == "token_level" else token_logprobs.sum(-1)

    def tokens_to_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """Action tokens [B, A] -> un-normalised float32 actions [B, 1, A] (on the tokens' device)."""
        actions = self.action_tokenizer.decode_actions(tokens.cpu().numpy(), self.action_stats)
        return torch.as_tensor(actions, dtype=torch.float32, device=tokens.device)[:, None]

    def predict_from_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                            pixel_values: torch.Tensor, mode: str = "train",
                            extra_inputs: Optional[Dict[str, torch.Tensor]] = None) -> PolicyOutput:
        """:meth:`predict` on ready-made left-padded prompt ids and pixel values."""
        tokens, logprobs, _, values = self.generate(input_ids, attention_mask, pixel_values, mode)
        forward_inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "action_tokens": tokens}
        if self.privileged_value and mode == "eval" and "privileged_states" not in (extra_inputs or {}):
            values = zero_values(tokens)  # an evaluation on an env without privileged states
        elif self.privileged_value:
            if not extra_inputs or "privileged_states" not in extra_inputs:
                raise KeyError("model.value_input=privileged_states: pass extra_inputs['privileged_states'] (predict "
                               "does, from the observation)")
            forward_inputs["privileged_states"] = extra_inputs["privileged_states"]
            if mode == "train":  # the critic's running statistics learn from what the rollout sees
                self.value_head.observe(forward_inputs["privileged_states"])
            with inference(self):
                values = self._value(forward_inputs["privileged_states"])
        if extra_inputs and "images" in extra_inputs:
            forward_inputs["images"] = extra_inputs["images"]
        else:
            forward_inputs["pixel_values"] = pixel_values.float()
        return PolicyOutput(actions=self.tokens_to_actions(tokens), logprobs=logprobs, values=values,
                            forward_inputs=forward_inputs)

    def predict(self, obs, mode: str = "train") -> PolicyOutput:
        """Observations -> sampled ("train") or greedy ("eval") actions [B, 1, A] + log-probs + values."""
        inputs = self._inputs(obs, critic=mode == "train")
        return self.predict_from_inputs(inputs["input_ids"], inputs["attention_mask"], inputs["pixel_values"],
                                        mode, extra_inputs=inputs)

    def value(self, obs) -> torch.Tensor:
        """Values [B] of observations (prompt-only pass, no generation)."""
        if self.value_head is None:
            return torch.zeros(len(obs["task_descriptions"]), dtype=torch.float32, device=self.device)
        if self.privileged_value:
            with inference(self):
                return self._value(privileged_states_input(obs, self.device))
        inputs = self._inputs(obs)
        with inference(self):
            hidden, _, _ = self._prefill(inputs["input_ids"], inputs["attention_mask"], inputs["pixel_values"])
            return self._value(hidden[:, -1])

    def evaluate(self, forward_inputs: Dict[str, torch.Tensor], actions=None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One teacher-forced pass over prompt + stored action tokens -> (logprobs, entropy, values) [B]
        (logprobs [B, A] per token under token_level).

        ``actions`` is unused: the stored ``action_tokens`` define the decision exactly (the
        continuous actions are bin centres and would not identify out-of-range samples).
        """
        ids, mask = forward_inputs["input_ids"], forward_inputs["attention_mask"]
        tokens = forward_inputs["action_tokens"]
        pixels = forward_inputs.get("pixel_values")
        if pixels is None:  # stored already resized: normalising is exact and runs on the device
            pixels = self.image_processor.normalize(forward_inputs["images"].to(self.device))
        full_ids = torch.cat([ids, tokens.to(ids.dtype)], dim=1)
        full_mask = torch.cat([mask, mask.new_ones(tokens.shape)], dim=1)
        embeds, mm_mask = self.vla.get_multimodal_embeddings(full_ids, pixels, full_mask)
        hidden, _ = self._llm(embeds, mm_mask)
        n = tokens.shape[1]
        logp = self._action_log_probs(hidden[:, -n - 1:-1])  # position t predicts token t + 1
        index = (tokens.long() - self.token_low).clamp(0, logp.shape[-1] - 1)
        logprobs = self._decision_logprobs(logp.gather(-1, index[..., None]).squeeze(-1))
        value_input = forward_inputs["privileged_states"] if self.privileged_value else hidden[:, -n - 1]
        return logprobs, self._entropy(logp).sum(-1), self._value(value_input)

    def supervised_loss(self, obs, actions, action_pad=None) -> Tuple[torch.Tensor, Dict[str, float]]:
        """Cross-entropy of the expert's action tokens over the whole vocabulary, one
        teacher-forced pass, the prompt masked (OpenVLA's own fine-tuning); per sample, the mean
        over its ``action_dim`` tokens. Actions are tokenised with the checkpoint's
        ``unnorm_key`` statistics (q01..q99 to [-1, 1], clipped, 256 bins)."""
        inputs = self._inputs(obs, critic=False)
        expert = np.asarray(actions.detach().cpu() if isinstance(actions, torch.Tensor) else actions)[:, 0]
        tokens = torch.as_tensor(self.action_tokenizer.encode_actions(expert, self.action_stats), device=self.device)
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        full_ids = torch.cat([ids, tokens.to(ids.dtype)], dim=1)
        full_mask = torch.cat([mask, mask.new_ones(tokens.shape)], dim=1)
        embeds, mm_mask = self.vla.get_multimodal_embeddings(full_ids, inputs["pixel_values"], full_mask)
        hidden, _ = self._llm(embeds, mm_mask)
        n = tokens.shape[1]
        logits = self.vla.language_model.lm_head(hidden[:, -n - 1:-1]).float()  # position t predicts t + 1
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1), reduction="none")
        predicted = logits.detach().argmax(-1)
        decoded = self.action_tokenizer.decode_actions(predicted.cpu().numpy(), self.action_stats)
        return losses.view(-1, n).mean(-1), {
            "train/sft/token_accuracy": float((predicted == tokens).float().mean()),
            "train/sft/action_l1": float(np.abs(decoded - expert).mean())}


def ensure_tiny_checkpoint(path: str, action_dim: int, image_size: int = 224) -> None:
    """Make the tiny checkpoint at ``path`` (once, whichever worker asks first); one already there
    must take ``image_size`` images."""
    from .tiny import make_tiny_openvla

    make_tiny_once(path, lambda folder: make_tiny_openvla(folder, action_dim=action_dim, unnorm_key="tiny",
                                                          image_size=image_size))
    config_file = os.path.join(path, "config.json")
    if os.path.isfile(config_file):
        with open(config_file) as f:
            sizes = json.load(f).get("image_sizes")
        check_tiny_image_size(path, sizes[0] if sizes else None, image_size)


def build_openvla_policy(model_cfg: OpenVLAPolicyConfig, env_spec: Optional[EnvSpec] = None,
                        device=None) -> OpenVLAPolicy:
    """Policy builder ``(model_cfg, env_spec, device) -> OpenVLAPolicy`` (the family's ``builder``);
    the checkpoint's weights are loaded onto ``device`` directly."""
    if not model_cfg.path:
        raise ValueError("model.path: an OpenVLA checkpoint folder is required for model 'openvla'")
    dtype = compute_dtype(model_cfg.precision)
    if model_cfg.tiny_random_init:
        ensure_tiny_checkpoint(model_cfg.path, env_spec.action_dim if env_spec else 7, model_cfg.tiny_image_size)
    lora = model_cfg.lora
    policy = OpenVLAPolicy.from_pretrained(
        resolve_checkpoint(model_cfg.path, "the OpenVLA"), dtype=dtype, device=device,
        unnorm_key=model_cfg.unnorm_key,
        temperature=float(model_cfg.temperature),
        top_k=model_cfg.top_k,
        lora_rank=int(lora.rank) if lora.enabled else 0,
        lora_alpha=float(lora.alpha),
        lora_dropout=float(lora.dropout),
        lora_target_modules=list(lora.target_modules),
        lora_init=lora.init_weights,
        eval_temperature=model_cfg.eval_temperature,
        gradient_checkpointing=bool(model_cfg.gradient_checkpointing),
        value_head_hidden_sizes=tuple(model_cfg.value_head_hidden_sizes),
        store_raw_images=bool(model_cfg.store_raw_images),
        privileged_value_dim=privileged_value_dim(model_cfg, env_spec),
        value_head=model_cfg.builds_value_head(),
        image_preprocessing=model_cfg.image_preprocessing,
    )
    check_action_chunk(env_spec, "OpenVLA", chunk=1, action_dim=policy.action_dim, exact=True,
                       source="its action tokens; the dims are norm_stats[unnorm_key].action.q01's")
    return policy
