"""The typed configuration schema: every default lives here, once.

YAML files in ``configs/`` only compose and override these values; ``validate.py`` merges them
into this schema so that an unknown key or a value of the wrong type fails at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class ClusterConfig:
    # "ray": every worker is its own process; "local": the whole graph runs in this process
    # (threads), for tests and debugging.
    backend: str = "ray"
    # "auto": placement ids are GPUs when this machine has GPUs, CPU process slots otherwise.
    # "gpu": ids must be GPUs (fails at start-up where there are none). "cpu": always CPU slots.
    device_type: str = "auto"
    num_nodes: int = 1
    # component name(s) -> device ids, e.g. {"env,rollout,actor": "0-3"} or
    # {"actor": "0-3", "env": "0-1", "rollout": "2-3"}; ids as "0-3", "0,2,4-7" or "all".
    # (no default: every recipe states its placement)
    component_placement: Dict[str, str] = field(default_factory=dict)
    # torch intra-op threads per worker process on CPU (many processes share few cores).
    cpu_threads_per_worker: int = 1


@dataclass
class EnvConfig:
    name: str = "maniskill"
    task_id: str = "PushCube-v1"
    # sub-environments over all env worker processes (split evenly between them and their stages)
    num_envs: int = 16
    obs_mode: str = "state"  # "state" | "rgb"
    control_mode: Optional[str] = "pd_joint_delta_pos"
    sim_backend: str = "cpu"  # "cpu": one scene per sub-env, stepped in turn; "gpu": batched
    max_episode_steps: int = 50
    reward_mode: str = "normalized_dense"
    image_size: List[int] = field(default_factory=lambda: [128, 128])  # [height, width]
    # ManiSkill's dense tasks end the episode at success while the reward would keep paying:
    # treating that end as terminal teaches the policy to hover short of the goal.
    terminal_on_success: bool = False
    num_action_chunks: int = 1
    # >1 splits each env worker's sub-envs into stages so inference on one overlaps stepping of
    # the next.
    pipeline_stage_num: int = 1
    # natural-language instruction; None derives it from the task id
    instruction: Optional[str] = None
    # extra keyword arguments for the simulator's constructor
    extra_kwargs: Dict[str, Any] = field(default_factory=dict)
    # a float observation or reward beyond this magnitude is treated like a NaN: the sample is
    # dropped from the loss, counted in env/nonfinite_dropped and the sub-env reset (a finite but
    # absurd value would otherwise skew the observation statistics of the whole run)
    max_abs_value: float = 1.0e6


@dataclass
class LoraConfig:
    enabled: bool = False
    rank: int = 32
    alpha: int = 32
    dropout: float = 0.0
    target_modules: List[str] = field(default_factory=lambda: ["all-linear"])


@dataclass
class ModelConfig:
    name: str = "mlp"
    hidden_sizes: List[int] = field(default_factory=lambda: [256, 256, 256])
    activation: str = "tanh"  # "tanh" | "relu" | "gelu"
    init_log_std: float = -0.5
    normalize_obs: bool = True
    # cnn: conv channels of the image encoder and the size of its feature vector
    cnn_channels: List[int] = field(default_factory=lambda: [16, 32, 32])
    cnn_feature_dim: int = 256
    # large models: a local folder or a Hugging Face repo id, precision, memory savers
    path: Optional[str] = None
    precision: str = "float32"  # "float32" | "bfloat16"
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    # vision-language-action models (openvla): which norm_stats entry un-normalises actions,
    # sampling over the action tokens, the value head, and what the trajectory stores per step
    unnorm_key: Optional[str] = None
    temperature: float = 1.0
    top_k: Optional[int] = None
    value_head_hidden_sizes: List[int] = field(default_factory=lambda: [1024, 512])
    store_raw_images: bool = False  # uint8 images instead of float pixel values (smaller)
    # build a tiny random-init checkpoint at model.path when that folder does not exist yet
    # (CPU smoke runs and tests: it is saved in the official format and loaded back by path)
    tiny_random_init: bool = False


@dataclass
class AlgorithmConfig:
    gamma: float = 0.8
    gae_lambda: float = 0.9
    # the actor drops trajectories more than this many versions older than itself; the rollout
    # never runs further ahead. 0 = synchronous PPO.
    staleness_threshold: int = 1
    # the rollout store: an update starts once each actor rank holds this many version-valid
    # trajectories from every rollout stream (rollout rank x pipeline stage); all ranks train on
    # the same ones. One update trains on this many x env.num_envs x rollout.num_steps decisions.
    rollout_store_size_per_rank: int = 1
    # at least this fraction of the trajectories of an update were produced by the actor's current
    # version (lag 0); otherwise the actor waits for fresh ones. 0 = any version-valid mix.
    on_policy_min_ratio: float = 0.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual clip for negative advantages
    # samples whose proximal/behaviour weight exceeds this are masked out; None disables
    behave_weight_threshold: Optional[float] = 2.0
    value_clip: Optional[float] = None  # None: no clipping around the rollout-time value
    huber_delta: float = 10.0
    value_loss_coef: float = 0.5
    entropy_coef: float = 0.0
    normalize_advantages: bool = True
    update_epochs: int = 8
    target_kl: Optional[float] = 0.1  # stop the epoch loop once proximal KL exceeds it
    reward_scale: float = 1.0


@dataclass
class RolloutConfig:
    num_steps: int = 50  # decisions per trajectory (T)
    # True: log pi_proximal from a forward pass before the update; False: interpolate by version
    recompute_logprobs: bool = True


@dataclass
class ActorConfig:
    # samples per optimiser step over all ranks; the rollout batch splits into minibatches of it
    global_batch_size: int = 100
    # per rank, per forward/backward (gradient accumulation); capped at the rank's share of a minibatch
    micro_batch_size: int = 100
    lr: float = 3e-4
    value_lr: Optional[float] = None  # None: same as lr
    critic_warmup_steps: int = 0  # first updates train only the value head
    adam_eps: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 0.5


@dataclass
class LoggerConfig:
    log_path: str = "logs/default"
    tensorboard: bool = True


@dataclass
class RunnerConfig:
    max_steps: int = 200  # training steps (PPO updates)
    max_env_steps: Optional[int] = None  # stop earlier once this many env steps were consumed
    val_check_interval: int = 10  # evaluate every N steps (0 disables)
    eval_episodes: int = 32
    eval_num_envs: int = 8
    save_interval: int = 50  # checkpoint every N steps (0: only on exit)
    resume_dir: Optional[str] = None
    seed: int = 0
    logger: LoggerConfig = field(default_factory=LoggerConfig)


@dataclass
class TrainConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
