"""``runner.mode`` at start-up: a known mode, no key that only another mode reads, and each mode's own
section (``sft`` with its ``dataset``; ``collect`` and ``eval``, which train nothing: ``mode_sections.py``)."""

from __future__ import annotations

from embodied_async.config.checks import bound, choice, positive, require
from embodied_async.config.mode_sections import OFFLINE_MODES, check_offline_mode
from embodied_async.config.schema import RUNNER_MODES, TrainConfig, mode_only_keys, schema_default


def check_mode(cfg: TrainConfig) -> None:
    """``runner.mode``: one of ``RUNNER_MODES``, no key only another mode reads, the mode's own keys."""
    choice(cfg.runner.mode, "runner.mode", RUNNER_MODES)
    if cfg.runner.mode in OFFLINE_MODES:  # on any recipe's config: its training keys are left unread
        return check_offline_mode(cfg)
    _refuse_other_modes_keys(cfg)
    if cfg.runner.mode == "sft":
        _check_supervised(cfg)


def _check_supervised(cfg: TrainConfig) -> None:
    require(cfg.dataset.root is not None, "runner.mode=sft needs dataset.root: a LeRobot dataset folder (e.g. one "
                                          "python -m embodied_async collect wrote) or a Hugging Face dataset repo id")
    bound(cfg.dataset.validation_fraction, "dataset.validation_fraction", lambda v: 0.0 <= v < 1.0,
          "must be in [0, 1)", "it is the share of episodes held out: use e.g. 0.1, or 0 for none")
    bound(cfg.dataset.recorded_hz, "dataset.recorded_hz", lambda v: v > 0, "must be > 0",
          "the rate the frames were recorded at, e.g. 20", null="to take the dataset's fps")
    for key in ("dataset.window_episodes", "dataset.cache_episodes", "sft.validation_batches"):
        section, name = key.split(".")
        positive(getattr(getattr(cfg, section), name), key)
    bound(cfg.dataset.num_workers, "dataset.num_workers", lambda v: v >= 0, "must be >= 0",
          "use 0 to decode in the trainer, or N processes per trainer rank")
    choice(cfg.sft.lr_schedule, "sft.lr_schedule", ("cosine", "constant"))
    bound(cfg.sft.lr_warmup_steps, "sft.lr_warmup_steps", lambda v: v >= 0, "must be >= 0", "use 0 for none")
    bound(cfg.sft.min_lr_ratio, "sft.min_lr_ratio", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]",
          "the cosine schedule ends at this fraction of actor.lr: use e.g. 0.1")


def _refuse_other_modes_keys(cfg: TrainConfig) -> None:
    """A key that only another ``runner.mode`` reads (``MODE_ONLY_KEYS``) keeps its schema default:
    set, this mode would ignore it."""
    for owner in RUNNER_MODES:
        if owner == cfg.runner.mode:
            continue
        for key in mode_only_keys(owner):
            section, name = key.split(".")
            value, default = getattr(getattr(cfg, section), name), schema_default(key)
            require(value == default,
                    f"{key}={value} with runner.mode={cfg.runner.mode}: only runner.mode={owner} reads it, and this "
                    f"run would ignore it; remove it (its default is {default!r})")
