"""Config of the Pi0 policy family (``model.name: pi0``): every key and its default.

(``configuration_pi0.py`` beside it reads the checkpoint's own architecture.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Tuple

from embodied_async.config.checks import bound, choice, require
from embodied_async.config.schema import ModelConfig
from models.checkpoints import check_checkpoint_path, fetch_checkpoint, resolve_checkpoint
from models.configuration_lora import LoraConfig

# how an action chunk is drawn (models/pi0/chain.py): deterministic ODE, an SDE, or noise added by a head
NOISE_METHODS = ("flow_sde", "flow_noise", "action_gaussian", "flow_ode")
CHAIN_LOGPROBS = ("joint", "step_mean")
TOKENIZER_FILES = ["tokenizer*", "special_tokens_map.json", "added_tokens.json", "*.model"]
# Gemma's and SigLIP's linear layers (attention and MLP)
GEMMA_SIGLIP_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "out_proj",
                        "fc1", "fc2"]


@dataclass
class Pi0LoraConfig(LoraConfig):
    target_modules: List[str] = field(default_factory=lambda: list(GEMMA_SIGLIP_LINEARS))
    # where the adapters go: "paligemma" (SigLIP + Gemma 2B), "expert" (the action expert) or both
    parts: List[str] = field(default_factory=lambda: ["paligemma", "expert"])


@dataclass
class Pi0PolicyConfig(ModelConfig):
    """Pi0 (LeRobot-format checkpoints, loaded natively): a flow-matching action chunk per decision."""

    name: str = "pi0"
    # a LeRobot Pi0 folder (config.json, model.safetensors, policy_preprocessor.json) or hub repo id
    path: Optional[str] = None
    # how a chain is drawn for training (noise only ever enters the executed entries of the chunk):
    # "flow_sde" (one Gaussian SDE step per sample), "flow_noise" (every step noised by a learned
    # std), "action_gaussian" (a deterministic chain from a zero start, the executed action drawn
    # from N(chain's end, action_std^2): the log-prob covers all of the policy's randomness) or
    # "flow_ode" (deterministic: no log-prob, evaluation only)
    noise_method: str = "flow_sde"
    num_steps: Optional[int] = None  # denoising steps; None: the checkpoint's num_inference_steps
    noise_level: float = 0.5  # flow_sde: scale of the SDE's noise
    noise_std_bounds: List[float] = field(default_factory=lambda: [0.08, 0.16])  # flow_noise: [low, high]
    # flow_noise: the chain's log-prob as the sum of its steps' ("joint": the exact density of the
    # chain given its start) or their mean ("step_mean", RLinf's joint_logprob=false)
    chain_logprob: str = "joint"
    # action_gaussian: the executed action's initial std (normalised action units) and whether RL learns it
    action_std: float = 0.1
    learn_action_std: bool = True
    # std of every chain's starting point, rolling out and evaluating: 1 draws it from the flow's
    # N(0, I) as LeRobot samples; 0 starts every chain from zero, so a sampled chain's randomness
    # lies wholly in its stochastic steps, the part its log-prob credits. With a random start most
    # of the actions' spread comes from a draw no log-prob term sees, and RL's advantages mostly
    # reward that luck (benchmarks/2026-12-04-pi0-initial-noise.md). null: 1, but 0 for
    # action_gaussian (whose chain starts from a fixed point)
    initial_noise_scale: Optional[float] = None
    # what the value head reads: the action expert ("expert"), the prefix, or the env's privileged
    # state vector ("privileged_states", with env.privileged_states=true: an asymmetric critic that
    # sees the simulator's state while the policy sees images and proprioception; training only)
    value_input: str = "expert"
    value_head_hidden_sizes: List[int] = field(default_factory=lambda: [512, 128])
    noise_head_hidden_sizes: List[int] = field(default_factory=lambda: [128, 64])
    # observation keys filling the checkpoint's cameras in order; keys the env lacks are left out,
    # and so are their cameras: no tokens (LeRobot feeds a blank, fully masked image, which gives
    # the same outputs at the cost of running it)
    camera_keys: List[str] = field(default_factory=lambda: ["main_images", "wrist_images"])
    lora: Pi0LoraConfig = field(default_factory=Pi0LoraConfig)
    gradient_checkpointing: bool = False
    pad_after_scaling: bool = False  # pad images like openpi (-1) rather than LeRobot (-3)
    # state/action statistics ({"observation.state.mean": [...], ...}) and modes ({"STATE": "MEAN_STD"});
    # empty: the ones LeRobot saved beside the checkpoint
    normalization_stats: Dict[str, List[float]] = field(default_factory=dict)
    normalization_modes: Dict[str, str] = field(default_factory=dict)
    # the PaliGemma tokenizer: a folder or hub repo id; "words" is a stand-in for tiny test checkpoints
    tokenizer: str = "google/paligemma-3b-pt-224"
    # build a tiny random-init checkpoint at model.path when that folder does not exist yet
    tiny_random_init: bool = False
    # the side of the images the tiny checkpoint's SigLIP takes (224 as released; 112 has a quarter
    # of the patches, for CPU runs); a tiny checkpoint already at model.path must have been made so
    tiny_image_size: int = 224

    builder: ClassVar[str] = "models.pi0.policy_pi0:build_pi0_policy"
    logprob_types: ClassVar[Tuple[str, ...]] = ("chunk_level", "token_level")
    cpu_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_pi0_tiny"
    memory_model: ClassVar[Optional[str]] = "models.pi0.memory"
    default_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_pi0"
    renamed_recipe_parts: ClassVar[Dict[str, str]] = {"_openpi": "_pi0"}  # recipes are named by family
    exporter: ClassVar[Optional[str]] = "models.pi0.export:export_pi0"  # LeRobot's Pi0 policy layout


    @classmethod
    def recognizes(cls, target: str, config: Optional[Dict]) -> bool:
        """LeRobot's checkpoint format (``type`` "pi0"), or a hub id naming Pi0."""
        if config is not None:
            return config.get("type") == "pi0"
        return "pi0" in target.lower()

    def checkpoint_folder(self) -> Optional[str]:
        return resolve_checkpoint(self.path, "the Pi0")

    def fetch(self) -> None:
        fetch_checkpoint(self.path, self.tiny_random_init, "the Pi0")
        if self.tokenizer != "words":  # the tokenizer's files only, not the 3B model beside them
            fetch_checkpoint(self.tokenizer, False, "the PaliGemma tokenizer", "model.tokenizer", TOKENIZER_FILES)

    def chain_start_scale(self) -> float:
        """``initial_noise_scale`` with null resolved: 0 for action_gaussian, else 1."""
        if self.initial_noise_scale is not None:
            return float(self.initial_noise_scale)
        return 0.0 if self.noise_method == "action_gaussian" else 1.0

    def check(self) -> None:
        choice(self.noise_method, "model.noise_method", NOISE_METHODS)
        choice(self.chain_logprob, "model.chain_logprob", CHAIN_LOGPROBS)
        require(self.chain_logprob == "joint" or self.noise_method == "flow_noise",
                f"model.chain_logprob={self.chain_logprob} with model.noise_method={self.noise_method}: the per-step "
                "mean is flow_noise's (the other methods' log-prob has one term): set model.chain_logprob=joint")
        require(self.noise_method != "action_gaussian" or not self.initial_noise_scale,
                f"model.initial_noise_scale={self.initial_noise_scale} with model.noise_method=action_gaussian: its "
                "chain starts from a fixed point (the log-prob would miss a random start): set it to 0 or null")
        bound(self.action_std, "model.action_std", lambda v: 0.0067 <= v <= 7.4, "must be in [0.0067, 7.4]",
              "use e.g. 0.1 (normalised action units)")
        require(self.noise_method != "flow_ode",
                "model.noise_method=flow_ode draws no stochastic step, so its chains have no log-prob to train on "
                "(evaluation always samples with it): use flow_sde or flow_noise")
        require(self.lora.dropout == 0.0 and "all-linear" not in self.lora.target_modules,
                f"model.lora: dropout {self.lora.dropout} and target_modules {list(self.lora.target_modules)}: Pi0 "
                "takes module names (dropout would make the actor's re-scoring differ from the rollout's draw)")
        choice(self.value_input, "model.value_input", ("expert", "prefix", "privileged_states"))
        bound(self.num_steps, "model.num_steps", lambda v: v >= 1, "must be >= 1", "use e.g. 4",
              null="for the checkpoint's own number")
        bound(self.noise_level, "model.noise_level", lambda v: v > 0, "must be > 0", "use e.g. 0.5")
        bound(self.initial_noise_scale, "model.initial_noise_scale", lambda v: v >= 0, "must be >= 0",
              "use 1 (the flow's own noise) or 0 (every chain starts from zero)", null="for the method's own")
        low_high = list(self.noise_std_bounds)
        require(len(low_high) == 2 and 0 < low_high[0] <= low_high[1],
                f"model.noise_std_bounds={low_high} must be [low, high] with 0 < low <= high; use e.g. [0.08, 0.16]")
        bound(self.tiny_image_size, "model.tiny_image_size", lambda v: v >= 28 and v % 14 == 0,
              "must be a multiple of the 14 px patch, at least 28", "use 224 or 112")
        self.lora.check("model.lora")
        unknown = sorted(set(self.lora.parts) - {"paligemma", "expert"})
        require(not unknown and bool(self.lora.parts),
                f"model.lora.parts={list(self.lora.parts)}: use one or both of ['paligemma', 'expert']")
        check_checkpoint_path(self.path, self.tiny_random_init, "lerobot/pi0_base", "a LeRobot Pi0")
