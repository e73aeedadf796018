"""``train``: a recipe's run; ``plan``: its placement, batches and memory, starting nothing.

``train RECIPE [key=value ...]`` composes the recipe through Hydra (so Hydra's own options work:
``--config-dir``, ``hydra.searchpath=[...]``, ``--cfg job``), validates it against the typed schema
and each family's config, and only then starts workers. The command itself only launches: the
run's driver is a child in a process group of its own, to which the launcher forwards a
scheduler's signals (``embodied_async.signals``: SIGTERM saves and stops, SIGUSR1 saves and goes
on). A run names its log folder ``logs/<time>-<recipe>`` unless ``runner.logger.log_path`` does.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Dict, List, Optional, Sequence

from embodied_async.config.recipes import LOG_PATH_KEY
from embodied_async.signals import is_driver, run_driver_in_own_group

LOG_PATH_OVERRIDE = f"{LOG_PATH_KEY}="
HELP = __doc__.split("\n\n")[0] + """

usage: python -m embodied_async train RECIPE [key=value ...] [Hydra's options]
       python -m embodied_async plan RECIPE [key=value ...]

RECIPE is a file of configs/ ('python -m embodied_async recipes' lists them); key=value overrides
any setting, env=<name> / model=<name> pick a group's file (configs/env/, configs/model/)."""


def train_command(argv: Sequence[str]) -> int:
    if not argv or any(arg in ("-h", "--help") for arg in argv):
        print(HELP, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if recipe_of(hydra_arguments(argv)) is None:
        print("train error: name the recipe first (python -m embodied_async recipes lists them), e.g. "
              "python -m embodied_async train <recipe> runner.max_steps=50", file=sys.stderr)
        return 2
    if not is_driver():  # the launcher: light, it imports nothing that runs the graph
        arguments = hydra_arguments(argv)
        refused = refuse_unknown_recipe(arguments)
        if refused:
            return refused
        named = [arg for arg in arguments if arg.startswith(LOG_PATH_OVERRIDE)]
        extra = [] if named else [f"{LOG_PATH_OVERRIDE}logs/{time.strftime('%Y%m%d-%H%M%S')}-{recipe_of(arguments)}"]
        print(f"[train] recipe: {recipe_of(arguments)}; logs: {(named or extra)[-1][len(LOG_PATH_OVERRIDE):]}",
              flush=True)
        return run_driver_in_own_group([*sys.orig_argv[1:], *extra])  # this interpreter's options too
    # the driver: a scheduler's early SIGUSR1 must not end it (its default action) before the
    # handlers of the run are in place (SIGTERM's default, meanwhile, ends it as terminated)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    from embodied_async.signals import exit_code

    try:
        return drive(hydra_arguments(argv))
    except KeyboardInterrupt:  # a stop before the run began (composing, fetching the checkpoint)
        print("[train] stopped before the run began; nothing was written", file=sys.stderr, flush=True)
        return exit_code()


def train_here(argv: Sequence[str]):
    """The driver's work on ``train``'s arguments in this process (a pipeline's phase): Hydra
    composes and writes the run's ``.hydra/`` as for a launched run; no launcher, no dated folder.
    Its ``cli.Outcome``: the run's summary with its ``log`` folder and last ``checkpoint``."""
    from hydra.core.global_hydra import GlobalHydra

    from embodied_async.cli import Outcome

    GlobalHydra.instance().clear()  # a run before this one in the process initialised it
    outcome = {}
    try:
        code = drive(hydra_arguments(argv), outcome)
    except SystemExit as err:  # Hydra's own refusal of its command line
        code = err.code if isinstance(err.code, int) else 2
    return Outcome(code, outcome.get("result") if code == 0 else None)


def plan_command(argv: Sequence[str]) -> int:
    """The recipe composed and validated as a run would be, its plan printed; nothing starts."""
    from embodied_async.cli.errors import report
    from embodied_async.config.recipes import compose_recipe
    from embodied_async.config.validate import resolve
    from embodied_async.plan import describe

    if not argv or any(arg in ("-h", "--help") for arg in argv):
        print(HELP, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    arguments = hydra_arguments(argv)
    overrides = [arg for arg in arguments if "=" in arg and not arg.startswith("-")]
    if recipe_of(arguments) is None:
        print("plan error: name the recipe first (python -m embodied_async recipes lists them)", file=sys.stderr)
        return 2
    try:
        cfg, topology = resolve(compose_recipe(recipe_of(arguments), [*overrides, "runner.dry_run=true"]))
    except Exception as err:  # noqa: BLE001 (the table decides: bad input is one line, a bug keeps its traceback)
        return report(err, "plan")
    print(describe(cfg, topology), flush=True)
    return 0


def refuse_unknown_recipe(arguments: Sequence[str]) -> int:
    """A recipe configs/ does not hold, refused before anything starts naming the recipes there (or
    a renamed one's new name); 0 when it is there, or when the command line adds config folders of
    its own (``--config-dir``, ``hydra.searchpath``), where Hydra looks for it."""
    from embodied_async.cli.errors import report
    from embodied_async.config.recipes import check_recipe_name

    own_folders = any(arg in ("--config-dir", "-cd") or arg.startswith(("--config-dir=", "hydra.searchpath="))
                      for arg in arguments)
    if own_folders:
        return 0
    try:
        check_recipe_name(recipe_of(arguments))
    except Exception as err:  # noqa: BLE001 (a ConfigError: the table's line)
        return report(err, "train")
    return 0


def hydra_arguments(argv: Sequence[str]) -> List[str]:
    """Hydra's command line from the command's: a first argument that is neither an option nor an
    override is the recipe (``--config-name``)."""
    argv = list(argv)
    if argv and not argv[0].startswith("-") and "=" not in argv[0]:
        return ["--config-name", argv[0], *argv[1:]]
    return argv


def recipe_of(arguments: Sequence[str]) -> Optional[str]:
    """The recipe ``--config-name`` names in Hydra's command line (None: none)."""
    names = [arguments[i + 1] for i, arg in enumerate(arguments[:-1]) if arg in ("--config-name", "-cn")]
    names += [arg.split("=", 1)[1] for arg in arguments if arg.startswith("--config-name=")]
    return names[-1] if names else None


def drive(arguments: List[str], outcome: Optional[Dict] = None) -> int:
    """Compose through Hydra's ``main`` with ``arguments`` as its command line and run the result;
    ``outcome["result"]``: what the run made, where a finished run is asked for it."""
    import hydra

    from embodied_async.cli.errors import report
    from embodied_async.config.hydra_schema import register_schema
    from embodied_async.config.recipes import CONFIG_DIR, check_recipe_name, renamed_recipe

    recipe = recipe_of(arguments)
    if renamed_recipe(recipe):  # Hydra would only say it is missing
        try:
            check_recipe_name(recipe)
        except Exception as err:  # noqa: BLE001 (a ConfigError: the table's line)
            return report(err, "train")
    register_schema()
    outcome = {} if outcome is None else outcome
    outcome["code"] = 0

    @hydra.main(config_path=CONFIG_DIR, config_name=recipe, version_base=None)
    def hydra_main(cfg) -> None:
        outcome["code"] = run_composed(cfg, outcome)

    command_line, sys.argv = sys.argv, [sys.argv[0], *arguments]
    try:
        hydra_main()
    finally:
        sys.argv = command_line
    return outcome["code"]


def run_composed(cfg, outcome: Dict) -> int:
    """The driver's work on Hydra's composed config: validate, plan or fetch and run; a finished
    run's summary, folder and last checkpoint in ``outcome["result"]``."""
    from embodied_async.cli.errors import report
    from embodied_async.config import resolve
    from embodied_async.signals import install_driver_handlers

    install_driver_handlers()
    try:
        train_cfg, topology = resolve(cfg)
        if train_cfg.runner.dry_run:
            from embodied_async.plan import describe

            print(describe(train_cfg, topology), flush=True)
            return 0
        try:  # once, here, with the hub's progress bar: the workers then only read the local copies
            train_cfg.model.fetch()
        except FileNotFoundError as err:
            from embodied_async.checkpoint_io import CheckpointError

            raise CheckpointError(str(err)) from None
        from embodied_async.runner import run

        result = run(train_cfg, topology)
    except KeyboardInterrupt as stop:  # Ctrl-C, or a scheduler's SIGTERM
        return stopped(getattr(stop, "checkpoint", None))
    except Exception as err:  # noqa: BLE001 (the table decides: bad input is one line, a bug keeps its traceback)
        return report(err, "train")
    print(f"[train] done: {result}", flush=True)
    from embodied_async.run_folder import checkpoints_root, latest_checkpoint

    log = train_cfg.runner.logger.log_path
    outcome["result"] = {**result, "log": log, "checkpoint": latest_checkpoint(checkpoints_root(log))}
    return 0


def stopped(checkpoint) -> int:
    """The line a stopped run prints: what stopped it, its checkpoint and the command that resumes."""
    from embodied_async.signals import exit_code, preempted, stop_signal

    by = signal.Signals(stop_signal()).name if preempted() else "Ctrl-C"
    print(f"[train] stopped by {by}{where_it_stands(checkpoint)}", file=sys.stderr, flush=True)
    return exit_code()


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
