"""The ``collect`` section: what ``runner.mode: collect`` records (``embodied_async.collection``),
and its start-up checks. A collection runs on any recipe's config (``python -m embodied_async
collect`` composes an env yaml into the default recipe): it reads ``env``, ``cluster`` (its env
workers' placement), ``runner.seed`` / ``runner.logger`` and this section, nothing of training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from embodied_async.config.checks import bound, choice, positive, require

VIDEO_CODECS = ("av1", "h264")


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
