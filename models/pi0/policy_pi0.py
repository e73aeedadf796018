"""Pi0 as an RL policy: sampled denoising chains with log-probs, a value head, LoRA.

One decision = one action chunk: the env executes its first ``executed_actions`` actions (the
env's ``num_action_chunks``) of the real ``action_dim`` dimensions. ``predict`` draws a chain
(``model.noise_method``; evaluation uses the deterministic ``flow_ode`` sampler) and stores it in
``forward_inputs`` with the camera frames, prompt and state, so that ``evaluate`` re-scores that
same chain under the current weights (``models/pi0/chain.py``).

Value: a head on the action expert's output (default), on the prefix, or on the env's
privileged state vector (``value_input``). The expert's output depends on the noisy chunk it is
given; the value reads it for a fixed probe (zero chunk at t=1, averaged over the executed action
tokens), so V depends on the observation alone and is the same whether it is asked during
sampling, for bootstrapping or in training. The privileged critic (``env.privileged_states``)
sees the simulator's state, which the policy never does; it is a training device: evaluation
and the supervised loss run without it, and a value-free run builds no head at all.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

from embodied_async.data import PolicyOutput
from embodied_async.normalization import InputStatistics
from models.common import LOG_STD_MAX, LOG_STD_MIN, as_tensor, head_output, inference, make_mlp, zero_values
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

from .chain import ChainSettings, chain_log_prob, sample_chain
from .modeling_pi0 import Pi0Model
from .processing_pi0 import ACTION_KEY, STATE_KEY, Normalization, camera_images, pad_to, prompt_tokens

VALUE_INPUTS = ("expert", "prefix", "privileged_states")
LORA_PARTS = ("paligemma", "expert")


class Pi0Policy(nn.Module):
    """``Pi0Model`` (``model``) + value head (+ noise head for ``flow_noise``) behind the Policy protocol.

    Args:
        model: a loaded :class:`Pi0Model`.
        normalization: state / action statistics (LeRobot's, saved beside the checkpoint).
        tokenize: text -> token ids with BOS (the checkpoint's PaliGemma tokenizer, or a stand-in).
        settings: the chain's method, steps, executed actions and real action dims.
        camera_keys: observation keys filling the model's cameras in order (``main_images``,
            ``wrist_images``); cameras without a key are left out (LeRobot masks them: the same outputs).
        lora_rank / lora_alpha / lora_targets / lora_parts: peft LoRA on "paligemma", "expert" or
            both; every other weight of the model is then frozen. 0: the whole model trains.
        pad_after_scaling: images padded like openpi (-1) instead of LeRobot (-3).
    """

    value_parameter_prefixes = ("value_head.",)
    # the heads only RL trains: a supervised checkpoint lacks them, and RL from it starts them fresh
    rl_only_parameter_prefixes = ("value_head.", "noise_head.", "action_log_std")
    # "token_level": log-probs per executed action entry (build_policy sets it from algorithm.logprob_type)
    logprob_type = "chunk_level"

    def __init__(self, model: Pi0Model, normalization: Normalization, tokenize: Callable[[str], List[int]],
                 settings: ChainSettings, camera_keys: Sequence[str] = ("main_images",), value_input: str = "expert",
                 value_head_hidden_sizes: Sequence[int] = (512, 128),
                 noise_head_hidden_sizes: Sequence[int] = (128, 64),
                 lora_rank: int = 0, lora_alpha: float = 32, lora_targets: Sequence[str] = (),
                 lora_parts: Sequence[str] = LORA_PARTS, lora_init=True, gradient_checkpointing: bool = False,
                 pad_after_scaling: bool = False, privileged_value_dim: int = 0, value_head: bool = True,
                 action_std: float = 0.1, learn_action_std: bool = True):
        super().__init__()
        if value_input not in VALUE_INPUTS:
            raise ValueError(f"value_input={value_input!r}; use one of {VALUE_INPUTS}")
        arch = model.arch
        if len(camera_keys) > len(arch.cameras):
            raise ValueError(f"{len(camera_keys)} camera keys for a checkpoint with {len(arch.cameras)} cameras "
                             f"({arch.cameras})")
        self.model, self.tokenize, self.settings = model, tokenize, settings
        # the statistics as buffers (published with the weights, kept in checkpoints), so that
        # fine-tuning on a dataset can bring its own; the modes and eps stay plain settings
        self._modes, self._eps = dict(normalization.modes), normalization.eps
        self._stat_buffers = {key: key.replace(".", "__") for key in normalization.stats}
        self.statistics = InputStatistics(**{name: normalization.stats[key].double()
                                             for key, name in self._stat_buffers.items()})
        self.camera_keys, self.value_input, self.pad_after_scaling = list(camera_keys), value_input, pad_after_scaling
        dtype = model.action_out_proj.weight.dtype
        if value_input == "privileged_states" and value_head and privileged_value_dim < 1:
            raise ValueError("value_input='privileged_states' needs privileged_value_dim: the size of the env's "
                             "privileged state vector")
        self.privileged_value = value_head and value_input == "privileged_states"
        hidden_sizes = list(value_head_hidden_sizes)
        if not value_head:  # a value-free run (algorithm.adv_type=grpo): zero values, nothing to train
            self.value_head = None
        elif self.privileged_value:
            self.value_head = PrivilegedValueHead(privileged_value_dim, hidden_sizes, dtype)
        else:
            width = arch.expert.width if value_input == "expert" else arch.vlm.width
            self.value_head = make_mlp(width, hidden_sizes, 1, "gelu", out_std=1.0).to(dtype)
        self.noise_head = None
        if settings.method == "flow_noise":
            self.noise_head = make_mlp(arch.expert.width, list(noise_head_hidden_sizes), arch.max_action_dim, "tanh",
                                       out_std=0.01).to(dtype)
        if settings.method == "action_gaussian":  # the executed action's std per dimension (normalised units)
            log_std = torch.full((arch.max_action_dim,), math.log(action_std))
            if learn_action_std:
                self.action_log_std = nn.Parameter(log_std)
            else:
                self.register_buffer("action_log_std", log_std)
        else:
            self.action_log_std = None
        if lora_rank > 0:
            self._add_lora(lora_rank, lora_alpha, list(lora_targets), list(lora_parts), lora_init)
        model.gradient_checkpointing = gradient_checkpointing
        self.supervised_horizon = arch.chunk_size  # the flow loss trains the whole chunk

    def _add_lora(self, rank: int, alpha: float, targets: List[str], parts: List[str], init) -> None:
        unknown = sorted(set(parts) - set(LORA_PARTS))
        if unknown or not parts:
            raise ValueError(f"lora parts {parts}: use one or both of {list(LORA_PARTS)}")
        roots = {"paligemma": self.model.paligemma, "expert": self.model.paligemma_with_expert.gemma_expert}
        inject_lora(self.model, [roots[part] for part in parts], rank, alpha, targets, init=init)

    @property
    def normalization(self) -> Normalization:
        """State / action normalisation with the current statistics (the buffers)."""
        return Normalization(modes=self._modes, eps=self._eps,
                             stats={key: getattr(self.statistics, name) for key, name in self._stat_buffers.items()})

    def set_input_statistics(self, stats) -> None:
        """Fine-tuning on a dataset: its state and action statistics replace the checkpoint's
        (those the normalisation modes use), as LeRobot's training takes the dataset's."""
        for name, key in (("states", STATE_KEY), ("actions", ACTION_KEY)):
            for stat in ("mean", "std", "min", "max"):
                buffer = self._stat_buffers.get(f"{key}.{stat}")
                if name in stats and buffer is not None:
                    self.statistics.assign(buffer, stats[name][stat])

    def fsdp_units(self) -> List[nn.Module]:
        """SigLIP layers and both Gemma stacks' layers, one FSDP unit each."""
        vision = self.model.paligemma.model.vision_tower.vision_model.encoder.layers
        return list(vision) + list(self.model.language_model.layers) + list(self.model.expert.layers)

    @property
    def device(self) -> torch.device:
        return self.model.action_out_proj.weight.device

    def _action_std(self):
        """``action_gaussian``'s std per action dimension (clamped as the state policies' log std)."""
        if self.action_log_std is None:
            return None
        return self.action_log_std.float().clamp(LOG_STD_MIN, LOG_STD_MAX).exp()

    # ---- inputs ----------------------------------------------------------------------------
    def observation_inputs(self, obs, critic: bool = True) -> Dict[str, torch.Tensor]:
        """What re-scoring needs besides the chain: raw frames, prompt ids, padded state (and, for a
        privileged critic, the env's privileged state: needed when ``critic``, kept when given)."""
        arch, device = self.model.arch, self.device
        inputs = {f"camera_{i}": as_tensor(obs[key], dtype=torch.uint8, device=device)
                  for i, key in enumerate(self.camera_keys)}
        tokens, mask = prompt_tokens(list(obs["task_descriptions"]), self.tokenize, arch.tokenizer_max_length)
        state = as_tensor(obs["states"], device=device)
        state = self.normalization.normalize(state, STATE_KEY, "STATE")
        inputs.update(tokens=tokens.to(device), token_mask=mask.to(device), state=pad_to(state, arch.max_state_dim))
        if self.privileged_value and (critic or "privileged_states" in obs):
            inputs["privileged_states"] = privileged_states_input(obs, self.device)
        return inputs

    def _prefix(self, inputs: Dict[str, torch.Tensor]):
        """-> ((per-layer keys/values, valid mask), final prefix hidden states)."""
        arch = self.model.arch
        batch = inputs["state"].shape[0]
        height, width = arch.image_size
        # LeRobot feeds an absent camera as a blank image whose tokens are all masked. Masked tokens
        # neither advance the position ids nor receive attention, so leaving the camera out gives
        # the same outputs without running SigLIP and the language model over its 256 tokens.
        images, masks = [], []
        for i in range(len(arch.cameras)):
            frames = inputs.get(f"camera_{i}")
            if frames is not None:
                images.append(camera_images(frames, height, width, self.pad_after_scaling, self.device))
                masks.append(torch.ones(batch, dtype=torch.bool, device=self.device))
        dtype = self.model.action_out_proj.weight.dtype
        embs, pad, blocks = self.model.embed_prefix([im.to(dtype) for im in images], masks, inputs["tokens"],
                                                    inputs["token_mask"])
        cache, hidden = self.model.run_prefix(embs, pad, blocks)
        return (cache, pad), hidden

    def _value(self, prefix, prefix_hidden, state: torch.Tensor, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        if self.value_head is None or (self.privileged_value and "privileged_states" not in inputs):
            return zero_values(state)  # value-free, or an evaluation without the critic's input
        if self.privileged_value:
            return self.value_head(inputs["privileged_states"])
        if self.value_input == "prefix":  # mean over the valid prefix tokens
            valid = prefix[1][..., None].to(prefix_hidden.dtype)
            features = (prefix_hidden * valid).sum(1) / valid.sum(1).clamp_min(1)
        else:
            arch = self.model.arch
            probe = torch.zeros(state.shape[0], arch.chunk_size, arch.max_action_dim, device=state.device)
            times = torch.ones(state.shape[0], device=state.device)
            _, expert_out = self.model.run_suffix(*prefix, state, probe, times)
            features = expert_out[:, :self.settings.executed_actions].mean(1)
        return head_output(self.value_head, features)

    # ---- protocol --------------------------------------------------------------------------
    def predict(self, obs, mode: str = "train") -> PolicyOutput:
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        arch, settings = self.model.arch, self.settings
        with inference(self):
            inputs = self.observation_inputs(obs, critic=mode == "train")
            prefix, hidden = self._prefix(inputs)
            state = inputs["state"]
            noise = settings.initial_noise_scale * torch.randn(state.shape[0], arch.chunk_size, arch.max_action_dim,
                                                               device=self.device)
            method = settings if mode == "train" else ChainSettings(**{**settings.__dict__, "method": "flow_ode"})
            drawn = sample_chain(self.model, prefix, state, noise, method, self.noise_head,
                                 per_dimension=self.logprob_type == "token_level", action_std=self._action_std())
            values = self._value(prefix, hidden, state, inputs)
            if self.privileged_value and mode == "train":  # the critic's running statistics learn from it
                self.value_head.observe(inputs["privileged_states"])
        actions = self.normalization.unnormalize(drawn["actions"][:, :settings.executed_actions, :settings.action_dim]
                                                 .float(), ACTION_KEY, "ACTION")
        inputs.update(chain=drawn["chain"].float(), stochastic_step=drawn["stochastic_step"])
        return PolicyOutput(actions=actions, logprobs=drawn["logprob"], values=values, forward_inputs=inputs)

    def value(self, obs) -> torch.Tensor:
        """Values [B]; a privileged critic or none needs no pass through the model."""
        with inference(self):
            if self.value_head is None:
                return torch.zeros(len(obs["task_descriptions"]), dtype=torch.float32, device=self.device)
            if self.privileged_value:
                return self.value_head(privileged_states_input(obs, self.device))
            inputs = self.observation_inputs(obs)
            prefix, hidden = self._prefix(inputs)
            return self._value(prefix, hidden, inputs["state"], inputs)

    def evaluate(self, forward_inputs: Dict[str, torch.Tensor], actions=None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Re-score the stored chains -> (logprobs, entropy, values) [B] (logprobs per executed action
        entry, [B, K], under token_level), with gradients. ``actions`` is unused: the chain defines
        the decision exactly."""
        inputs = {k: v.to(self.device) for k, v in forward_inputs.items()}
        prefix, hidden = self._prefix(inputs)
        state = inputs["state"]
        logprobs, entropy = chain_log_prob(self.model, prefix, state, inputs["chain"], inputs["stochastic_step"],
                                           self.settings, self.noise_head,
                                           per_dimension=self.logprob_type == "token_level",
                                           action_std=self._action_std())
        return logprobs, entropy, self._value(prefix, hidden, state, inputs)


    def supervised_loss(self, obs, actions, action_pad) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The flow-matching loss as LeRobot trains Pi0: normalised actions padded to the model's
        action size, time ~ Beta(1.5, 1) scaled into [0.001, 1], squared error of the velocity;
        actions past the episode's end count as zeros in the mean. One value per sample."""
        arch = self.model.arch
        inputs = self.observation_inputs(obs, critic=False)
        prefix, _ = self._prefix(inputs)
        target = self.normalization.normalize(as_tensor(actions, device=self.device), ACTION_KEY, "ACTION")
        target = pad_to(target[:, :arch.chunk_size], arch.max_action_dim)
        batch = target.shape[0]
        noise = torch.randn_like(target)
        time = torch.distributions.Beta(1.5, 1.0).sample((batch,)).to(self.device) * 0.999 + 0.001
        out = self.model.flow_loss(prefix, inputs["state"], target, noise, time)
        valid = ~as_tensor(action_pad, dtype=torch.bool, device=self.device)[:, :arch.chunk_size]
        losses = (out["loss"].float() * valid[..., None]).mean(dim=(1, 2))
        return losses, {"train/sft/flow_loss": float(losses.detach().mean())}


# ---------------------------------------------------------------------------------- building

WORDS_TOKENIZER = "words"


def words_tokenizer(vocab_size: int) -> Callable[[str], List[int]]:
    """A tokenizer stand-in for tiny test checkpoints: BOS (2), one stable id per word, "\\n" (108)."""
    import hashlib

    def tokenize(text: str) -> List[int]:
        ids = [3 + int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "little") % (vocab_size - 3)
               for w in text.split()]
        return [2] + ids + ([108] if text.endswith("\n") else [])
    return tokenize


def load_tokenizer(name: str, vocab_size: int) -> Callable[[str], List[int]]:
    """``model.tokenizer``: the PaliGemma tokenizer from a folder or the hub cache, or the stand-in."""
    if name == WORDS_TOKENIZER:
        return words_tokenizer(vocab_size)
    from transformers import AutoTokenizer  # lazy: importing transformers takes seconds

    from models.checkpoints import resolve_checkpoint

    from .configuration_policy import TOKENIZER_FILES

    folder = resolve_checkpoint(name, "the PaliGemma tokenizer", "model.tokenizer", TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return lambda text: list(tokenizer(text, add_special_tokens=True)["input_ids"])


def _normalization(model_cfg, folder: str):
    """The normalisation statistics (``model.normalization_stats``, else the checkpoint's) and where
    they come from, for messages."""
    from .processing_pi0 import PREPROCESSOR_FILE, normalization_from_config, read_normalization

    if model_cfg.normalization_stats:
        normalization = normalization_from_config(model_cfg.normalization_stats, model_cfg.normalization_modes)
        return normalization, "model.normalization_stats"
    normalization = read_normalization(folder)
    if normalization is None:
        raise FileNotFoundError(f"{folder} holds no normalisation statistics ({PREPROCESSOR_FILE}): give "
                                "them as model.normalization_stats / model.normalization_modes")
    return normalization, f"{folder}/{PREPROCESSOR_FILE}"


def _check_state_dim(state_dim: int, arch, path: str) -> None:
    """The env's state fits the checkpoint's padded state; another length than the one it was
    trained on is noted (fine-tuning on another robot pads the same)."""
    if state_dim > arch.max_state_dim:
        raise ValueError(f"the env's state has {state_dim} values, more than the {arch.max_state_dim} the checkpoint "
                         f"{path} takes (config.json max_state_dim): choose an env obs_mode or robot with "
                         "a shorter state")
    if arch.state_dim and state_dim and state_dim != arch.state_dim:
        print(f"[pi0] note: the checkpoint was trained on a {arch.state_dim}-value state and this env's has "
              f"{state_dim}; both are zero-padded to {arch.max_state_dim}", flush=True)


def build_pi0_policy(model_cfg, env_spec=None, device=None) -> Pi0Policy:
    """Policy builder ``(model_cfg, env_spec, device) -> Pi0Policy`` (the family's ``builder``)."""

    from models.checkpoints import resolve_checkpoint

    from .modeling_pi0 import load_pi0
    from .tiny import make_tiny_pi0

    keys = [k for k in model_cfg.camera_keys if env_spec is None or k in env_spec.obs_shapes]
    if not keys:
        raise ValueError(f"none of model.camera_keys={list(model_cfg.camera_keys)} is an observation of this env "
                         f"({sorted(env_spec.obs_shapes)}): the policy would see no camera. Use an rgb obs_mode or "
                         "name the env's image keys")
    dtype = compute_dtype(model_cfg.precision)
    if model_cfg.tiny_random_init:
        state_dim = env_spec.obs_shapes["states"][0] if env_spec else 8
        make_tiny_once(model_cfg.path, lambda folder: make_tiny_pi0(
            folder, state_dim, env_spec.action_dim if env_spec else 7,
            cameras=["base_0_rgb", "left_wrist_0_rgb"][:max(1, len(keys))], image_size=model_cfg.tiny_image_size))
    folder = resolve_checkpoint(model_cfg.path, "the Pi0")
    model = load_pi0(folder, dtype=dtype, device=device)
    arch = model.arch
    if model_cfg.tiny_random_init:
        check_tiny_image_size(model_cfg.path, arch.image_size[0], model_cfg.tiny_image_size)
    normalization, source = _normalization(model_cfg, folder)
    executed = env_spec.num_action_chunks if env_spec else 1
    action_dim = env_spec.action_dim if env_spec else arch.action_dim
    state_dim = env_spec.obs_shapes["states"][0] if env_spec else arch.state_dim
    check_action_chunk(env_spec, "Pi0", chunk=arch.chunk_size, action_dim=arch.max_action_dim, exact=False,
                       source=f"its checkpoint's chunk of {arch.chunk_size} x {arch.max_action_dim}, padded")
    _check_state_dim(state_dim, arch, model_cfg.path)
    if state_dim:
        normalization.check_dims(state_dim, action_dim, source)
    settings = ChainSettings(model_cfg.noise_method, model_cfg.num_steps or arch.num_inference_steps, executed,
                             action_dim, model_cfg.noise_level, tuple(model_cfg.noise_std_bounds),
                             model_cfg.chain_start_scale(), model_cfg.chain_logprob)
    lora = model_cfg.lora
    return Pi0Policy(model, normalization, load_tokenizer(model_cfg.tokenizer, arch.vocab_size), settings,
                     camera_keys=keys, value_input=model_cfg.value_input,
                     value_head_hidden_sizes=model_cfg.value_head_hidden_sizes,
                     noise_head_hidden_sizes=model_cfg.noise_head_hidden_sizes,
                     lora_rank=int(lora.rank) if lora.enabled else 0, lora_alpha=float(lora.alpha),
                     lora_targets=list(lora.target_modules), lora_parts=list(lora.parts), lora_init=lora.init_weights,
                     gradient_checkpointing=model_cfg.gradient_checkpointing,
                     pad_after_scaling=model_cfg.pad_after_scaling,
                     privileged_value_dim=privileged_value_dim(model_cfg, env_spec),
                     value_head=model_cfg.builds_value_head(), action_std=model_cfg.action_std,
                     learn_action_std=model_cfg.learn_action_std)

