"""The typed configuration schema of what every run has: every default lives here, once.

The ``model`` and ``env`` sections hold a policy family's and an env family's own config: a
subclass of ``ModelConfig`` / ``EnvConfig`` that the family declares next to its code and
registers (``embodied_async.registry``). YAML files in ``configs/`` only compose and override
these values; ``validate.py`` merges them into the schema so that an unknown key or a value of the
wrong type fails at start-up, naming the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Tuple

from embodied_async.config.mode_sections import CollectConfig, EvaluationConfig

try:
    from omegaconf import MISSING
except ImportError:  # scripts/gpu_check.py reads these classes on machines without omegaconf
    MISSING = "???"  # omegaconf's own marker value


# the graph's channels (scheduler.graph_channels.GraphChannels), by name
GRAPH_CHANNELS = ("env_outputs", "actions", "trajectories", "weights")


@dataclass
class ClusterConfig:
    # "ray": every worker is its own process; "local": the whole graph in this process (threads), for tests
    backend: str = "ray"
    # "auto": placement ids are GPUs when this machine has GPUs, CPU process slots otherwise.
    # "gpu": ids must be GPUs (fails at start-up where there are none). "cpu": always CPU slots.
    device_type: str = "auto"
    num_nodes: int = 1
    # component name(s) -> device ids, e.g. {"env,rollout,actor": "0-3"} or {"actor": "0-3", "env": "0-1",
    # "rollout": "2-3"}; ids as "0-3", "0,2,4-7" or "all" (no default: every recipe states its placement)
    component_placement: Dict[str, str] = field(default_factory=dict)
    cpu_threads_per_worker: int = 1  # torch intra-op threads per worker process on CPU (many share few cores)
    # under Ray: "auto": point to point over a Unix socket where sender and receiver share a node, through a
    # channel actor otherwise; "ray": always channel actors (slower; benchmarks/throughput.py compares)
    channel_transport: str = "auto"
    # a drill (tests/e2e/test_failure_drills.py): a slow link, e.g. on the command line
    # +cluster.inject_channel_latency_s.trajectories=0.5: every item
    # on that channel of the graph (env_outputs, actions, trajectories, weights) reaches its consumer
    # this many seconds after it arrived
    inject_channel_latency_s: Dict[str, float] = field(default_factory=dict)


# model.precision: the names of the torch dtypes a policy computes in (and keeps frozen weights in)
PRECISIONS = ("float32", "bfloat16")
LOGPROB_TYPES = ("chunk_level", "token_level")  # algorithm.logprob_type


@dataclass
class EnvConfig:
    """What every env family's config has; a family subclasses it next to its code
    (``envs/<package>/configuration_<package>.py``) with its own keys, and registers the subclass.

    The framework reads only these fields. ``builder`` names the callable that builds the env:
    ``builder(env_cfg, num_envs, seed) -> Env`` (``embodied_async.contracts.Env``).
    """

    name: str = MISSING  # the family: a registered name (registry.families("env"))
    # sub-environments over all env worker processes (split evenly between them and their stages)
    num_envs: int = 16
    # actions per decision: the env executes a chunk in order inside one step
    num_action_chunks: int = 1
    pipeline_stage_num: int = 1  # >1: each env worker's sub-envs in stages, inference on one overlapping the next
    # Whether the episode ends when the task reports success (false: it runs on to its time limit;
    # only a family whose tasks can go on past a success allows it: can_run_past_success).
    end_on_success: bool = True
    # Whether that end at success is terminal (data.bootstrap_flags, the rule every family applies).
    # Dense tasks that end at success while the reward would keep paying must bootstrap there:
    # treating that end as terminal teaches the policy to hover short of the goal.
    terminal_on_success: bool = False
    # a float observation or reward beyond this magnitude counts as a NaN (env.on_nonfinite): a finite
    # but absurd value (1e30 from an exploding simulator) would skew the run's observation statistics
    max_abs_value: float = 1.0e6
    # a NaN/inf (or beyond max_abs_value) observation or reward: "stop" ends the run in one line naming
    # the env worker, sub-env, key, value, step and the fix (a broken simulator or task shows at once);
    # "drop" drops the sample from the loss, resets its sub-env and counts it in env/nonfinite_dropped
    on_nonfinite: str = "stop"
    # observations carry "video_frames" [B, H, W, 3] uint8 of video_size (final_obs: each episode's
    # last frame); the evaluation turns it on for its own env when runner.eval_video is true
    render_video: bool = False
    video_size: List[int] = field(default_factory=lambda: [256, 256])  # [height, width]
    # observations also carry "privileged_states" [B, D] float32: the vector the task gives in its
    # state observation mode (object poses included), for a state policy acting as the teacher
    # while the env renders what a VLA sees (a teacher's collection, runner.mode=collect, turns it on)
    privileged_states: bool = False
    # several tasks of the family in one run (Meta-World MT10 style): sub-env i of every policy
    # batch runs tasks[i % len(tasks)] in place of the family's own task key (task_key), so each
    # batch and the evaluation hold every task alike; the evaluation reports each task's success
    # (eval/success_rate/<task>) beside the overall rate. Empty: the one task of the task key.
    tasks: List[str] = field(default_factory=list)
    # drills and benchmarks: every step of these env workers (ranks) takes slow_worker_delay_s longer
    slow_workers: List[int] = field(default_factory=list)
    slow_worker_delay_s: float = 0.0

    builder: ClassVar[str] = ""  # "module:callable"
    # the family's key naming its task (e.g. "task"); None: the family cannot run env.tasks
    task_key: ClassVar[Optional[str]] = None
    # the family's key naming its robot (e.g. "robot"); None: the task decides the robot
    robot_key: ClassVar[Optional[str]] = None
    # keys renamed since the last release (old -> new): a value under the old name still works,
    # with a warning naming the new one (the family keeps the old field, default None, until then)
    renamed_keys: ClassVar[Dict[str, str]] = {}
    # a family whose simulators need a Python environment of their own (a dependency our venv
    # cannot hold) names it: its requirements are envs/<family>/requirements-<name>.txt, set-up
    # builds .venv-<name> (bash scripts/setup.sh --python-env <name>), and its builder runs each
    # simulator in a child process under it (embodied_async.isolated.child.ChildSubEnv)
    python_env: ClassVar[Optional[str]] = None
    # families whose episodes can go on past a success say so (env.end_on_success=false)
    can_run_past_success: ClassVar[bool] = False
    # what a command or mode asks of the family besides (scripted_expert, supports_privileged_states,
    # control_keys): config/family_hooks.py

    def check(self) -> None:
        """The family's own start-up checks (raise ``ConfigError`` naming ``env.<key>`` and the fix).
        Called after the framework's checks, once per task of ``tasks``; may import the simulator."""

    def task_name(self) -> str:
        """The task, as its family names it (the tasks joined by "+" under ``tasks``)."""
        if self.tasks:
            return "+".join(self.tasks)
        return str(getattr(self, self.task_key)) if self.task_key else self.name

    def robot_name(self) -> Optional[str]:
        """The robot, as its family names it; None where the task decides it."""
        return getattr(self, self.robot_key) if self.robot_key else None

    def observes_states(self) -> bool:
        """Whether its observations are the task's state vector (what ``privileged_states`` gives
        beside camera images), rather than images."""
        return False

    def simulates_on_gpu(self) -> bool:
        """Whether it needs a GPU to simulate (an evaluation without one refuses it)."""
        return False

    def sub_env_tasks(self, num_envs: int) -> Tuple[str, ...]:
        """The task of each of ``num_envs`` sub-envs under ``tasks`` (empty without it)."""
        return tuple(self.tasks[i % len(self.tasks)] for i in range(num_envs)) if self.tasks else ()

    def task_configs(self, num_envs: int) -> List["EnvConfig"]:
        """One config per sub-env, naming its task in the family's task key (this config itself
        ``num_envs`` times without ``tasks``)."""
        if not self.tasks:
            return [self] * num_envs
        single = {task: dataclasses.replace(self, tasks=[], **{self.task_key: task}) for task in self.tasks}
        return [single[task] for task in self.sub_env_tasks(num_envs)]

    def check_video(self) -> None:
        """Start-up check for ``runner.eval_video``: raise ``ConfigError`` when this config cannot
        render videos (``render_video``). Families that can override it."""
        from embodied_async.config.checks import ConfigError

        raise ConfigError(f"runner.eval_video=true, but the '{self.name}' env family cannot render videos; set "
                          "runner.eval_video=false")

    def memory_estimate(self, workload) -> Optional[Dict[str, float]]:
        """GPU bytes per item of one env process (``runner.dry_run``; ``workload``:
        ``embodied_async.plan.Workload``); None where the family does not use a GPU or cannot say."""
        return None

    def memory_notes(self) -> List[str]:
        """Assumptions behind ``memory_estimate`` worth printing with it."""
        return []


@dataclass
class ModelConfig:
    """What every policy family's config has; a family subclasses it next to its code
    (``models/<package>/configuration_<package>.py``, a VLA's ``configuration_policy.py`` beside its
    checkpoint's own ``configuration_<family>.py``) with its own keys, and registers the subclass.

    ``builder`` names the callable that builds the policy:
    ``builder(model_cfg, env_spec) -> Policy`` (``embodied_async.contracts.Policy``).
    """

    name: str = MISSING  # the family: a registered name (registry.families("model"))
    # "float32" | "bfloat16": the actor's compute precision (FSDP mixed precision); trainable ones stay float32
    precision: str = "float32"
    # a checkpoint folder of one of our runs (e.g. an SFT run's global_step_<N>) whose weights
    # and observation statistics the policy starts from; counters, optimiser state and the run's
    # progress are not taken (that is runner.resume_dir)
    init_from: Optional[str] = None
    # whether the policy has a value head (a critic); null: as the algorithm needs one (gae: yes,
    # grpo: no). A policy without one reports zero values and trains no value loss
    add_value_head: Optional[bool] = None

    builder: ClassVar[str] = ""  # "module:callable"
    # the levels of log-prob the family's policy reports (algorithm.logprob_type); a family with
    # "token_level" has a ``logprob_type`` attribute that build_policy sets
    logprob_types: ClassVar[Tuple[str, ...]] = ("chunk_level",)
    # the module holding the family's dry-run arithmetic (see memory_estimate)
    memory_model: ClassVar[Optional[str]] = None
    # what a command asks of the family besides (default_recipe, recognizes, cpu_recipe,
    # renamed_recipe_parts, exporter): config/family_hooks.py

    def check(self) -> None:
        """The family's own start-up checks (raise ``ConfigError`` naming ``model.<key>`` and the fix)."""

    def builds_value_head(self) -> bool:
        """Whether the policy builder makes a value head (validation resolves ``add_value_head``
        from ``algorithm.adv_type``; a config made by hand without it gets one)."""
        return self.add_value_head is not False

    def fetch(self) -> None:
        """Download what the family needs (a hub checkpoint, its tokenizer) once, in the launcher,
        before any worker starts, into the hub's cache, where the workers find it; the config keeps
        naming the repo (checkpoints and the saved config say where the weights came from). Raise
        ``FileNotFoundError`` naming the repo and the download command when that is not possible."""

    def checkpoint_folder(self) -> Optional[str]:
        """The local folder of the checkpoint the policy is built on (a hub id's copy in the cache),
        for an export to take the base's files from; None for a family that has none."""
        return None

    def memory_estimate(self, workload) -> Optional[Dict[str, Dict[str, float]]]:
        """GPU bytes per item for ``runner.dry_run``: ``{"rollout": {...}, "actor": {...},
        "evaluation": {...}}`` for one process of each (``workload``: ``embodied_async.plan.Workload``);
        None when the family cannot say. Families name a module with ``estimate(cfg, workload)``
        and ``notes(cfg)`` in ``memory_model``."""
        return self._memory_model().estimate(self, workload) if self.memory_model else None

    def memory_notes(self) -> List[str]:
        """Assumptions behind ``memory_estimate`` worth printing with it."""
        return self._memory_model().notes(self) if self.memory_model else []

    def _memory_model(self):
        import importlib

        return importlib.import_module(self.memory_model)


@dataclass
class AlgorithmConfig:
    gamma: float = 0.8
    gae_lambda: float = 0.9
    # the actor drops trajectories more than this many versions older than itself (0: synchronous)
    staleness_threshold: int = 1
    # "fixed": staleness_threshold throughout; "kl": it starts there and follows the behaviour KL in
    # [staleness_min, staleness_max] (version_gate.StalenessController), logged as train/staleness_threshold
    staleness_control: str = "fixed"
    staleness_min: int = 0
    staleness_max: int = 4
    staleness_kl_low: float = 0.01  # the bound rises after staleness_kl_patience updates in a row under it
    staleness_kl_high: float = 0.03  # and falls after as many over it
    staleness_kl_patience: int = 2
    # the rollout store: an update trains on this many version-valid trajectories a stream (one
    # pipeline stage of one env worker): this many x env.num_envs x rollout.num_steps decisions each
    rollout_store_size_per_rank: int = 1
    # "every_stream": that many from each stream; "first_arrived": the first to arrive from any
    # (a slow env worker no longer holds the updates up; rollout_store.RolloutStore)
    batch_from: str = "every_stream"
    # at least this fraction of the trajectories of an update were produced by the actor's current
    # version (lag 0); otherwise the actor waits for fresh ones. 0 = any version-valid mix.
    on_policy_min_ratio: float = 0.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual clip for negative advantages
    # what the PPO ratio is taken of (RLinf's key): "chunk_level", one log-prob per decision (summed
    # over the chunk's executed actions and their dimensions), or "token_level", one per executed
    # action dimension (OpenVLA's action tokens, Pi0's action entries), each with its own ratio and
    # clip, the loss averaged over them. A chunk's ratio is the product of its K dimensions' ratios,
    # so it leaves the clip range after small moves of each; token_level needs a family that reports
    # per-dimension log-probs (ModelConfig.logprob_types)
    logprob_type: str = "chunk_level"
    behave_weight_threshold: Optional[float] = 2.0  # samples whose proximal/behaviour weight exceeds it are masked
    value_clip: Optional[float] = None  # None: no clipping around the rollout-time value
    huber_delta: float = 10.0
    value_loss_coef: float = 0.5
    entropy_coef: float = 0.0
    normalize_advantages: bool = True  # over the batch (gae); grpo refuses it: its groups normalise
    update_epochs: int = 8
    target_kl: Optional[float] = 0.1  # stop the epoch loop once the trust-region KL exceeds it
    reward_scale: float = 1.0
    # "gae" (a critic's values, GAE over gamma / gae_lambda) or "grpo" (value-free: each trajectory
    # starts every group of group_size sub-envs from one seed; an episode's advantage is its return
    # minus its group's mean (over the group's std with group_normalize_std); groups of equal returns
    # leave the loss). grpo needs every episode to end within a trajectory and builds no critic
    adv_type: str = "gae"
    group_size: int = 1  # grpo: sub-envs per initial state (>= 2); each policy batch holds whole groups
    group_normalize_std: bool = True
    group_episode_weight: str = "step"  # grpo: "step" (episodes weigh by their length) or "episode" (alike)
    demo_loss_coef: float = 0.0  # > 0: this x the family's SFT loss on `dataset`'s demonstrations per policy step
    demo_batch_size: int = 32  # demonstration frames per optimiser step, over all actor ranks
    anchor_kl_coef: float = 0.0  # > 0: this x KL(current || the run's warm start) per decision; 0: off


@dataclass
class RolloutConfig:
    num_steps: int = 50  # decisions per trajectory (T)
    # True: log pi_proximal from a forward pass before the update; False: interpolate by version
    recompute_logprobs: bool = True
    # with recompute_logprobs: False recomputes only older versions' samples; the current version's keep
    # their behaviour log-prob as the proximal one (exact where rollout and actor compute alike, e.g.
    # both float32 on a CPU; another precision on the rollout makes them differ: True by default)
    recompute_fresh_logprobs: bool = True


@dataclass
class ActorConfig:
    # samples per optimiser step over all ranks; the rollout batch splits into minibatches of it
    global_batch_size: int = 100
    # per rank, per forward/backward (gradient accumulation); capped at the rank's share of a minibatch
    micro_batch_size: int = 100
    lr: float = 3e-4
    value_lr: Optional[float] = None  # None: same as lr
    # the first N optimiser steps train only the value head (every other parameter kept bit for bit):
    # a fresh value head's noisy advantages never reach the policy
    critic_warmup_steps: int = 0
    # then the policy's learning rate rises linearly from ~0 to actor.lr over this many steps: Adam's
    # first steps move every weight by ~lr whatever its gradient, knocking an SFT policy off its skill
    policy_lr_warmup_steps: int = 0
    # "cosine": the policy's learning rate falls along a cosine, update by update, from actor.lr at
    # the first update to policy_min_lr_ratio x actor.lr at runner.max_steps, so the steps that
    # follow noise shrink once the early gains are made; "constant": actor.lr throughout
    policy_lr_schedule: str = "constant"
    policy_min_lr_ratio: float = 0.1
    optimizer: str = "adam"  # "adam" (weight decay as L2 in the gradient) | "adamw" (decoupled)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 0.5
    # parameters whose names start with one of these take no PPO step (gradients dropped), e.g. Pi0's
    # VLM while its action expert trains (RLinf's train_expert_only): ["model.paligemma_with_expert.paligemma."];
    # still published and checkpointed. Adam would drift a perception stack fed mostly noise
    frozen_parameter_prefixes: List[str] = field(default_factory=list)


@dataclass
class DatasetConfig:
    """The demonstrations a supervised (``runner.mode: sft``) run trains on: a LeRobot dataset."""

    # a dataset folder, or a Hugging Face dataset repo id ("owner/name")
    root: Optional[str] = None
    # policy input -> dataset key (inputs: main_images, wrist_images, states, actions); an input
    # not named here takes LeRobot's conventional key when the env gives that input and the
    # dataset has it (observation.images.main, observation.images.wrist, observation.state,
    # action); null leaves an input out
    keys: Dict[str, Optional[str]] = field(default_factory=dict)
    # the rate the dataset's frames were recorded at, where its header says another (null: the
    # header's fps). LIBERO's hub datasets say 10 fps for demonstrations recorded at LIBERO's 20 Hz
    # control rate, one frame per step; checked against the env's control rate
    recorded_hz: Optional[float] = None
    # whole episodes held out for the validation loss (a seeded draw)
    validation_fraction: float = 0.1
    # batches mix the frames of this many episodes at a time (each decoded about once per pass)
    window_episodes: int = 32
    # decoded episodes kept in memory per trainer rank (and per decoding worker)
    cache_episodes: int = 64
    # processes per trainer rank that decode and assemble batches ahead of the step (0: the
    # trainer does it between steps); worth it when video decoding is what a step waits for
    num_workers: int = 0


@dataclass
class SupervisedConfig:
    """The supervised step: one optimiser step per ``actor.global_batch_size`` frames."""

    # learning rate: linear warm-up over this many steps from 0 to actor.lr, then the schedule
    lr_warmup_steps: int = 0
    lr_schedule: str = "cosine"  # "cosine" (down to min_lr_ratio x actor.lr at runner.max_steps) | "constant"
    min_lr_ratio: float = 0.1
    # the held-out loss every runner.val_check_interval steps, over at most this many batches
    validation_batches: int = 8


@dataclass
class LoggerConfig:
    """Where a run's metrics go: ``<log_path>/metrics.jsonl`` and each tracker of ``backends``
    (``trackers.py``). Recipes state no ``log_path``: composing one names ``logs/<recipe>``."""

    # the trackers a run may name; each is also the Python package it needs
    known_backends: ClassVar[Tuple[str, ...]] = ("tensorboard", "wandb", "swanlab")

    log_path: str = "logs/default"
    # trackers beside metrics.jsonl, each given the same scalars, the evaluation videos and this
    # config: any of known_backends ([]: metrics.jsonl only). wandb and swanlab without credentials
    # write offline under log_path (wandb/, swanlog/), to be uploaded later with their sync command.
    backends: List[str] = field(default_factory=lambda: ["tensorboard"])
    # the wandb / swanlab project the run goes to (letters, digits and _ - + . : a name both accept);
    # the run's name there is the last folder of log_path
    project: str = "embodied_async"
    # the former switch (true is backends [tensorboard], false is []): kept only so that a config
    # still naming it composes and is refused at start-up, naming backends
    tensorboard: Optional[bool] = None


@dataclass
class RunnerConfig:
    mode: str = "ppo"  # one of RUNNER_MODES (below)
    max_steps: int = 200  # training steps (PPO updates, or SFT optimiser steps)
    max_env_steps: Optional[int] = None  # stop earlier once this many env steps were consumed
    # stop earlier once an evaluation's success rate reaches this (needs val_check_interval > 0)
    stop_at_eval_success: Optional[float] = None
    val_check_interval: int = 10  # evaluate every N steps (0 disables)
    # False: an evaluation runs beside training (in the rollout process, on its own envs). True:
    # the graph stands still while it runs (the rollout acts for no env, the actor starts no
    # update), it scores the version just trained, and `train_time_s` in the metrics leaves it out,
    # as a synchronous loop's clock does (benchmarks/throughput.py times runs this way)
    eval_pauses_training: bool = False
    eval_episodes: int = 32
    eval_num_envs: int = 8
    # with stop_at_eval_success: an evaluation ends once its failures already rule the target out
    # (more than (1 - target) x eval_episodes); it then reports the success rate of the rounds
    # every sub-env completed (eval/episodes says how many). Runs to a target spend most of their
    # evaluations far below it; the passage itself is still judged on all eval_episodes
    eval_stop_once_below_target: bool = False
    # write evaluation episodes as mp4 (+ a JSON of instruction, success and step rewards) under
    # <log_path>/videos/step_<N>/ and to TensorBoard: the first episode of this many eval sub-envs
    eval_video: bool = False
    eval_video_episodes: int = 4
    eval_video_fps: int = 10
    save_interval: int = 50  # checkpoint every N steps (0: only on exit)
    # how many checkpoints stay on disk (the oldest go first); None keeps them all
    keep_checkpoints: Optional[int] = None
    # seconds between a scheduler's SIGTERM and its SIGKILL (SLURM's KillWait is 30 s by default,
    # Kubernetes' terminationGracePeriodSeconds 30 s): the update in flight may take half of it to
    # finish, the checkpoint the rest
    preemption_grace_s: float = 25.0
    # healing: a worker process that dies (SIGKILL, the OOM killer, a segfault, a family's simulator
    # process) or hangs is replaced in place (an env or rollout worker) or restarts the run from its
    # last complete checkpoint in the same log folder (the actor), at most this many faults in any
    # hour; past that, or at 0, the run stops as it did before, naming every fault. An error a
    # worker raises (a bug, bad data) is never healed
    restarts_per_hour: int = 3
    # a worker that does not answer its heartbeat for this long is hung (stopped, wedged), and so is
    # an env or rollout worker busy in one section (a simulator step, an inference) this long: the
    # run treats it as dead (0: never)
    hang_timeout_s: float = 60.0
    # the actor's update may rightly take minutes: one under way for more than this many times the
    # longest update of the run so far (and at least runner.hang_timeout_s) is hung; the first
    # update has no bound (0: an update is never hung, only a silent actor)
    update_hang_factor: float = 10.0
    # a restart on several nodes (cluster.num_nodes > 1) after a node was lost waits this long for
    # the cluster to have its nodes again (a scheduler's replacement), then stops naming them
    node_wait_s: float = 600.0
    # False: checkpoints hold the trainable parameters (all of them for MLP/CNN, adapters and
    # value head under LoRA) and name the base checkpoint; True: also every frozen weight
    checkpoint_frozen_weights: bool = False
    # compose and validate the recipe, print the plan (placement, batches, memory), start nothing
    dry_run: bool = False
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
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    sft: SupervisedConfig = field(default_factory=SupervisedConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)


# runner.mode -> what the runner does: "ppo" (the async graph), "sft" (supervised steps), "collect" (a
# source's episodes into a dataset), "eval" (a policy scored); the last two read none of training
RUNNER_MODES = ("ppo", "sft", "collect", "eval")
# what only one runner.mode reads: whole sections, or "section.key". Set to anything but its
# default in another mode, a key would do nothing there, so validation refuses it
MODE_ONLY = {
    "ppo": ("algorithm", "rollout", "runner.max_env_steps", "runner.stop_at_eval_success",
            "runner.eval_pauses_training", "runner.eval_stop_once_below_target", "actor.value_lr",
            "actor.critic_warmup_steps", "actor.policy_lr_warmup_steps", "actor.policy_lr_schedule",
            "actor.policy_min_lr_ratio", "actor.frozen_parameter_prefixes"),
    "sft": ("sft", "dataset.validation_fraction"),
    "collect": ("collect",),
    "eval": ("evaluation",),
}


def _section_type(section: str) -> type:
    """The dataclass of a section of ``TrainConfig`` (each field's default factory is its class)."""
    return next(f.default_factory for f in dataclasses.fields(TrainConfig) if f.name == section)


def mode_only_keys(mode: str) -> List[str]:
    """Every ``section.key`` that only ``mode`` reads (``MODE_ONLY`` with its sections expanded)."""
    keys = []
    for entry in MODE_ONLY[mode]:
        keys += [entry] if "." in entry else [f"{entry}.{f.name}" for f in dataclasses.fields(_section_type(entry))]
    return keys


def schema_default(key: str):
    """The schema's default of ``section.key`` (a section of ``TrainConfig`` with no required field)."""
    section, name = key.split(".")
    return getattr(_section_type(section)(), name)
