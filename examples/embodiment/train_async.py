"""Hydra entry point: ``python examples/embodiment/train_async.py --config-name <recipe> [key=value ...]``.

The composed config is validated against the typed schema (and each family's own config) and
its topology resolved before any worker starts. The command itself only launches: the run's
driver is a child in a process group of its own, to which it forwards a scheduler's signals
(``embodied_async.signals``: SIGTERM saves and stops, SIGUSR1 saves and goes on).
"""

from __future__ import annotations

import os
import signal
import sys

from embodied_async.signals import is_driver, run_driver_in_own_group

if __name__ == "__main__":  # before the imports below: the launcher stays light
    if not is_driver():
        sys.exit(run_driver_in_own_group(sys.orig_argv[1:]))  # this interpreter's options too
    # the driver: a scheduler's early SIGUSR1 must not end it (its default action) before the
    # handlers of the run are in place (SIGTERM's default, meanwhile, ends it as terminated)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from embodied_async.config import ConfigError, resolve  # noqa: E402
from embodied_async.config.hydra_schema import register_schema  # noqa: E402
from embodied_async.signals import exit_code, install_driver_handlers, preempted, stop_signal  # noqa: E402

register_schema()


DEFAULT_RECIPE = "maniskill_async_ppo_mlp"


@hydra.main(config_path="../../configs", config_name=DEFAULT_RECIPE, version_base=None)
def main(cfg: DictConfig) -> None:
    install_driver_handlers()
    try:
        train_cfg, topology = resolve(cfg)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    if train_cfg.runner.dry_run:
        from embodied_async.plan import describe

        print(describe(train_cfg, topology), flush=True)
        return
    try:  # once, here, with the hub's progress bar: the workers then only read the local copies
        train_cfg.model.fetch()
    except FileNotFoundError as err:
        print(f"checkpoint error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    from embodied_async.checkpoint_io import CheckpointError
    from embodied_async.datasets.lerobot_format import DatasetError
    from embodied_async.private_files import FolderRefused
    from embodied_async.run_folder import StorageError
    from embodied_async.runner import run
    from embodied_async.scheduler.worker_group import WorkerFailed

    try:
        result = run(train_cfg, topology)
    except KeyboardInterrupt as stop:  # Ctrl-C, or a scheduler's SIGTERM
        by = signal.Signals(stop_signal()).name if preempted() else "Ctrl-C"
        print(f"[train_async] stopped by {by}{where_it_stands(getattr(stop, 'checkpoint', None))}", file=sys.stderr,
              flush=True)
        sys.exit(exit_code())
    except CheckpointError as err:
        print(f"checkpoint error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except DatasetError as err:  # raised in a trainer process, Ray wraps it: its own line, not Ray's traceback
        print(f"dataset error: {getattr(err, 'cause', None) or err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except FolderRefused as err:
        print(f"config error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except StorageError as err:
        print(f"storage error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except WorkerFailed as err:
        print(f"[train_async] a worker failed, stopping the run: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"[train_async] done: {result}", flush=True)


def where_it_stands(checkpoint) -> str:
    """The checkpoint a stopped run can resume from, and the command that does."""
    import shlex

    from hydra.core.hydra_config import HydraConfig

    if not checkpoint:
        return ": no checkpoint was written (the run had not finished an update)"
    job = HydraConfig.get()
    overrides = [o for o in job.overrides.task if not o.startswith("runner.resume_dir=")]
    command = ["bash", "scripts/run_async.sh", job.job.config_name, *overrides, f"runner.resume_dir={checkpoint}"]
    return f"; its state is in {os.path.abspath(checkpoint)}; resume with:  {shlex.join(command)}"


def refuse_renamed_recipe(argv) -> None:
    """A recipe that was renamed is refused naming its new name (Hydra would only say it is missing)."""
    from embodied_async.config.recipes import check_recipe_name, renamed_recipe

    for name in filter(renamed_recipe, recipes_named(argv)):
        try:
            check_recipe_name(name)
        except ConfigError as err:
            print(f"config error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)


def name_log_folder(argv) -> None:
    """The recipe's log folder, ``logs/<recipe>``, added to ``argv`` where it names none (recipes
    state none of their own), so Hydra writes ``.hydra/`` there and the run logs there."""
    from embodied_async.config.recipes import with_log_path

    names = recipes_named(argv)
    overrides = [arg for arg in argv if "=" in arg and not arg.startswith("-")]
    argv.extend(item for item in with_log_path(names[-1] if names else DEFAULT_RECIPE, overrides)
                if item not in overrides)


def recipes_named(argv) -> list:
    """The recipes ``--config-name`` names in ``argv``."""
    names = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("--config-name", "-cn")]
    return names + [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config-name=")]


if __name__ == "__main__":
    refuse_renamed_recipe(sys.argv[1:])
    name_log_folder(sys.argv)
    try:
        main()
    except KeyboardInterrupt:  # a stop before the run began (composing, fetching the checkpoint)
        print("[train_async] stopped before the run began; nothing was written", file=sys.stderr, flush=True)
        sys.exit(exit_code())
