"""The sections of the modes that train nothing, and their start-up checks: ``collect`` (what
``runner.mode: collect`` records, ``embodied_async.collection``) and ``evaluation`` (what
``runner.mode: eval`` scores). Both run on any recipe's config or a run's saved one (the commands
compose it): they read ``env``, ``model``, ``cluster`` (their workers' placement), ``runner.seed`` /
``runner.logger`` and their section, nothing of training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from embodied_async.config.checks import bound, choice, positive, require

VIDEO_CODECS = ("av1", "h264")
OFFLINE_MODES = ("collect", "eval")  # the runner.mode values that train nothing


@dataclass
class CollectConfig:
    # "scripted": the env family's scripted expert; "teacher:<folder>": a checkpoint of one of our
    # runs (logs/<run>/checkpoints/global_step_<N>), acting deterministically
    source: str = "scripted"
    episodes: int = 1  # episodes to add to the dataset
    out: Optional[str] = None  # the dataset folder (created, or appended to)
    codec: str = "av1"  # the camera videos' codec
    keep_failures: bool = False  # also keep episodes that end without success
    seed: int = 0  # episode k runs with seed + k (after the highest seed already stored when appending)
    max_attempts: Optional[int] = None  # give up after this many episodes (null: 10 x episodes + 10)

    def attempt_limit(self) -> int:
        return self.max_attempts or 10 * self.episodes + 10


@dataclass
class EvaluationConfig:
    checkpoint: Optional[str] = None  # a run's checkpoint whose weights are scored (null: the model as built)
    episodes: int = 20  # over every evaluator, the same count on every sub-env (env.num_envs each)
    seed: int = 0  # the evaluators' env seed (sub-env i of evaluator r starts from seed + r x env.num_envs + i)
    sampled: bool = False  # act with the sampled policy (the one RL trains) instead of the decision rule
    videos: int = 0  # record the first episode of this many sub-envs (of the first evaluator)


def check_offline_mode(cfg) -> None:
    """``runner.mode: collect`` or ``eval``: its section's checks (ConfigError naming the key and the fix)."""
    if cfg.runner.mode == "collect":
        return check_collect(cfg)
    require(not cfg.runner.resume_dir, "runner.mode=eval trains nothing to resume: remove runner.resume_dir")
    episodes, num_envs = cfg.evaluation.episodes, cfg.env.num_envs
    positive(episodes, "evaluation.episodes")
    require(episodes % num_envs == 0, f"evaluation.episodes={episodes} must be a multiple of the sub-envs "
                                      f"(env.num_envs={num_envs} over the evaluators), so every sub-env runs as many")
    bound(cfg.evaluation.videos, "evaluation.videos", lambda v: v >= 0, "must be >= 0", "use 0 for no videos")


def check_collect(cfg) -> None:
    """``runner.mode: collect``'s own checks (ConfigError naming the key and the fix)."""
    collect = cfg.collect
    require(collect.out is not None, "runner.mode=collect needs collect.out: the dataset folder to write (--out)")
    require(collect.source == "scripted" or collect.source.startswith("teacher:"),
            f"collect.source={collect.source!r}: use 'scripted' or 'teacher:<checkpoint folder>'")
    positive(collect.episodes, "collect.episodes")
    choice(collect.codec, "collect.codec", VIDEO_CODECS)
    bound(collect.max_attempts, "collect.max_attempts", lambda v: v >= 1, "must be a positive integer",
          "set it to 1 or more", null="for 10 x episodes + 10")
    require(not cfg.runner.resume_dir, "runner.mode=collect resumes by appending: remove runner.resume_dir and "
                                       "collect into the same collect.out")
