"""Hydra entry point: ``python examples/embodiment/train_async.py --config-name <recipe> [key=value ...]``.

The composed config is validated against the typed schema (and each family's own config) and
its topology resolved before any worker starts.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from embodied_async.config import ConfigError, resolve
from embodied_async.config.hydra_schema import register_schema

register_schema()


@hydra.main(config_path="../../configs", config_name="maniskill_async_ppo_mlp", version_base=None)
def main(cfg: DictConfig) -> None:
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
    from embodied_async.runner import run
    from embodied_async.scheduler.worker_group import WorkerFailed

    try:
        result = run(train_cfg, topology)
    except KeyboardInterrupt:
        print("[train_async] stopped by Ctrl-C", file=sys.stderr, flush=True)
        sys.exit(130)
    except CheckpointError as err:
        print(f"checkpoint error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except DatasetError as err:
        print(f"dataset error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except FolderRefused as err:
        print(f"config error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except WorkerFailed as err:
        print(f"[train_async] a worker failed, stopping the run: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"[train_async] done: {result}", flush=True)


def refuse_renamed_recipe(argv) -> None:
    """A recipe that was renamed is refused naming its new name (Hydra would only say it is missing)."""
    from embodied_async.config.recipes import check_recipe_name, renamed_recipe

    names = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("--config-name", "-cn")]
    names += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config-name=")]
    for name in filter(renamed_recipe, names):
        try:
            check_recipe_name(name)
        except ConfigError as err:
            print(f"config error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)


if __name__ == "__main__":
    refuse_renamed_recipe(sys.argv[1:])
    main()
